/*
 * store_stream.h - the database side of stream queues (sql/009_stream.sql).
 *
 * A stream queue's rows are published by the owner of their partition, in
 * (place, job id) order, from a cursor (the place is the row's transaction
 * id, or for a keyed row its key's last transaction when higher: commit
 * order per key, migration 014): no row is written when it
 * is published. The owner holds a fenced lease on the partition's cursor
 * row; every write of the cursor, and the read, names owner and generation
 * (a lease's own value of outbox.stream_generation) and needs the
 * lease unexpired, checked after the row lock is held, so an owner that
 * lost its lease (stalled, killed, cut off) can never move a cursor a new
 * owner has taken.
 *
 * The read returns rows of transactions older than the oldest one still
 * running only: none of those can commit a row behind the cursor later.
 *
 * One connection per stream_store, used by one thread at a time. Every
 * call is one statement in autocommit. Errors follow the library's rule:
 * 0 / -1 with err filled, transient codes for what a retry may cure.
 */
#ifndef OUTBOX_STORE_STREAM_H
#define OUTBOX_STORE_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <libpq-fe.h>

#include "outbox.h"
#include "store_stream_admin.h"

typedef struct stream_store stream_store;

/* An xid8 as text: at most 20 digits. */
#define STREAM_XID_MAX 24

/*
 * A row's place in its partition's order, (xid, job_id), as text that
 * sorts as the pair does: the xid in 20 digits, then the job id in 19.
 */
#define STREAM_PLACE_SIZE 40

/*
 * Writes the place of (xid, job_id) to out (STREAM_PLACE_SIZE bytes); false
 * (out empty) for a negative job id, which has none.
 */
bool stream_place_format(char *out, const char *xid, int64_t job_id);

/* A partition this owner holds, and how far it is published. */
struct stream_partition {
    char queue[208];
    int partition;
    int64_t generation; /* of the lease, never reused: fences every write and the read */
    char cursor_xid[STREAM_XID_MAX];
    int64_t cursor_job_id;
    char order[48]; /* "<epoch>:<partition>": names this partition of this stream (sink_message) */
    /*
     * The history (outbox.identity.epoch) the cursor's place belongs to, and
     * whether the cursor is ahead of the transaction ids handed out now:
     * either way off the connection's history, the partition is rebased
     * (stream_store_rebase) before it is read.
     */
    int32_t history_epoch;
    bool ahead;
};

/*
 * Rows read after a cursor, in (xid, job_id) order. jobs[i].generation is
 * the row's attempt number (attempts + 1), for the message's attempt
 * field; xids[i] the row's place (its xid column) as text. froms[i] is
 * NULL, except for a row `stream enable` took from the claims, which may
 * have been published before without a record this stream knows of:
 * "<epoch>:<partition>", the order it left (its place there is the same),
 * or "" when it had none (only its message's dedup record can tell).
 */
struct stream_batch {
    struct outbox_job *jobs;
    const char **xids;
    const char **froms;
    size_t count;
    void *storage; /* owned result; private */
};

/*
 * A row the broker refused. permanent: never publishable as it is (dead at
 * once). stay: the row keeps its place in the stream (the cursor does not
 * pass it) and is tried again after delay_seconds, for a key whose later
 * rows must wait; otherwise it leaves the stream for the row-state path,
 * ready after delay_seconds. Either way it is dead once its attempts reach
 * max_attempts.
 */
struct stream_refusal {
    int64_t job_id;
    const char *error;
    bool permanent;
    bool stay;
    double delay_seconds;
};

void stream_store_free(stream_store *s);

/*
 * A store on conn, a connection the caller opened and keeps (stream_store_free
 * leaves it open): a stream thread's own connection, or the one a slot of a
 * relay of a list holds. The stream statements are prepared on it when
 * prepare, once for each connection. The session keeps the caller's
 * settings. NULL with err on failure.
 */
stream_store *stream_store_borrow(PGconn *conn, const char *owner, bool prepare,
                                  struct outbox_error *err);

/*
 * Has the session plan the stream statements once (plan_cache_mode =
 * force_generic_plan): their plans do not depend on their parameters, and a
 * plan made for each batch cost PostgreSQL 1-2 us per relayed row. For a
 * connection that runs stream statements only. -1 with err.
 */
int stream_store_use_generic_plans(stream_store *s, struct outbox_error *err);

/*
 * Takes up to capacity partitions whose lease expired or was never taken,
 * no more than a fair share of all partitions among the relays there are
 * (members, owners of a live lease, this one), of the queues in queues (a text[] literal such
 * as {a,b}; NULL: every stream), and only partitions p with p % modulus ==
 * residue (the threads of one owner split its partitions so). out[0..*count)
 * receive them, with a new generation and a lease of lease_seconds.
 */
int stream_store_acquire(stream_store *s, const char *queues, int modulus, int residue,
                         double lease_seconds, struct stream_partition *out, size_t capacity,
                         size_t *count, struct outbox_error *err);

/*
 * Membership (migration 010): _member says this relay publishes streams of
 * queues (a text[] literal, NULL: every queue) for another lease_seconds,
 * _leave that it stops. _surplus sets give_back[i] for those of the count
 * partitions in held this relay should give back: held over its fair share,
 * of a queue another member holding less than its share publishes.
 */
int stream_store_member(stream_store *s, const char *queues, double lease_seconds,
                        struct outbox_error *err);
