/*
 * store_admin.h - the operators' half of the store: status figures, dead
 * rows, retention purge and one-off enqueue, as used by outboxctl.
 *
 * Every function runs on a connection the caller owns, with no transaction
 * open, and uses bound parameters only. Results are owned by the caller and
 * released with the matching *_clear(), which accepts a zeroed or already
 * cleared struct. Errors read "unable to <action>: <server message>"; a
 * missing schema is OUTBOX_ERR_SCHEMA.
 */
#ifndef OUTBOX_STORE_ADMIN_H
#define OUTBOX_STORE_ADMIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "outbox.h"

/* Returns 0 when outbox.job exists, else -1 with OUTBOX_ERR_SCHEMA. */
int store_admin_check_schema(PGconn *conn, struct outbox_error *err);

/* Row counts of one queue. */
struct store_queue_status {
    char *queue;
    int64_t ready;
    int64_t running;
    int64_t succeeded;
    int64_t dead;
    double oldest_ready_seconds; /* now - run_at of the longest-waiting due ready row; 0: none */
    int64_t blocked_keys;        /* ordering keys whose head is dead or retrying (all of them) */
};

/* At most this many blocked keys per queue are listed (the oldest heads first). */
#define STORE_BLOCKED_KEYS_PER_QUEUE 20

/*
 * An ordering key held up by its head: the lowest job_id of the key among
 * ready, running and dead rows is dead (it blocks the key under
 * --ordering-dead-policy block) or has failed at least once and is waiting
 * for, or running, its retry (it blocks the key under either policy).
 */
struct store_blocked_key {
    char *queue;
    char *ordering_key;
    int64_t head_job_id;
    char *head_state; /* "dead", "ready" (waiting for a retry) or "running" (retrying, or
                         a lease expired, longer than a day, or of attempt 0) */
    int32_t attempts;
    int32_t max_attempts;
    char *last_error;        /* NULL when none was recorded */
    double retry_in_seconds; /* ready head: seconds until run_at, 0 when due, -1 never
                                (run_at +infinity); else 0 */
    int64_t waiting;         /* later ready or running rows of the key */
};

/*
 * The session whose snapshot or transaction id is oldest: it holds back the
 * xmin horizon, so vacuum cannot remove dead outbox rows newer than it.
 */
struct store_oldest_transaction {
    bool present; /* false: no other session holds an xmin */
    int pid;
    char *application_name;
    char *state;        /* pg_stat_activity.state, e.g. "idle in transaction" */
    double age_seconds; /* now - xact_start; 0 when unknown */
    int64_t xid_age;    /* transactions since its xmin */
};

struct store_status {
    int schema_version;                /* highest row of outbox.schema_migrations, 0 when none */
    struct store_queue_status *queues; /* by queue name */
    size_t queue_count;
    int64_t table_bytes; /* heap + TOAST of outbox.job */
    int64_t index_bytes;
    int64_t live_tuples;
    int64_t dead_tuples;    /* not yet vacuumed */
    char *last_autovacuum;  /* ISO 8601 UTC, NULL: never */
    char *last_autoanalyze; /* ISO 8601 UTC, NULL: never */
    struct store_oldest_transaction oldest_transaction;
    struct store_blocked_key *blocked; /* by queue, then head job_id; see blocked_keys */
    size_t blocked_count;
};

/*
 * Fills status. Per-queue counts scan outbox.job; blocked keys start from the
 * partial indexes of dead, ready and running rows only.
 */
int store_admin_status(PGconn *conn, struct store_status *status, struct outbox_error *err);
void store_status_clear(struct store_status *status);

/* One dead row. */
struct store_dead_job {
    int64_t job_id;
    char *queue;
    int32_t attempts;
    int32_t max_attempts;
    char *finished_at; /* ISO 8601 UTC */
    char *last_error;  /* NULL when none was recorded */
};

struct store_dead_list {
    struct store_dead_job *jobs;
    size_t count;
};

/* Lists up to limit dead rows of queue (NULL: every queue), by queue and job_id. */
int store_admin_dead_list(PGconn *conn, const char *queue, int64_t limit,
                          struct store_dead_list *list, struct outbox_error *err);
void store_dead_list_clear(struct store_dead_list *list);

/*
 * Makes dead rows ready again now with max_attempts = attempts +
 * extra_attempts: those of queue (NULL: any) and job_id (0: any). Keeps
 * last_error. Stores the number of rows changed in *count.
 */
int store_admin_dead_retry(PGconn *conn, const char *queue, int64_t job_id, int32_t extra_attempts,
                           int64_t *count, struct outbox_error *err);

/*
 * Deletes succeeded rows finished more than older_than_seconds ago, in
 * transactions of at most batch_size rows, skipping rows locked by others,
 * until none is left. The cutoff is fixed at the start, so this ends. Stores
 * the rows deleted in *count, also on failure.
 */
int store_admin_purge(PGconn *conn, int64_t older_than_seconds, int batch_size, int64_t *count,
                      struct outbox_error *err);

/*
 * Enqueues one row through outbox.enqueue() in its own transaction and
 * notifies channel outbox_job on commit. key may be NULL. Stores the job id
 * (the existing one for a known key) in *job_id.
 */
int store_admin_enqueue(PGconn *conn, const char *queue, const char *payload_json, const char *key,
                        int64_t *job_id, struct outbox_error *err);

#endif
