/*
 * outbox.h - the public API of liboutbox: a transactional outbox in PostgreSQL.
 *
 * Producers call outbox_enqueue() on their own PGconn inside their own open
 * transaction, so the outbox row commits or rolls back with the business data.
 *
 * Workers (the relay, or plain in-database workers) open an outbox_store and
 * run the lease protocol against outbox.job:
 *
 *   claim    lock up to N ready rows with FOR UPDATE SKIP LOCKED in one short
 *            statement, mark them running, set worker + lease, and bump
 *            attempts, which is the generation of this claim
 *   extend   push the lease of rows still owned
 *   complete mark owned rows succeeded (or delete them, if the store is set so)
 *   fail     give owned rows back with a backoff delay, or make them dead
 *   release  give owned rows back at once without spending an attempt
 *   reap     recover rows whose lease expired (any worker's)
 *   cleanup  delete succeeded rows older than a retention
 *
 * Every write of an owned row is fenced by worker id + generation + an
 * unexpired lease: a worker that lost its lease changes nothing, and the
 * rows it no longer owns are reported back as "lease lost", never as done.
 *
 * The store's session runs with synchronous_commit off: a claim or mark lost
 * in a database crash can only cause another publish, which at-least-once
 * delivery allows. Producers' business commits are unaffected.
 *
 * Rules: functions return 0 on success and -1 on failure, filling the
 * caller's struct outbox_error (err may be NULL: the call still fails
 * cleanly, with nothing filled). The library never prints and never exits.
 * Every *_free(NULL) is a no-op. An outbox_store is not thread-safe: use one
 * per thread.
 */
#ifndef OUTBOX_H
#define OUTBOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

/*
 * Error codes. Transient ones are worth retrying after a backoff; fatal ones
 * are not (bad input, missing schema, misconfiguration).
 */
enum outbox_error_code {
    OUTBOX_OK = 0,
    OUTBOX_ERR_CONNECTION, /* transient: server unreachable, connection lost */
    OUTBOX_ERR_TIMEOUT,    /* transient: an operation ran out of time */
    OUTBOX_ERR_BUSY,       /* transient: serialization failure, deadlock, lock timeout */
    OUTBOX_ERR_BROKER,     /* transient: the broker refused or failed a request */
    OUTBOX_ERR_INVALID,    /* fatal: bad argument or value */
    OUTBOX_ERR_CONFIG,     /* fatal: bad configuration */
    OUTBOX_ERR_SCHEMA,     /* fatal: outbox schema missing or too old */
    OUTBOX_ERR_STATE,      /* fatal: called in the wrong state (no open transaction, pipeline
                              mode, a command in progress): libpq or the library refused the
                              call on a good connection, and a retry as is fails the same way */
    OUTBOX_ERR_CONSTRAINT, /* fatal: the database rejected the row (SQLSTATE class 23) */
    OUTBOX_ERR_INTERNAL,   /* fatal: out of memory or a broken invariant */
};

#define OUTBOX_ERROR_MESSAGE_MAX 512

/* A caller-owned error: code, SQLSTATE when the database gave one, message. */
struct outbox_error {
    enum outbox_error_code code;
    char sqlstate[6];
    char message[OUTBOX_ERROR_MESSAGE_MAX];
};

/*
 * True when retrying the failed operation later can succeed (false for NULL).
 * An error without SQLSTATE is a connection error (transient) only when
 * the connection is gone (PQstatus not CONNECTION_OK); on a good connection
 * it is OUTBOX_ERR_STATE.
 */
bool outbox_error_is_transient(const struct outbox_error *err);

/* A short lowercase name of the code, e.g. "connection". */
const char *outbox_error_code_name(enum outbox_error_code code);

/* Resets err to OUTBOX_OK with an empty message. */
void outbox_error_clear(struct outbox_error *err);

/* ---- producer side ----------------------------------------------------- */

