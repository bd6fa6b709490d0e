/*
 * console_databases.h - the databases the console serves: the relay's list
 * (outboxctl --databases FILE serve), followed as the relay follows it, or
 * the one database of --database-url, named by its database name.
 *
 * The file's modification time, size and inode are looked at, at most once
 * a second, when a request asks for a database; a change is read whole. A
 * bad file keeps the list in use: its error is logged once and shown by the
 * Databases view until the file is good again. Callers get copies, as the
 * list may change under them. Like console_request.c, this calls no other
 * console file.
 */
#ifndef OUTBOX_CONSOLE_DATABASES_H
#define OUTBOX_CONSOLE_DATABASES_H

#include <pthread.h>

#include "database_list.h"
#include "error.h"

struct console_databases {
    const char *file;     /* --databases FILE; NULL: the one database of --database-url */
    pthread_mutex_t lock; /* guards what follows */
    struct database_list list;
    struct database_file_stamp stamp;     /* the file as last read */
    double looked_at;                     /* clock_monotonic_seconds() of the last look */
    char error[OUTBOX_ERROR_MESSAGE_MAX]; /* why the file as it is was not taken; "" when it was */
};

/*
 * Reads the list of file, or makes the list of the one url when file is
 * NULL. 0, or -1 with err (OUTBOX_ERR_CONFIG naming the file's bad line).
 */
int console_databases_open(struct console_databases *databases, const char *file, const char *url,
                           struct outbox_error *err);
void console_databases_close(struct console_databases *databases);

/*
 * Copies the list as it is now (the file looked at first) into out and the
 * file's error ("" when none) into error; -1 when out of memory.
 */
int console_databases_copy(struct console_databases *databases, struct database_list *out,
                           char *error, size_t size);

/*
 * The database called wanted (NULL or "": the first of the list): its name
 * into name and a malloc'd copy of its URL into *url. 0 (with *url NULL and
 * name "" when the list is empty and none was named), -1 when the list has
 * no database called wanted, -2 when out of memory.
 */
int console_databases_pick(struct console_databases *databases, const char *wanted,
                           char name[DATABASE_NAME_MAX], char **url);

#endif