int stream_store_leave(stream_store *s, struct outbox_error *err);

/*
 * *pending: a partition of queues (a text[] literal, NULL: every stream)
 * holds a row after its cursor, whether it can be read now or not (behind
 * the horizon, of a paused queue, of another owner's lease).
 */
int stream_store_pending(stream_store *s, const char *queues, bool *pending,
                         struct outbox_error *err);
int stream_store_surplus(stream_store *s, const struct stream_partition *held, size_t count,
                         bool *give_back, struct outbox_error *err);

/*
 * Extends the lease. *held false: the lease was lost (expired, or another
 * owner). With reload (a new connection: the database may be another one
 * since, a promoted standby), p's cursor, history epoch and ahead flag are
 * read again from the database.
 */
int stream_store_renew(stream_store *s, struct stream_partition *p, double lease_seconds,
                       bool reload, bool *held, struct outbox_error *err);

/* What a rebase did (sql/022_stream_history.sql). */
struct stream_rebase_report {
    bool places_kept; /* the same cluster: rows and cursor kept their places */
    int keys_reset;   /* places of the queue's keys of another history deleted */
    int levels;       /* placed anew: the highest xid step a key's order needed */
};

/*
 * Rebases partition p onto history epoch (outbox.stream_rebase, migrations
 * 015 and 022) when its cursor belongs to another history or is ahead of the
 * transaction ids: on the same cluster the places are kept; on another one
 * the rows that may be unpublished are placed anew after the cursor, each
 * key's in its commit order, none lost. p's cursor and history epoch are
 * updated, *report says what was done; *held false when the lease was lost.
 * A cursor of a later epoch than the database's is OUTBOX_ERR_STATE: the
 * partition cannot be published.
 */
int stream_store_rebase(stream_store *s, struct stream_partition *p, int32_t epoch, bool *held,
                        struct stream_rebase_report *report, struct outbox_error *err);

/* Gives a partition up at once (a stopping relay), when still held. */
int stream_store_release(stream_store *s, const struct stream_partition *p,
                         struct outbox_error *err);

/*
 * Reads up to limit rows after p's cursor, of transactions older than the
 * oldest one running; nothing while the queue is paused. The batch is
 * freed by stream_batch_release_memory.
 */
int stream_store_read(stream_store *s, const struct stream_partition *p, int limit,
                      struct stream_batch *batch, struct outbox_error *err);

/*
 * The same read in two steps, so that the caller can publish one batch
 * while the database reads the next: _send starts reading up to limit rows
 * of p after (after_xid, after_job_id), _receive waits for them. No other
 * call may use the store in between.
 */
int stream_store_read_send(stream_store *s, const struct stream_partition *p,
                           const char *after_xid, int64_t after_job_id, int limit,
                           struct outbox_error *err);
int stream_store_read_receive(stream_store *s, struct stream_batch *batch,
                              struct outbox_error *err);
void stream_batch_release_memory(struct stream_batch *batch);

/*
 * *later: p holds a row of ordering key key after (xid, job_id), in the
 * stream still, published or not (a refused row of that key keeps its
 * place when the partition blocks on a dead head).
 */
int stream_store_key_has_later(stream_store *s, const struct stream_partition *p, const char *xid,
                               int64_t job_id, const char *key, bool *later,
                               struct outbox_error *err);

/*
 * *held: the database holds the row at place (STREAM_PLACE_SIZE - 1 digits,
 * as stream_place_format writes it) with identity uid (its message_uid as
 * text), or any row at that place when uid is "" (a broker record naming
 * none). For a broker's order record, which must name a row of this
 * database's history to be believed.
 */
int stream_store_row_held(stream_store *s, const char *place, const char *uid, bool *held,
                          struct outbox_error *err);

/*
 * The same on conn, a connection that runs no statement of its own now (the
 * claims' between two turns, whose rows a disabled stream handed back ask
 * it): the statement is sent unprepared, bounded as a borrowed store's.
 */
int stream_row_held(PGconn *conn, const char *place, const char *uid, bool *held,
                    struct outbox_error *err);

/*
 * In one statement: moves p's cursor to (xid, job_id), extends the lease,
 * and writes the refused rows (see struct stream_refusal). Nothing is
 * written unless the lease is still held; *held tells. On success p's
 * cursor is updated in memory too.
 */
int stream_store_advance(stream_store *s, struct stream_partition *p, const char *xid,
                         int64_t job_id, const struct stream_refusal *refused, size_t count,
                         double lease_seconds, bool *held, struct outbox_error *err);

/*
 * Every partition's lag, ordered by queue and partition. *out is
 * allocated (free() it), *count its length.
 */
int stream_store_lag(stream_store *s, struct stream_lag **out, size_t *count,
                     struct outbox_error *err);

/* The transaction at the horizon (found false when none holds one). */
int stream_store_horizon(stream_store *s, struct stream_horizon *out, struct outbox_error *err);

/*
 * Deletes up to limit stream rows behind their partition's cursor and
 * older than retention_seconds; *deleted says how many.
 */
int stream_store_cleanup(stream_store *s, double retention_seconds, int limit, size_t *deleted,
                         struct outbox_error *err);

/*
 * Deletes up to limit rows of outbox.stream_key (migration 014) below the
 * horizon, which no row can be placed after any more; *deleted says how many.
 */
int stream_store_key_cleanup(stream_store *s, int limit, size_t *deleted,
                             struct outbox_error *err);

#endif