/*
 * What to enqueue. queue and payload_json are required; every other field
 * has the default of outbox.enqueue() when left zero/NULL (priority 0,
 * run at now, max_attempts 10, headers {}, the relay's exchange, the queue
 * as routing key).
 *
 * Trace context: a traceparent (W3C, version 00) here goes into the row's
 * headers as "traceparent", with tracestate as "tracestate", validated by
 * the database (an invalid one fails with SQLSTATE 22023, as
 * OUTBOX_ERR_INVALID). A traceparent already in headers_json wins over this
 * one; this one wins over the session's outbox.traceparent setting.
 */
struct outbox_message {
    const char *queue;           /* 1-200 chars of [A-Za-z0-9._:-] */
    const char *payload_json;    /* any JSON value */
    const char *idempotency_key; /* NULL: none; else unique per queue */
    const char *headers_json;    /* NULL: {}; else an object of string values */
    const char *ordering_key;    /* NULL: none */
    int32_t priority;            /* higher is claimed first */
    int32_t max_attempts;        /* 0: default 10; negative: refused (22023) */
    double delay_seconds;        /* run_at = now() + delay; 0: now */
    const char *exchange;        /* NULL: the relay's --exchange; at most 255 bytes */
    const char *routing_key;     /* NULL: the queue; AMQP routing key, Redis stream suffix */
    const char *traceparent;     /* NULL: none (or the session's, see above) */
    const char *tracestate;      /* NULL: none; used only with a traceparent */
};

/*
 * Inserts one outbox row through outbox.enqueue() on the caller's
 * connection, which must be inside an open transaction (never opened or
 * committed here), out of pipeline mode and with no command of the
 * caller's in progress (else OUTBOX_ERR_STATE, saying which). Stores the new
 * job id, or with an idempotency key already present in that queue, the
 * existing job id, in *job_id; job_id may be NULL when the id is not needed.
 * The queue name appears in an error message with control characters as '?'.
 */
int outbox_enqueue(PGconn *conn, const struct outbox_message *message, int64_t *job_id,
                   struct outbox_error *err);

/*
 * Inserts count outbox rows through outbox.enqueue_batch() on the caller's
 * connection, inside its open transaction, and stores their job ids in
 * job_ids[0..count-1] in message order, with the same rules as
 * outbox_enqueue(): an idempotency key already in the queue, or repeated
 * within the call, gives the existing (or first) row's id; rows of one
 * ordering key keep their order and wait behind an unfinished earlier row.
 * job_ids may be NULL when the ids are not needed; connection state as for
 * outbox_enqueue().
 * Consecutive messages with the same queue, headers, priority, max_attempts,
 * delay, exchange, routing key and trace context go in one statement, so a
 * batch of one queue costs one round trip however many rows it holds. On error nothing is stored in job_ids
 * that the caller may rely on, and the transaction is aborted if the
 * database refused a row (the caller rolls back, as after outbox_enqueue()).
 */
int outbox_enqueue_many(PGconn *conn, const struct outbox_message *messages, size_t count,
                        int64_t *job_ids, struct outbox_error *err);

/* ---- consumer side ------------------------------------------------------ */

/*
 * The inbox: records that consumer took message_id (the relay's message id,
 * "<database_id>:<message_uid>": the AMQP message_id, the Redis entry's
 * message_id, NATS' Outbox-Message-Id, Kafka's message-id) through outbox.inbox_accept() on the
 * caller's connection, which must be inside an open transaction. Stores true
 * in *accepted the first time, false when this consumer accepted the id
 * before: the consumer then skips its work. Commit the consumer's own writes
 * in the same transaction; a rollback leaves the id unaccepted. A concurrent
 * transaction accepting the same id waits for the first to end. accepted
 * must not be NULL (OUTBOX_ERR_INVALID, nothing recorded); connection state
 * as for outbox_enqueue().
 */
int outbox_inbox_accept(PGconn *conn, const char *consumer, const char *message_id,
                        bool *accepted, struct outbox_error *err);

