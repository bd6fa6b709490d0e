/*
 * sink_nats_message.h - a row as a NATS message: its subject (the prefix
 * plus its routing key, else its queue) and the message with its headers,
 * each checked against what NATS and JetStream accept.
 */
#ifndef OUTBOX_SINK_NATS_MESSAGE_H
#define OUTBOX_SINK_NATS_MESSAGE_H

#include <stdbool.h>
#include <stddef.h>

#include "sink_nats_conn.h"

/* What a text checked as a subject is: a whole subject, or a prefix the rest follows. */
enum nats_subject_part { NATS_SUBJECT_WHOLE, NATS_SUBJECT_PREFIX };

/*
 * Why text is no valid subject (a prefix may be empty or end with '.'), or
 * NULL when it is.
 */
const char *sink_nats_subject_problem(const char *text, enum nats_subject_part part);

/* Why subject lies in the server's reserved spaces ('$...', _INBOX.), or NULL. */
const char *sink_nats_subject_reserved(const char *subject);

/* What follows the prefix in message's subject: its routing key, else its queue. */
const char *sink_nats_subject_suffix(const struct sink_message *message);

/* Writes message's subject into n->subject (grown as needed); -1 when out of memory. */
int sink_nats_build_subject(struct sink_nats *n, const struct sink_message *message);

/*
 * Builds message i of the batch into n->messages[i], or leaves that NULL
 * and sets n->outcomes[i]: rejected (see sink_nats.c) or deferred (out of
 * memory).
 */
void sink_nats_build_message(sink *s, const struct sink_message *message, size_t i);

#endif
