/*
 * store_dead.h - the one store of dead rows, which the command line and the
 * console both call: listing them by a filter, and making them ready again
 * or deleting them, one by one or in bounded batches.
 *
 * As in store_admin.h: every function runs on a connection the caller
 * owns, with no transaction open, and uses bound parameters only; results
 * are released with the matching *_clear().
 */
#ifndef OUTBOX_STORE_DEAD_H
#define OUTBOX_STORE_DEAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "outbox.h"

/* Which dead rows: every given field narrows the selection (all NULL / 0: every dead row). */
struct store_dead_filter {
    const char *queue;
    const char *ordering_key;
    const char *error_text; /* a case-insensitive substring of last_error */
    const int64_t *job_ids;
    size_t job_count;
};

struct store_dead_job {
    int64_t job_id;
    char *queue;
    char *ordering_key; /* NULL: none */
    int32_t attempts;
    int32_t max_attempts;
    char *finished_at; /* ISO 8601 UTC */
    char *last_error;  /* NULL: none */
    char *payload;     /* JSON text; a longer one than STORE_DEAD_PAYLOAD_MAX bytes
                          comes as a JSON string of its first characters and " [cut]" */
    char *headers;     /* JSON text */
};

#define STORE_DEAD_PAYLOAD_MAX 65536

struct store_dead_list {
    struct store_dead_job *jobs;
    size_t count;
};

/* Lists up to limit dead rows matching filter, by queue and job_id. */
int store_dead_list(PGconn *conn, const struct store_dead_filter *filter, int64_t limit,
                            struct store_dead_list *list, struct outbox_error *err);
void store_dead_list_clear(struct store_dead_list *list);

/* Called after each batch with the rows done so far; may be NULL. */
typedef void store_dead_progress(void *arg, int64_t done);

/*
 * Makes the dead rows matching filter ready again now with one more
 * attempt (as `outboxctl dead retry`), or deletes them: in transactions of
 * at most batch_size rows taken in job_id order, skipping rows locked by
 * others, so no lock is held for longer than one batch. *count holds the
 * rows changed, also on failure.
 */
int store_dead_retry(PGconn *conn, const struct store_dead_filter *filter,
                             int batch_size, store_dead_progress *progress, void *arg,
                             int64_t *count, struct outbox_error *err);
int store_dead_delete(PGconn *conn, const struct store_dead_filter *filter,
                              int batch_size, store_dead_progress *progress, void *arg,
                              int64_t *count, struct outbox_error *err);

/*
 * Makes dead rows ready again now with max_attempts = attempts +
 * extra_attempts: those of queue (NULL: any) and job_id (0: any). Keeps
 * last_error. Stores the number of rows changed in *count.
 */
int store_admin_dead_retry(PGconn *conn, const char *queue, int64_t job_id, int32_t extra_attempts,
                           int64_t *count, struct outbox_error *err);

#endif