/*
 * The inbox in key order, through outbox.inbox_accept(consumer, message_id,
 * ordering_key): message_id is the relay's message id. One of the form
 * "<database_id>:<message_uid>" carries no order and is accepted once by its
 * id (every publish of a row carries the same id, so a stale publish is a
 * repeat). For the earlier forms ("<database_id>:<epoch>:<job_id>", or a
 * bare job id) (epoch, job id) rises along an ordering key within one
 * database, so *accepted is true only when it is above the last one this
 * consumer accepted for that key of that database (job ids of 1 to 19
 * digits). False for a repeat, and for a message older than one already
 * applied (a relay that lost its lease can publish a stale row after later
 * rows of its key). A replay (".r<n>" after the id) is accepted once by
 * its id, whatever the key's order. A message_id of no such form fails with
 * OUTBOX_ERR_INVALID. ordering_key NULL is outbox_inbox_accept(). Same
 * transaction rules as outbox_inbox_accept().
 */
int outbox_inbox_accept_in_order(PGconn *conn, const char *consumer, const char *message_id,
                                 const char *ordering_key, bool *accepted,
                                 struct outbox_error *err);

/* ---- worker side ------------------------------------------------------- */

typedef struct outbox_store outbox_store;

/*
 * Connects to database_url (a libpq URI or conninfo) as worker_id, checks
 * that the outbox schema is present, and prepares the protocol statements.
 * Returns NULL and fills err on failure.
 */
outbox_store *outbox_store_connect(const char *database_url, const char *worker_id,
                                   struct outbox_error *err);
void outbox_store_free(outbox_store *store);

/*
 * Checks that the session's role has every privilege the relay uses: USAGE
 * on schema outbox, SELECT, UPDATE and DELETE on outbox.job, EXECUTE on the
 * functions its statements call. 0, or -1 with OUTBOX_ERR_CONFIG, SQLSTATE
 * 42501 and a message naming the first one missing.
 */
int outbox_store_check_privileges(outbox_store *store, struct outbox_error *err);

/* The underlying connection, e.g. for LISTEN and poll() on its socket. */
PGconn *outbox_store_conn(outbox_store *store);

/*
 * Ordering-key policy for claims: false (default) lets a dead head stop
 * blocking its key; true keeps the key blocked until an operator retries or
 * removes the dead row.
 */
void outbox_store_set_block_on_dead_head(outbox_store *store, bool block);

/*
 * What complete does with a published row: false (default) marks it
 * succeeded and keeps it until cleanup; true deletes it, fenced exactly like
 * the mark, which costs PostgreSQL less per row but keeps nothing to
 * replay or audit, and an idempotency key is free again once its row is
 * gone. Switch it only while no complete is sent ahead.
 */
void outbox_store_set_delete_on_success(outbox_store *store, bool delete_rows);

/*
 * Wait until a notification arrives on channel outbox_job, the socket
 * reports an error, or timeout_ms passes. Starts listening on first use.
 * Stores whether something was notified in *notified.
 */
int outbox_store_wait(outbox_store *store, int timeout_ms, bool *notified,
                      struct outbox_error *err);

/* One claimed row. Strings point into the batch and live as long as it. */
struct outbox_job {
    int64_t job_id;
    int32_t generation; /* attempts after this claim; fences every later write */
    int32_t max_attempts;
    const char *queue;
    const char *payload; /* JSON text */
    size_t payload_len;
    const char *headers;      /* JSON object text, string values */
    const char *ordering_key; /* NULL when none */
    double created_at;        /* epoch seconds, with fraction; 0 when infinite */
    int32_t replays;          /* times an operator replayed the row (outboxctl replay) */
    const char *exchange;     /* NULL: the relay's --exchange */
    const char *routing_key;  /* NULL: route by queue */
    /*
     * A row a stream queue handed to the claims when it was disabled: its
     * place in that stream, for a broker that records how far each
     * partition was published (the relay's Redis sink). stream_order names
     * the partition within the queue ("<epoch>:<partition>"), stream_place
     * the row in it (39 digits, ordered as text). NULL for every other row.
     */
    const char *stream_order;
    const char *stream_place;
    /*
     * The row's own identity (36-character uuid text), drawn at its insert
     * (sql/021_message_uid.sql): what message ids are made of.
     */
    const char *message_uid;
};

