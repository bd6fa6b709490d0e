/*
 * console_databases.c - the console's databases: the --databases list
 * followed while serving, or the one --database-url (see
 * console_databases.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "console_databases.h"
#include "timeouts.h"

int
console_databases_open(struct console_databases *databases, const char *file, const char *url,
                       struct outbox_error *err)
{
    memset(databases, 0, sizeof(*databases));
    databases->file = file;
    if (file == NULL) {
        if (database_list_single(url, &databases->list) != 0)
            return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    } else {
        databases->stamp = database_file_stamp(file);
        if (database_list_read(file, &databases->list, err) != 0)
            return -1;
    }
    databases->looked_at = clock_monotonic_seconds();
    pthread_mutex_init(&databases->lock, NULL);
    return 0;
}

void
console_databases_close(struct console_databases *databases)
{
    database_list_clear(&databases->list);
    pthread_mutex_destroy(&databases->lock);
}

/*
 * Under the lock: reads the file again when its stamp changed, at most once
 * a second. A bad file keeps the list; its error is logged once per change.
 */
static void
follow_file(struct console_databases *databases)
{
    double now = clock_monotonic_seconds();
    struct database_file_stamp stamp;
    struct database_list list;
    struct outbox_error err;

    if (databases->file == NULL || now - databases->looked_at < CONSOLE_LIST_LOOK_SECONDS)
        return;
    databases->looked_at = now;
    stamp = database_file_stamp(databases->file);
    if (!database_file_changed(&stamp, &databases->stamp))
        return;
    databases->stamp = stamp;
    if (database_list_read(databases->file, &list, &err) != 0) {
        fprintf(stderr,
                "outboxctl serve: database list not read again, the previous one is "
                "kept: %s\n",
                err.message);
        snprintf(databases->error, sizeof(databases->error), "%s", err.message);
        return;
    }
    database_list_clear(&databases->list);
    databases->list = list;
    databases->error[0] = '\0';
    fprintf(stderr, "outboxctl serve: database list read again: %zu database%s\n", list.count,
            list.count == 1 ? "" : "s");
}

int
console_databases_copy(struct console_databases *databases, struct database_list *out, char *error,
                       size_t size)
{
    int rc;

    pthread_mutex_lock(&databases->lock);
    follow_file(databases);
    rc = database_list_copy(&databases->list, out);
    snprintf(error, size, "%s", databases->error);
    pthread_mutex_unlock(&databases->lock);
    return rc;
}

int
console_databases_pick(struct console_databases *databases, const char *wanted,
                       char name[DATABASE_NAME_MAX], char **url)
{
    const struct database_entry *entry;
    int rc = 0;

    name[0] = '\0';
    *url = NULL;
    pthread_mutex_lock(&databases->lock);
    follow_file(databases);
    if (wanted != NULL && wanted[0] != '\0')
        entry = database_list_find(&databases->list, wanted);
    else
        entry = databases->list.count > 0 ? &databases->list.items[0] : NULL;
    if (entry != NULL) {
        snprintf(name, DATABASE_NAME_MAX, "%s", entry->name);
        if ((*url = strdup(entry->url)) == NULL)
            rc = -2;
    } else if (wanted != NULL && wanted[0] != '\0') {
        rc = -1;
    }
    pthread_mutex_unlock(&databases->lock);
    return rc;
}
