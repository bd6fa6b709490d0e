/*
 * names.h - the names an operator types, checked before any connection.
 *
 * A bad name is a usage error (exit 2) named on one line, not a database
 * error after a round trip (exit 1). The rules are those of the schema
 * (sql/002_queue_name_check.sql, outbox.check_queue_name(), outbox.pause()).
 */
#ifndef OUTBOXCTL_NAMES_H
#define OUTBOXCTL_NAMES_H

#include <stdbool.h>
#include <stddef.h>

/* The longest queue name the schema accepts. */
#define NAMES_QUEUE_MAX 200

/* Room for the message of names_check(). */
#define NAMES_MESSAGE_MAX 160

/* True when queue is 1 to 200 characters of A-Z a-z 0-9 . _ : - */
bool names_queue_valid(const char *queue);

/*
 * True when queue is valid and key (NULL: none) is not empty; else false
 * with one lowercase line in message, the bad name shown with control
 * characters as spaces.
 */
bool names_check(const char *queue, const char *key, char *message, size_t size);

#endif