/* Claimed rows in ascending job_id order. */
struct outbox_batch {
    struct outbox_job *jobs;
    size_t count;
    void *storage; /* owned result; private */
};

/*
 * Claims up to limit ready rows (run_at reached) of the given queues, or of
 * every queue when queue_count is 0, preferring higher priority, then earlier
 * run_at, then lower job_id. Sets a lease of lease_seconds. Rows with an
 * ordering key are claimed only when no earlier row of that key in that queue
 * is ready or running. Rows of a paused queue or ordering key (outbox.paused)
 * are not claimed; the store reads the pauses again when they are a fifth of a
 * second old, and after a notification on outbox_job. On success batch holds
 * 0..limit rows; free it with outbox_batch_release_memory().
 */
int outbox_claim(outbox_store *store, const char *const *queues, size_t queue_count, int limit,
                 int lease_seconds, struct outbox_batch *batch, struct outbox_error *err);

/*
 * Reads the pauses again now when they are a fifth of a second old; a no-op
 * otherwise, and while statements are sent ahead. outbox_claim_send() reads
 * them itself when nothing is sent ahead, else ahead of the claim for the
 * claim after it; a caller that sends marks before its claim calls this
 * first, so a pause reaches its very next claim.
 */
int outbox_store_refresh_pauses(outbox_store *store, struct outbox_error *err);

/*
 * Sending ahead. The claim, complete, fail and release also come in two halves, so a
 * caller can publish one batch while the database marks the last one and
 * claims the next: *_send() sends the statement and returns without waiting
 * (the server runs and commits each one as its own transaction), *_receive()
 * waits for its result. Up to four statements may be sent ahead; their
 * results must be received in the order sent, with the same arguments, and
 * before any other call on the store. outbox_claim() and the others are a
 * send and a receive in a row.
 */
int outbox_claim_send(outbox_store *store, const char *const *queues, size_t queue_count, int limit,
                      int lease_seconds, struct outbox_error *err);
int outbox_claim_receive(outbox_store *store, struct outbox_batch *batch, struct outbox_error *err);
void outbox_batch_release_memory(struct outbox_batch *batch);

/* A reference to an owned row: id + the generation returned by claim. */
struct outbox_lease {
    int64_t job_id;
    int32_t generation;
};

/*
 * Each of the fenced writes below handles a whole set of rows in one round
 * trip and sets done[i] to true for rows it changed. done[i] false means the
 * lease was lost (expired and reaped, re-claimed, or the row is gone): the
 * caller no longer owns it and must not treat it as done. The count of rows
 * changed is returned in *changed when changed is not NULL.
 */
int outbox_extend(outbox_store *store, const struct outbox_lease *leases, size_t count,
                  int lease_seconds, bool *done, size_t *changed, struct outbox_error *err);
int outbox_complete(outbox_store *store, const struct outbox_lease *leases, size_t count,
                    bool *done, size_t *changed, struct outbox_error *err);
int outbox_complete_send(outbox_store *store, const struct outbox_lease *leases, size_t count,
                         struct outbox_error *err);
int outbox_complete_receive(outbox_store *store, const struct outbox_lease *leases, size_t count,
                            bool *done, size_t *changed, struct outbox_error *err);

/* Why one row failed, for outbox_fail(). */
struct outbox_failure {
    int64_t job_id;
    int32_t generation;
    const char *error;    /* kept in last_error */
    double retry_seconds; /* delay before the row is ready again */
    bool permanent;       /* dead now, whatever attempts remain */
};

