/*
 * store_admin.h - the operators' half of the store: status figures, dead
 * rows, retention purge and one-off enqueue, as used by outboxctl. Dead
 * rows, the command line's and the console's alike, are store_dead.h's.
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
    double oldest_ready_seconds; /* longest wait of a due ready row or unpublished stream row; 0: none */
    bool stream;                 /* the queue is a stream (outbox.stream) */
    int64_t stream_published;    /* stream rows behind their partition's cursor */
    int64_t stream_waiting;      /* stream rows after it, not published yet */
    int64_t blocked_keys;        /* ordering keys whose head is dead or retrying (all of them) */
    bool paused;                 /* the whole queue is paused */
    int64_t paused_keys;         /* ordering keys of the queue paused */
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
 * The session or prepared transaction whose snapshot or transaction id is
 * oldest, in any database of the cluster: it holds back the xmin horizon
 * (vacuum cannot remove dead outbox rows newer than it) and, with an xid,
 * every stream queue's read.
 */
struct store_oldest_transaction {
    bool present; /* false: no other session or prepared transaction holds an xmin */
    int pid;      /* 0: a prepared transaction */
    char *application_name;
    char *state;        /* pg_stat_activity.state, e.g. "idle in transaction", or "prepared" */
    double age_seconds; /* now - xact_start (or since it was prepared); 0 when unknown */
    int64_t xid_age;    /* transactions since its xmin */
    char *database;     /* its database */
    char *prepared_gid; /* a prepared transaction's gid; "" for a session */
};

/* One pause of a queue or of one ordering key of it (outbox.paused). */
struct store_pause {
    char *queue;
    char *ordering_key; /* NULL: the whole queue */
    char *reason;       /* NULL when none was given */
    char *paused_by;    /* the database role that paused it */
    char *paused_at;    /* ISO 8601 UTC */
};

struct store_pause_list {
    struct store_pause *pauses; /* by queue, the queue's own pause first, then keys */
    size_t count;
};

/* The database's identity (sql/015_identity.sql): what message ids are made of. */
struct store_identity_row {
    char database_id[48];
    char id_form[16];      /* "uid" (<database_id>:<message_uid>), "database" or "job" (earlier forms) */
    int epoch;             /* the history: grows at each failover or restore a relay saw */
    long long timeline;    /* the timeline that epoch was recorded on */
};

/*
 * Reads the identity (as recorded: a relay's next connection bumps the
 * epoch after a history change); present false before migration 015.
 */
int store_admin_identity(PGconn *conn, struct store_identity_row *out, bool *present,
                         struct outbox_error *err);

/*
 * Sets the database id and/or the id form (NULL keeps each) and reads the
 * result into out. A bad value is OUTBOX_ERR_INVALID with the database's
 * message.
 */
int store_admin_identity_set(PGconn *conn, const char *database_id, const char *id_form,
                             struct store_identity_row *out, struct outbox_error *err);

struct store_status {
    int schema_version;                /* highest row of outbox.schema_migrations, 0 when none */
    struct store_identity_row identity; /* all empty before migration 015 */
    struct store_queue_status *queues; /* by queue name */
    size_t queue_count;
    int64_t table_bytes; /* heap + TOAST of outbox.job */
    int64_t index_bytes;
    int64_t live_tuples;
    int64_t dead_tuples;    /* not yet vacuumed */
    char *last_autovacuum;  /* ISO 8601 UTC, NULL: never */
    char *last_autoanalyze; /* ISO 8601 UTC, NULL: never */
    /* succeeded rows against the retention given to store_admin_status() */
    double retention_seconds;
    struct outbox_table_sample cleanup;
    struct store_oldest_transaction oldest_transaction;
    struct store_blocked_key *blocked; /* by queue, then head job_id; see blocked_keys */
    size_t blocked_count;
    struct store_pause_list paused; /* every pause, also of queues without rows */
};

/*
 * Fills status. Per-queue counts scan outbox.job; blocked keys start from the
 * partial indexes of dead, ready and running rows only; the cleanup figures
 * compare succeeded rows with retention_seconds (the relays' --retention).
 */
int store_admin_status(PGconn *conn, double retention_seconds, struct store_status *status,
                       struct outbox_error *err);
void store_status_clear(struct store_status *status);

/*
 * How far a batched command (purge, inbox purge, replay) has come: after
 * every batch that committed, batch_done(arg, rows) with the rows done so
 * far, so a caller can show progress or say what was done before an error.
 */
struct store_progress {
    void (*batch_done)(void *arg, int64_t rows);
    void *arg;
};

/*
 * Deletes succeeded rows finished more than older_than_seconds ago, in
 * transactions of at most batch_size rows, skipping rows locked by others,
 * until none is left: the relays' cleanup batches (outbox_cleanup_batch()),
 * taking turns with them under the same advisory lock. The cutoff is fixed
 * at the start, so this ends. Stores the rows deleted in *count, also on
 * failure; progress (may be NULL) is told after each batch.
 */