/*
 * Gives failed rows back: ready again after retry_seconds, or dead (with
 * finished_at) when attempts reached max_attempts or the failure is
 * permanent. dead[i] tells which rows became dead; it may be NULL.
 */
int outbox_fail(outbox_store *store, const struct outbox_failure *failures, size_t count,
                bool *done, bool *dead, size_t *changed, struct outbox_error *err);
int outbox_fail_send(outbox_store *store, const struct outbox_failure *failures, size_t count,
                     struct outbox_error *err);
int outbox_fail_receive(outbox_store *store, const struct outbox_failure *failures, size_t count,
                        bool *done, bool *dead, size_t *changed, struct outbox_error *err);

/*
 * Gives owned rows back, ready now, without spending their attempt: for
 * rows that were not published through no fault of their own (a stop, a
 * lost broker connection or channel, a busy broker).
 */
int outbox_release(outbox_store *store, const struct outbox_lease *leases, size_t count, bool *done,
                   size_t *changed, struct outbox_error *err);
int outbox_release_send(outbox_store *store, const struct outbox_lease *leases, size_t count,
                        struct outbox_error *err);
int outbox_release_receive(outbox_store *store, const struct outbox_lease *leases, size_t count,
                           bool *done, size_t *changed, struct outbox_error *err);

/* Counts of one reap pass. */
struct outbox_reap_result {
    size_t ready; /* expired rows given back for another attempt */
    size_t dead;  /* expired rows that had no attempt left */
};

/*
 * Recovers at most limit running rows whose lease expired: ready again
 * after retry_seconds, or dead when their attempts are spent. Safe to run
 * from many workers at once (SKIP LOCKED).
 */
int outbox_reap(outbox_store *store, int limit, double retry_seconds,
                struct outbox_reap_result *result, struct outbox_error *err);

/*
 * Rows with an ordering key wait ("held") while an earlier row of their key
 * is unfinished; finishing a row releases the next one at once. This sweep
 * releases the rare row whose predecessor finished while the row itself was
 * being inserted. It looks at up to key_limit keys per call and continues
 * where the previous call of this store stopped. Safe from many workers.
 */
int outbox_release_waiting(outbox_store *store, int key_limit, size_t *released,
                           struct outbox_error *err);

/*
 * Retention cleanup, shared by the relays and `outboxctl purge`: a cutoff
 * fixed once (so a run ends), then batches of at most limit rows, each its
 * own short transaction, until a batch deletes fewer than limit rows.
 *
 * Every batch first takes the transaction-scoped advisory lock
 * OUTBOX_CLEANUP_LOCK_KEY with pg_try_advisory_xact_lock(), so the whole
 * database runs at most one cleanup batch at a time however many relays
 * and purges there are; a batch that finds it taken deletes nothing and
 * reports locked = false. Both calls run on conn with no transaction open;
 * the outbox_store_ forms run on a store's connection through its prepared
 * statements, each answer waited for within the store's deadline like every
 * other statement of the store (OUTBOX_ERR_TIMEOUT past it: drop the store).
 */
/* the bigint of the ASCII bytes "outboxcl"; also in docs/deploy.md */
#define OUTBOX_CLEANUP_LOCK_KEY "8031453476610925420"

/* Writes the database's now minus older_than_seconds to cutoff (timestamptz text). */
int outbox_cleanup_cutoff(PGconn *conn, double older_than_seconds, char *cutoff, size_t size,
                          struct outbox_error *err);
int outbox_store_cleanup_cutoff(outbox_store *store, double older_than_seconds, char *cutoff,
                                size_t size, struct outbox_error *err);

/* What one cleanup batch did. */
struct outbox_cleanup_result {
    bool locked;    /* false: another session's batch held the lock, nothing was deleted */
    size_t deleted; /* rows deleted */
};

/* Deletes at most limit succeeded rows finished before cutoff, oldest first. */
int outbox_cleanup_batch(PGconn *conn, const char *cutoff, int limit,
                         struct outbox_cleanup_result *cleaned, struct outbox_error *err);
int outbox_store_cleanup_batch(outbox_store *store, const char *cutoff, int limit,
                               struct outbox_cleanup_result *cleaned, struct outbox_error *err);

/* ---- observation --------------------------------------------------------- */

/* The ready backlog and the pauses of one queue, from outbox_sample_backlog(). */
struct outbox_backlog {
    const char *queue;
    int64_t ready;           /* rows ready now (run_at reached) */
    double oldest_ready_age; /* seconds since the oldest of them became ready */
    bool paused;             /* the whole queue is paused (outbox.paused) */
    int64_t paused_keys;     /* ordering keys of the queue paused */
};

/*
 * Calls each(arg, &backlog) for every queue with ready rows or a pause. One
 * index-only scan of the ready index and a read of outbox.paused: cheap
 * enough to run every few seconds.
 */
int outbox_sample_backlog(outbox_store *store,
                          void (*each)(void *arg, const struct outbox_backlog *backlog), void *arg,
                          struct outbox_error *err);

/* The oldest open transaction other than ours, which holds back vacuum. */
struct outbox_horizon {
    bool found;
    double age_seconds;
    int pid;
    char application[64];
    char state[32];
};

int outbox_sample_horizon(outbox_store *store, struct outbox_horizon *horizon,
                          struct outbox_error *err);

/* Size and cleanup figures of outbox.job, from outbox_sample_table(). */
struct outbox_table_sample {
    int64_t table_bytes;    /* heap + TOAST */
    int64_t index_bytes;    /* all indexes */
    int64_t dead_tuples;    /* not yet vacuumed, from the statistics collector */
    int64_t succeeded_rows; /* succeeded rows in the table */
    int64_t past_retention_rows;   /* of them, finished longer than the retention ago */
    double oldest_past_retention_seconds; /* how far the oldest succeeded row is past the retention; 0: none */
};

/*
 * Samples outbox.job on conn (no transaction open). The succeeded counts
 * read job_succeeded_idx: their cost follows rate x retention, so call this
 * every few tens of seconds, not per batch. Infinite timestamps never fail it.
 */
int outbox_sample_table(PGconn *conn, double retention_seconds,
                        struct outbox_table_sample *sample, struct outbox_error *err);
/* The same on a store, through its prepared statements and within its deadline. */
int outbox_store_sample_table(outbox_store *store, double retention_seconds,
                              struct outbox_table_sample *sample, struct outbox_error *err);

/*
 * The retry delay after the given attempt failed: base * 2^(attempt-1),
 * capped, then scaled by a jitter factor in [0.5, 1.0] drawn from random01
 * (a value in [0, 1)). Pure; the caller supplies the randomness.
 */
double outbox_backoff_seconds(int attempt, double base_seconds, double cap_seconds,
                              double random01);

/* ---- schema ------------------------------------------------------------ */

/*
 * The migrations of sql/ are embedded in the library and applied in version
 * order, each once and in its own transaction with its row in
 * outbox.schema_migrations, concurrent callers serialized by an advisory lock.
 *
 * Applies every embedded migration not yet recorded in
 * outbox.schema_migrations, creating schema outbox and that table when
 * missing. conn must be connected with no transaction open. Stores how many
 * files were applied in *applied (when not NULL), also on failure. Returns 0,
 * or -1 with err filled: OUTBOX_ERR_STATE for an open transaction, else the
 * code of the failing statement, with the failing file named in the message.
 */
int outbox_migrate(PGconn *conn, int *applied, struct outbox_error *err);

/*
 * Stores the highest version recorded in outbox.schema_migrations in
 * *version, or 0 when the table does not exist. Returns 0 or -1.
 */
int outbox_schema_version(PGconn *conn, int *version, struct outbox_error *err);

#endif