int store_admin_purge(PGconn *conn, int64_t older_than_seconds, int batch_size,
                      const struct store_progress *progress, int64_t *count,
                      struct outbox_error *err);

/*
 * Enqueues one row through outbox_enqueue() in its own transaction and
 * notifies channel outbox_job on commit. Stores the job id (the existing one
 * for a known idempotency key) in *job_id.
 */
int store_admin_enqueue(PGconn *conn, const struct outbox_message *message, int64_t *job_id,
                        struct outbox_error *err);

/*
 * Pauses queue, or only its rows of ordering key key (not NULL), through
 * outbox.pause(): relays stop claiming them at their next claim. reason may
 * be NULL. *changed is false when it was paused already (a new reason then
 * replaces the old one).
 */
int store_admin_pause(PGconn *conn, const char *queue, const char *key, const char *reason,
                      bool *changed, struct outbox_error *err);

/*
 * Resumes queue (its own pause only) or one ordering key of it through
 * outbox.resume(), which wakes waiting relays. *changed is false when it was
 * not paused; *keys_still_paused counts the keys of queue that stay paused.
 */
int store_admin_resume(PGconn *conn, const char *queue, const char *key, bool *changed,
                       int64_t *keys_still_paused, struct outbox_error *err);

/* Lists every pause. */
int store_admin_paused(PGconn *conn, struct store_pause_list *list, struct outbox_error *err);
void store_pause_list_clear(struct store_pause_list *list);

/*
 * Which succeeded rows of one queue to publish again: either those finished
 * in [since, until) (timestamptz texts; since NULL: from the start, until
 * NULL: until now), or those with the given ids; with key, only rows of that
 * ordering key.
 */
struct store_replay_request {
    const char *queue;
    const char *since;
    const char *until;
    const int64_t *job_ids;
    size_t job_count; /* > 0: by ids, since and until unused */
    const char *ordering_key;
    bool dry_run;   /* count only */
    int batch_size; /* rows per transaction */
    /* told after each batch; may be NULL */
    const struct store_progress *progress;
};

struct store_replay_result {
    int64_t replayed; /* rows made ready again (with dry_run: that would be) */
    int64_t ready;    /* selected rows refused: not published yet, or being replayed */
    int64_t running;
    int64_t dead;     /* by ids, or dead rows that finished in the time range */
    int64_t missing;  /* ids not found in the queue (or not of the key) */
};

/*
 * Sends succeeded rows back to ready, with replays + 1 and a fresh budget
 * of max_attempts more attempts, in transactions of at most batch_size rows
 * taken in finish order. Rows of one ordering key are published again in
 * job_id order: all but the first of a key wait (held) as when enqueued.
 * The end of the range is fixed at the start (now, at the latest), so rows
 * that finish again meanwhile are not taken twice. Rows in other states are
 * counted, never changed. *result holds what was done, also on failure.
 * Rows of a stream queue behind their partition's cursor count as
 * succeeded, finished when created: they leave the stream as ready rows
 * (in read order, after the succeeded ones) and the cursor stays; rows
 * after the cursor count as ready (not published yet).
 */
int store_admin_replay(PGconn *conn, const struct store_replay_request *request,
                       struct store_replay_result *result, struct outbox_error *err);

/*
 * Checks that text is a timestamptz PostgreSQL reads; 0, or -1 with
 * OUTBOX_ERR_INVALID (bad text) or another code (connection).
 */
int store_admin_check_time(PGconn *conn, const char *text, struct outbox_error *err);

/*
 * Stores the time seconds ago in buf as ISO 8601 text with an explicit
 * offset (the same instant under any DateStyle and TimeZone); 0 or -1.
 */
int store_admin_time_ago(PGconn *conn, int64_t seconds, char *buf, size_t size,
                         struct outbox_error *err);

/*
 * Deletes inbox records (outbox.inbox, and the keyed inbox's marks in
 * outbox.inbox_key) accepted more than
 * older_than_seconds ago, in transactions of at most batch_size rows, until
 * none is left. Stores the rows deleted in *count, also on failure;
 * progress (may be NULL) is told after each batch.
 */
int store_admin_inbox_purge(PGconn *conn, int64_t older_than_seconds, int batch_size,
                            const struct store_progress *progress, int64_t *count,
                            struct outbox_error *err);

/* The parts store_admin_status_parts() reads, or-ed together. */
#define STORE_STATUS_TABLE 1u   /* schema version, table figures, the oldest transaction */
#define STORE_STATUS_BLOCKED 2u /* blocked keys (their totals go into the queues in status) */
#define STORE_STATUS_PAUSED 4u  /* pauses (marked on the queues in status) */
#define STORE_STATUS_BLOCKED_COUNTS 8u /* only the totals of blocked keys of the queues */

/*
 * The parts of store_admin_status() that never scan outbox.job, those of
 * parts only; the queues already in status (the caller filled them, or
 * none) get their blocked and paused marks. On failure status keeps what
 * was read; store_status_clear() frees it.
 */
int store_admin_status_parts(PGconn *conn, unsigned parts, struct store_status *status,
                             struct outbox_error *err);

#endif
