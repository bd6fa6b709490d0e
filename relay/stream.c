/*
 * stream.c - the stream pipeline thread: acquire partitions, read, publish, advance.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "buffer.h"
#include "clock.h"
#include "error.h"
#include "job_message.h"
#include "log.h"
#include "metrics.h"
#include "sink.h"
#include "store_stream.h"
#include "stream.h"

/* Partitions one relay may hold at once. */
#define STREAM_MAX_PARTITIONS 256
/* Leases are renewed, and free partitions looked for, this often (fraction of the lease). */
#define STREAM_RENEW_FRACTION 3.0
/* Lag is looked at this often; a partition lags when its oldest unpublished row is
 * older than --horizon-warning (STREAM_LAG_WARNING_SECONDS when that is 0). */
#define STREAM_REPORT_SECONDS 5.0
#define STREAM_LAG_WARNING_SECONDS 60.0
/* Published rows are deleted this often, at most STREAM_CLEANUP_ROWS a statement. */
#define STREAM_CLEANUP_SECONDS 5.0
#define STREAM_CLEANUP_ROWS 5000
/* Idle waits: doubled from 1 ms up to this while rows came lately, else --poll-interval. */
#define STREAM_BUSY_POLL_MAX_MS 20
#define STREAM_BUSY_WINDOW_SECONDS 2.0
/* After a failed database call, the thread waits this long before it connects again. */
#define STREAM_RETRY_MS 1000
/* Batches one partition publishes in a row before the thread turns to its others. */
#define STREAM_TURN_BATCHES 8
/* Until a stream queue is found, the threads look at the runner's flag this often. */
#define STREAM_CHECK_WAIT_MS 10
/* After a broker outage deferred a batch, the partition waits this long. */
#define STREAM_DEFER_SECONDS 1.0

/* A held partition and when it may be read again (a row waiting out its backoff). */
struct owned {
    struct stream_partition p;
    double wait_until;
};

/*
 * One stream thread: its own database and broker connections, and the
 * partitions p with p % worker_count == index, so the threads of a relay
 * publish side by side under the relay's one owner name.
 */
struct stream_worker {
    stream_runner *runner;
    const struct relay_config *config;
    const char *owner;
    int index;
    pthread_t thread;
    bool started;
    stream_store *store;
    struct store_identity identity; /* the database's, read when store connected */
    sink *sink;
    struct owned owned[STREAM_MAX_PARTITIONS];
    size_t owned_count;
    double lease_seconds;
    char *queues; /* --queues as a text[] literal; NULL: every stream */
    double next_renew, next_report, next_cleanup;
    bool reload_cursors; /* a new connection: the next renewal reads the held cursors again */
    unsigned int seed;
    struct sink_message *messages;
    char (*places)[STREAM_PLACE_SIZE]; /* each message's place.at */
    char floor[STREAM_PLACE_SIZE];     /* the cursor as a place */
    struct sink_outcome *outcomes;
    struct stream_refusal *refusals;
    double *lags; /* commit-to-publish seconds of accepted rows */
};

struct stream_runner {
    const struct relay_config *config;
    struct metrics *metrics;
    char owner[192];
    atomic_int stopping;
    atomic_int checked;      /* stream_runner_check ran once (or never will) */
    atomic_int streams_seen; /* ... and found a stream queue: the threads connect */
    struct stream_worker *workers; /* worker_count publishing threads, then the watch thread */
    int worker_count;
};

/* ---- helpers ------------------------------------------------------------------- */

static bool
runner_stopping(const struct stream_worker *sr)
{
    return atomic_load(&sr->runner->stopping) != 0;
}

static void
runner_sleep_ms(struct stream_worker *sr, int ms)
{
    while (ms > 0 && !runner_stopping(sr)) {
        int slice = ms < 50 ? ms : 50;

        usleep((useconds_t)slice * 1000);
        ms -= slice;
    }
}

/*
 * Drops the database connection after a failure. The partitions stay held
 * in memory: after the reconnect their leases are renewed first (fenced, so
 * one that expired meanwhile is dropped) and their cursors read again (the
 * database may be a promoted standby by then, behind what this thread
 * published), and publishing goes on from them without waiting out a lease.
 */
static void
store_lost(struct stream_worker *sr, const struct outbox_error *err)
{
    log_event(OUTBOX_LOG_WARN, "stream database call failed", "thread=stream error=\"%s\"",
              err->message);
    stream_store_free(sr->store);
    sr->store = NULL;
    runner_sleep_ms(sr, STREAM_RETRY_MS); /* an error that stays must not spin */
}

/*
 * A notice of the stream connection (a user's trigger warning, the FATAL
 * sent at a server's shutdown) as a log event of the thread, rate-limited
 * as the pipelines' are, never a raw line on stderr.
 */
static void
log_stream_notice(void *arg, const char *message)
{
    const struct stream_worker *sr = arg;
    size_t len = strlen(message);

    while (len > 0 && (message[len - 1] == '\n' || message[len - 1] == ' '))
        len--;
    log_event_limited("database-notice", OUTBOX_LOG_WARN, "database notice",
                      "thread=stream index=%d notice=\"%.*s\"", sr->index, (int)len, message);
}

/* Connects what is missing; false when it could not (the caller waits and retries). */
static bool
stream_connect_ends(struct stream_worker *sr)
{
    struct outbox_error err;

    if (sr->store == NULL) {
        sr->store = stream_store_connect(sr->config->database_url, sr->owner, &err);
        if (sr->store == NULL) {
            log_event(OUTBOX_LOG_WARN, "stream database connection failed",
                      "thread=stream error=\"%s\"", err.message);
            return false;
        }
        stream_store_set_notice_processor(sr->store, log_stream_notice, sr);
        if (store_identity_observe(stream_store_conn(sr->store), &sr->identity, &err) != 0) {
            store_lost(sr, &err);
            return false;
        }
        sr->next_renew = 0;
        sr->reload_cursors = true;
    }
    /* no broker connection while there is nothing to publish */
    if (sr->owned_count > 0 && !sink_is_connected(sr->sink) && sink_connect(sr->sink, &err) != 0) {
        log_event(OUTBOX_LOG_WARN, "stream broker connection failed", "thread=stream error=\"%s\"",
                  err.message);
        return false;
    }
    return true;
}

static void
drop_owned(struct stream_worker *sr, size_t index, const char *why)
{
    log_event(OUTBOX_LOG_INFO, why, "thread=stream queue=%s partition=%d generation=%lld",
              sr->owned[index].p.queue, sr->owned[index].p.partition,
              (long long)sr->owned[index].p.generation);
    sr->owned[index] = sr->owned[sr->owned_count - 1];
    sr->owned_count--;
}

/* ---- leases -------------------------------------------------------------------- */

/*
 * Gives back the partitions of this thread that this relay holds over its
 * fair share and another relay would take, between batches.
 */
static int
give_back_surplus(struct stream_worker *sr, struct outbox_error *err)
{
    struct stream_partition held[STREAM_MAX_PARTITIONS];
    bool give_back[STREAM_MAX_PARTITIONS];
    size_t count = sr->owned_count;

    if (count == 0)
        return 0;
    for (size_t i = 0; i < count; i++)
        held[i] = sr->owned[i].p;
    if (stream_store_surplus(sr->store, held, count, give_back, err) != 0)
        return -1;
    for (size_t i = count; i-- > 0;) {
        if (!give_back[i])
            continue;
        if (stream_store_release(sr->store, &sr->owned[i].p, err) != 0)
            return -1;
        drop_owned(sr, i, "stream partition given back to another relay");
    }
    return 0;
}

/*
 * Brings held partition index onto the connection's history: a cursor of
 * another epoch, or ahead of the transaction ids, is rebased (rows that may
 * be unpublished go out again, none is lost). Drops the partition when its
 * lease was lost, or when its cursor is of a later history than the
 * database's (logged: its rows wait, counted by stream list). -1 only for a
 * failed database call.
 */
static int
settle_history(struct stream_worker *sr, size_t index, bool *kept, struct outbox_error *err)
{
    struct stream_partition *p = &sr->owned[index].p;
    int32_t was = p->history_epoch;
    bool held = false;

    *kept = true;
    if (p->history_epoch == sr->identity.epoch && !p->ahead)
        return 0;
    if (stream_store_rebase(sr->store, p, sr->identity.epoch, &held, err) != 0) {
        if (err->code != OUTBOX_ERR_STATE)
            return -1;
        log_event(OUTBOX_LOG_ERROR, "stream partition not published", "thread=stream error=\"%s\"",
                  err->message);
        if (stream_store_release(sr->store, p, err) != 0)
            return -1;
        held = false;
    } else if (held) {
        log_event(OUTBOX_LOG_WARN, "stream partition rebased onto a new database history",
                  "thread=stream queue=%s partition=%d epoch=%d->%d", p->queue, p->partition,
                  (int)was, (int)p->history_epoch);
    }
    if (!held) {
        drop_owned(sr, index, "stream partition dropped");
        *kept = false;
    }
    return 0;
}

/*
 * Says this relay is there, renews every held lease (reading the cursors
 * again after a reconnect), forgets lost ones, gives back a surplus, then
 * takes free partitions up to the fair share; every partition kept is on
 * the connection's history before it is read.
 */
static int
leases_turn(struct stream_worker *sr, struct outbox_error *err)
{
    struct stream_partition taken[STREAM_MAX_PARTITIONS];
    size_t count = 0;

    if (stream_store_member(sr->store, sr->queues, sr->lease_seconds, err) != 0)
        return -1;
    for (size_t i = 0; i < sr->owned_count;) {
        bool held = false;

        if (stream_store_renew(sr->store, &sr->owned[i].p, sr->lease_seconds, sr->reload_cursors,
                               &held, err) != 0)
            return -1;
        if (!held) {
            drop_owned(sr, i, "stream partition lease lost");
            continue;
        }
        if (settle_history(sr, i, &held, err) != 0)
            return -1;
        i += held;
    }
    sr->reload_cursors = false;
    if (give_back_surplus(sr, err) != 0)
        return -1;
    if (stream_store_acquire(sr->store, sr->queues, sr->runner->worker_count, sr->index,
                             sr->lease_seconds, taken, STREAM_MAX_PARTITIONS - sr->owned_count,
                             &count, err) != 0)
        return -1;
    for (size_t i = 0; i < count; i++) {
        bool kept;

        sr->owned[sr->owned_count].p = taken[i];
        sr->owned[sr->owned_count].wait_until = 0;
        sr->owned_count++;
        log_event(OUTBOX_LOG_INFO, "stream partition acquired",
                  "thread=stream queue=%s partition=%d generation=%lld cursor=%s/%lld",
                  taken[i].queue, taken[i].partition, (long long)taken[i].generation,
                  taken[i].cursor_xid, (long long)taken[i].cursor_job_id);
        if (settle_history(sr, sr->owned_count - 1, &kept, err) != 0)
            return -1;
    }
    sr->next_renew = clock_monotonic_seconds() + sr->lease_seconds / STREAM_RENEW_FRACTION;
    return 0;
}

/* ---- one partition's turn ------------------------------------------------------ */

/*
 * The messages of a batch of o, each with its place in o's order; the
 * floor is o's cursor, behind which every row is published or gone. A row
 * `stream enable` took from the claims may have been published before
 * without a record of this order: it goes out of turn, judged by the order
 * it left (its place there is the same) or, when it had none, by its dedup
 * record alone. It is never judged by this order's record again (a disable
 * gives it its former place back), so the rows after it may still go in
 * turn past it.
 */
static void
build_messages(struct stream_worker *sr, const struct owned *o, const struct stream_batch *batch)
{
    const char *order = o->p.order[0] != '\0' ? o->p.order : NULL;
    bool floor = stream_place_format(sr->floor, o->p.cursor_xid, o->p.cursor_job_id);

    for (size_t i = 0; i < batch->count; i++) {
        const char *from = batch->froms[i];

        sr->messages[i] = job_message_from_job(&batch->jobs[i], &sr->identity);
        sr->places[i][0] = '\0';
        if (order == NULL ||
            !stream_place_format(sr->places[i], batch->xids[i], batch->jobs[i].job_id))
            continue;
        if (from != NULL) {
            sr->messages[i].place.order = from[0] != '\0' ? from : NULL;
            sr->messages[i].place.at = from[0] != '\0' ? sr->places[i] : NULL;
            continue;
        }
        sr->messages[i].place.order = order;
        sr->messages[i].place.at = sr->places[i];
        sr->messages[i].place.floor = floor ? sr->floor : NULL;
    }
}

/* True when a row after index in the batch has the same ordering key. */
static bool
key_has_later_row(const struct stream_batch *batch, size_t index)
{
    const char *key = batch->jobs[index].ordering_key;

    if (key == NULL)
        return false;
    for (size_t i = index + 1; i < batch->count; i++)
        if (batch->jobs[i].ordering_key != NULL && strcmp(batch->jobs[i].ordering_key, key) == 0)
            return true;
    return false;
}

/*
 * Whether refused row index of batch keeps its place in the partition:
 * with --ordering-dead-policy block, when a later row of its key waits,
 * in this batch or after it.
 */
static int
refused_row_stays(struct stream_worker *sr, const struct owned *o,
                  const struct stream_batch *batch, size_t index, bool *stay,
                  struct outbox_error *err)
{
    const struct outbox_job *job = &batch->jobs[index];

    *stay = false;
    if (!sr->config->block_on_dead_head || job->ordering_key == NULL)
        return 0;
    *stay = key_has_later_row(batch, index);
    if (*stay)
        return 0;
    return stream_store_key_has_later(sr->store, &o->p, batch->xids[index], job->job_id,
                                      job->ordering_key, stay, err);
}

/*
 * Sorts the outcomes of the published rows (a prefix of the batch), in row
 * order, into how far the cursor may go (*passed rows) and the refused
 * rows. The cursor passes accepted rows and rows leaving the stream; it
 * stops before a deferred row and before a refused row that keeps its place.
 */
static int
settle_outcomes(struct stream_worker *sr, struct owned *o, const struct stream_batch *batch,
                size_t published, size_t *passed, size_t *refused, struct outbox_error *err)
{
    const struct relay_config *c = sr->config;

    *passed = 0;
    *refused = 0;
    for (size_t i = 0; i < published; i++) {
        const struct sink_outcome *out = &sr->outcomes[i];
        struct stream_refusal *r = &sr->refusals[*refused];
        double random01 = (double)rand_r(&sr->seed) / ((double)RAND_MAX + 1.0);
        bool stay = false;

        if (out->status == SINK_ACCEPTED) {
            *passed = i + 1;
            continue;
        }
        if (out->status == SINK_DEFERRED) {
            o->wait_until = clock_monotonic_seconds() + STREAM_DEFER_SECONDS;
            break;
        }
        if (refused_row_stays(sr, o, batch, i, &stay, err) != 0)
            return -1;
        *r = (struct stream_refusal){
            .job_id = batch->jobs[i].job_id,
            .error = out->reason,
            .permanent = out->status == SINK_REJECTED,
            .stay = stay,
            .delay_seconds = outbox_backoff_seconds(batch->jobs[i].generation, c->retry_base_seconds,
                                                    c->retry_max_seconds, random01),
        };
        (*refused)++;
        if (r->stay && !r->permanent && batch->jobs[i].generation < batch->jobs[i].max_attempts) {
            o->wait_until = clock_monotonic_seconds() + r->delay_seconds;
            break;
        }
        *passed = i + 1;
    }
    return 0;
}

/* True when rows [start, end) hold a row of the ordering key of row end. */
static bool
chunk_has_key(const struct stream_batch *batch, size_t start, size_t end)
{
    const char *key = batch->jobs[end].ordering_key;

    for (size_t i = start; key != NULL && i < end; i++)
        if (batch->jobs[i].ordering_key != NULL && strcmp(batch->jobs[i].ordering_key, key) == 0)
            return true;
    return false;
}

/*
 * Publishes the batch; returns how many rows (a prefix) were handed to the
 * broker. With --ordering-dead-policy block the batch goes out in chunks
 * holding one row per ordering key, and a chunk with a row not accepted is
 * the last: a key's next row is never published past an earlier row of the
 * key the broker did not take.
 */
static size_t
publish_rows(struct stream_worker *sr, const struct owned *o, const struct stream_batch *batch,
             struct outbox_error *err)
{
    size_t start = 0;

    while (start < batch->count) {
        size_t end = start + 1;
        bool all_accepted = true;

        if (!sr->config->block_on_dead_head)
            end = batch->count;
        while (end < batch->count && !chunk_has_key(batch, start, end))
            end++;
        if (start > 0 && sr->places[start - 1][0] != '\0') /* the chunks before were accepted */
            for (size_t i = start; i < end; i++)
                if (sr->messages[i].place.order != NULL && batch->froms[i] == NULL)
                    sr->messages[i].place.floor = sr->places[start - 1];
        if (sink_publish(sr->sink, sr->messages + start, end - start, sr->outcomes + start, err) != 0)
            log_event(OUTBOX_LOG_WARN, "stream publish failed",
                      "thread=stream queue=%s error=\"%s\"", o->p.queue, err->message);
        for (size_t i = start; i < end; i++)
            all_accepted = all_accepted && sr->outcomes[i].status == SINK_ACCEPTED;
        start = end;
        if (!all_accepted)
            break;
    }
    return start;
}

/* Counts a recorded batch in the metrics the row-state pipelines feed too. */
static void
record_metrics(struct stream_worker *sr, const struct owned *o, const struct stream_batch *batch,
               size_t published, size_t refused)
{
    struct metrics *m = sr->runner->metrics;
    struct timespec ts;
    double now;
    size_t accepted = 0, dead = 0;

    clock_gettime(CLOCK_REALTIME, &ts);
    now = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
    for (size_t i = 0; i < published; i++)
        if (sr->outcomes[i].status == SINK_ACCEPTED && batch->jobs[i].created_at > 0)
            sr->lags[accepted++] = now - batch->jobs[i].created_at;
    for (size_t i = 0; i < refused; i++) {
        const struct outbox_job *job = NULL;

        for (size_t j = 0; j < published && job == NULL; j++)
            if (batch->jobs[j].job_id == sr->refusals[i].job_id)
                job = &batch->jobs[j];
        if (sr->refusals[i].permanent || (job != NULL && job->generation >= job->max_attempts))
            dead++;
    }
    metrics_add_queue(m, METRICS_ROWS_PUBLISHED, o->p.queue, accepted);
    metrics_add_queue(m, METRICS_ROWS_FAILED, o->p.queue, refused - dead);
    metrics_add_queue(m, METRICS_ROWS_DEAD, o->p.queue, dead);
    metrics_observe_many(m, METRICS_COMMIT_TO_PUBLISH, sr->lags, accepted);
}

/*
 * Moves o's cursor past the rows of batch the broker took (passed) and
 * writes the refused ones; *held false: the lease was lost and o dropped.
 */
static int
advance_cursor(struct stream_worker *sr, size_t index, const struct stream_batch *batch,
               size_t published, size_t passed, size_t refused, bool *held,
               struct outbox_error *err)
{
    struct owned *o = &sr->owned[index];
    const char *xid = passed > 0 ? batch->xids[passed - 1] : o->p.cursor_xid;
    int64_t job_id = passed > 0 ? batch->jobs[passed - 1].job_id : o->p.cursor_job_id;
    char xid_copy[STREAM_XID_MAX];

    *held = true;
    if (passed == 0 && refused == 0)
        return 0;
    snprintf(xid_copy, sizeof(xid_copy), "%s", xid);
    if (stream_store_advance(sr->store, &o->p, xid_copy, job_id, sr->refusals, refused,
                             sr->lease_seconds, held, err) != 0)
        return -1;
    if (!*held) {
        drop_owned(sr, index, "stream partition lease lost");
        return 0;
    }
    record_metrics(sr, o, batch, published, refused);
    if (refused > 0)
        log_event(OUTBOX_LOG_WARN, "stream rows refused by the broker",
                  "thread=stream queue=%s partition=%d rows=%zu first_job=%lld reason=\"%s\"",
                  o->p.queue, o->p.partition, refused, (long long)sr->refusals[0].job_id,
                  sr->refusals[0].error);
    return 0;
}

/*
 * Publishes one batch of partition index and moves its cursor. When the
 * batch is full, the next one is read while this one is with the broker
 * (*next, empty when there was none to read); *more tells whether the
 * partition may go on with it: every row of this batch passed and the
 * lease held.
 */
static int
batch_turn(struct stream_worker *sr, size_t index, const struct stream_batch *batch,
           struct stream_batch *next, bool *more, struct outbox_error *err)
{
    struct owned *o = &sr->owned[index];
    size_t published, passed, refused = 0;
    bool prefetch = batch->count == (size_t)sr->config->batch_size, held = false;

    *more = false;
    memset(next, 0, sizeof(*next));
    build_messages(sr, o, batch);
    if (prefetch && stream_store_read_send(sr->store, &o->p, batch->xids[batch->count - 1],
                                           batch->jobs[batch->count - 1].job_id,
                                           sr->config->batch_size, err) != 0)
        return -1;
    published = publish_rows(sr, o, batch, err); /* rows after it are read again */
    if (sink_is_connected(sr->sink))
        metrics_round_trip(sr->runner->metrics, METRICS_BROKER);
    if (prefetch && stream_store_read_receive(sr->store, next, err) != 0)
        return -1;
    if (settle_outcomes(sr, o, batch, published, &passed, &refused, err) != 0)
        return -1;
    if (advance_cursor(sr, index, batch, published, passed, refused, &held, err) != 0)
        return -1;
    *more = held && passed == batch->count && next->count > 0;
    return 0;
}

/*
 * A partition's turn: up to STREAM_TURN_BATCHES batches read, published
 * and recorded, each read while the one before is published. *rows: rows read.
 */
static int
partition_turn(struct stream_worker *sr, size_t index, size_t *rows, struct outbox_error *err)
{
    struct stream_batch batch, next;
    bool more = true;
    int rc = 0;

    *rows = 0;
    if (stream_store_read(sr->store, &sr->owned[index].p, sr->config->batch_size, &batch, err) !=
        0)
        return -1;
    metrics_round_trip(sr->runner->metrics, METRICS_DATABASE);
    for (int turn = 0; batch.count > 0 && more; turn++) {
        *rows += batch.count;
        rc = batch_turn(sr, index, &batch, &next, &more, err);
        stream_batch_release_memory(&batch);
        batch = next;
        more = more && rc == 0 && turn + 1 < STREAM_TURN_BATCHES && !runner_stopping(sr) &&
               sink_is_connected(sr->sink);
    }
    stream_batch_release_memory(&batch);
    return rc;
}

/* ---- between turns --------------------------------------------------------------- */

/* Hands the lag of every partition and the horizon to the stream gauges. */
static void
lag_metrics(struct stream_worker *sr, const struct stream_lag *lag, size_t count,
            const struct stream_horizon *horizon)
{
    struct metrics_stream_partition *partitions = calloc(count > 0 ? count : 1,
                                                         sizeof(*partitions));
    struct metrics_stream_horizon h = {.found = horizon->found,
                                       .pid = horizon->pid,
                                       .prepared = horizon->prepared[0] != '\0',
                                       .age_seconds = horizon->seconds};

    if (partitions == NULL)
        return; /* the gauges keep the last sample */
    for (size_t i = 0; i < count; i++)
        partitions[i] = (struct metrics_stream_partition){
            .queue = lag[i].queue,
            .partition = lag[i].partition,
            .owner = lag[i].owner,
            .lag_rows = lag[i].rows,
            .lag_seconds = lag[i].seconds,
        };
    metrics_set_stream_sample(sr->runner->metrics, partitions, count, &h);
    free(partitions);
}

/*
 * Samples the lag of every partition and the transaction holding the
 * horizon for the gauges; logs lagging partitions and, when one lags, that
 * transaction.
 */
static int
report_lag(struct stream_worker *sr, struct outbox_error *err)
{
    struct stream_lag *lag = NULL;
    struct stream_horizon horizon;
    size_t count = 0;
    bool lagging = false;
    double threshold = sr->config->horizon_warning_seconds > 0 ? sr->config->horizon_warning_seconds
                                                                : STREAM_LAG_WARNING_SECONDS;

    sr->next_report = clock_monotonic_seconds() + STREAM_REPORT_SECONDS;
    if (stream_store_lag(sr->store, &lag, &count, err) != 0)
        return -1;
    if (stream_store_horizon(sr->store, &horizon, err) != 0) {
        free(lag);
        return -1;
    }
    lag_metrics(sr, lag, count, &horizon);
    for (size_t i = 0; i < count; i++) {
        if (lag[i].seconds < threshold)
            continue;
        lagging = true;
        log_event(OUTBOX_LOG_WARN, "stream partition lags",
                  "queue=%s partition=%d rows=%lld seconds=%.1f owner=%s", lag[i].queue,
                  lag[i].partition, (long long)lag[i].rows, lag[i].seconds,
                  lag[i].owner[0] != '\0' ? lag[i].owner : "none");
    }
    free(lag);
    if (lagging && horizon.found && horizon.prepared[0] != '\0')
        log_event(OUTBOX_LOG_WARN, "a prepared transaction holds the stream horizon",
                  "gid=\"%s\" owner=%s database=%s seconds=%.1f"
                  " hint=\"end it with COMMIT PREPARED or ROLLBACK PREPARED of that gid\"",
                  horizon.prepared, horizon.user, horizon.database, horizon.seconds);
    else if (lagging && horizon.found)
        log_event(OUTBOX_LOG_WARN, "a transaction holds the stream horizon",
                  "pid=%d seconds=%.1f user=%s database=%s application=\"%s\" query=\"%s\"",
                  horizon.pid, horizon.seconds, horizon.user, horizon.database,
                  horizon.application, horizon.query);
    return 0;
}

/*
 * Deletes the places of ordering keys below the horizon and, with a
 * --retention, published rows older than it, STREAM_CLEANUP_ROWS a
 * statement (each its own short transaction); again right after the next
 * report while a statement found a full batch.
 */
static int
cleanup_turn(struct stream_worker *sr, struct outbox_error *err)
{
    size_t rows = 0, keys = 0;

    sr->next_cleanup = clock_monotonic_seconds() + STREAM_CLEANUP_SECONDS;
    if (stream_store_key_cleanup(sr->store, STREAM_CLEANUP_ROWS, &keys, err) != 0)
        return -1;
    if (sr->config->retention_seconds > 0 &&
        stream_store_cleanup(sr->store, sr->config->retention_seconds, STREAM_CLEANUP_ROWS, &rows,
                             err) != 0)
        return -1;
    if (rows == STREAM_CLEANUP_ROWS || keys == STREAM_CLEANUP_ROWS)
        sr->next_cleanup = 0; /* more to delete */
    return 0;
}

/* The lease work that is due; -1 with err when the database failed. */
static int
due_work(struct stream_worker *sr, struct outbox_error *err)
{
    if (clock_monotonic_seconds() >= sr->next_renew && leases_turn(sr, err) != 0)
        return -1;
    return 0;
}

/* One pass over the held partitions; *rows: rows read in all. */
static int
partitions_pass(struct stream_worker *sr, size_t *rows, struct outbox_error *err)
{
    double now = clock_monotonic_seconds();

    *rows = 0;
    for (size_t i = 0; i < sr->owned_count && !runner_stopping(sr); i++) {
        size_t read = 0;

        if (sr->owned[i].wait_until > now)
            continue;
        if (partition_turn(sr, i, &read, err) != 0)
            return -1;
        *rows += read;
        if (!sink_is_connected(sr->sink))
            break;
    }
    return 0;
}

/*
 * True once a stream queue exists (stream_runner_check found one). Until
 * then the thread waits without a connection; false when it should return
 * instead (stopping, or --once and the check found none).
 */
static bool
wait_for_streams(struct stream_worker *sr)
{
    stream_runner *runner = sr->runner;

    while (!atomic_load(&runner->streams_seen)) {
        if (runner_stopping(sr))
            return false;
        if (sr->config->once && atomic_load(&runner->checked))
            return false;
        runner_sleep_ms(sr, STREAM_CHECK_WAIT_MS); /* a flag: waiting costs nothing */
    }
    return !runner_stopping(sr);
}

/* Gives every lease back so that another relay takes over at once. */
static void
release_all(struct stream_worker *sr)
{
    struct outbox_error err;

    for (size_t i = 0; sr->store != NULL && i < sr->owned_count; i++)
        if (stream_store_release(sr->store, &sr->owned[i].p, &err) != 0)
            break;
    if (sr->store != NULL)
        (void)stream_store_leave(sr->store, &err); /* else it expires after a lease */
    sr->owned_count = 0;
}

/*
 * The watch thread: the lag report and the cleanup on a connection of
 * their own, so that neither holds up a partition's publishing (the lag
 * count of a long backlog takes a while). With --once it runs them once.
 */
static void *
watch_run(void *arg)
{
    struct stream_worker *sr = arg;

    if (!wait_for_streams(sr))
        goto done;
    while (!runner_stopping(sr)) {
        struct outbox_error err;
        double now = clock_monotonic_seconds(), next;

        if (!stream_connect_ends(sr)) {
            if (sr->config->once)
                break;
            runner_sleep_ms(sr, STREAM_RETRY_MS);
            continue;
        }
        if ((now >= sr->next_report && report_lag(sr, &err) != 0) ||
            (now >= sr->next_cleanup && cleanup_turn(sr, &err) != 0)) {
            store_lost(sr, &err);
            continue;
        }
        if (sr->config->once)
            break;
        next = sr->next_report < sr->next_cleanup ? sr->next_report : sr->next_cleanup;
        now = clock_monotonic_seconds();
        if (next > now)
            runner_sleep_ms(sr, (int)((next - now) * 1000) + 1);
    }
done:
    stream_store_free(sr->store);
    sr->store = NULL;
    return NULL;
}

static void *
stream_run(void *arg)
{
    struct stream_worker *sr = arg;
    const struct relay_config *c = sr->config;
    int idle_ms = 0;
    double last_work = 0;

    if (!wait_for_streams(sr))
        goto done;
    while (!runner_stopping(sr)) {
        struct outbox_error err;
        size_t rows = 0;

        if (!stream_connect_ends(sr)) {
            if (c->once)
                break;
            runner_sleep_ms(sr, 1000);
            continue;
        }
        if (due_work(sr, &err) != 0) {
            store_lost(sr, &err);
            continue;
        }
        if (!stream_connect_ends(sr)) /* the broker, for partitions just taken */
            continue;
        if (partitions_pass(sr, &rows, &err) != 0) {
            store_lost(sr, &err);
            continue;
        }
        if (rows > 0) {
            idle_ms = 0;
            last_work = clock_monotonic_seconds();
            continue;
        }
        if (c->once)
            break;
        idle_ms = idle_ms == 0 ? 1 : idle_ms * 2;
        if (clock_monotonic_seconds() - last_work < STREAM_BUSY_WINDOW_SECONDS &&
            idle_ms > STREAM_BUSY_POLL_MAX_MS)
            idle_ms = STREAM_BUSY_POLL_MAX_MS;
        if (idle_ms > c->poll_interval_ms)
            idle_ms = c->poll_interval_ms;
        runner_sleep_ms(sr, idle_ms);
    }
done:
    release_all(sr);
    sink_disconnect(sr->sink);
    stream_store_free(sr->store);
    sr->store = NULL;
    return NULL;
}

/* ---- lifecycle ------------------------------------------------------------------- */

/* --queues as a text[] literal (queue names need no quoting: A-Z a-z 0-9 . _ : -). */
static int
queues_literal(struct stream_worker *sr, const struct relay_config *config)
{
    struct buffer b = {0};

    if (config->queue_count == 0)
        return 0;
    buffer_putc(&b, '{');
    for (size_t i = 0; i < config->queue_count; i++) {
        if (i > 0)
            buffer_putc(&b, ',');
        buffer_printf(&b, "\"%s\"", config->queues[i]);
    }
    buffer_putc(&b, '}');
    if (b.failed) {
        buffer_clear(&b);
        return -1;
    }
    sr->queues = b.data;
    return 0;
}

static int
worker_init(stream_runner *runner, struct stream_worker *sr, int index, struct outbox_error *err)
{
    const struct relay_config *config = runner->config;
    size_t n = (size_t)config->batch_size;

    sr->runner = runner;
    sr->config = config;
    sr->owner = runner->owner;
    sr->index = index;
    sr->lease_seconds = config->lease_seconds;
    sr->seed = (unsigned int)getpid() ^ (unsigned int)time(NULL) ^ (unsigned int)(index * 7919);
    if (index == runner->worker_count)
        return 0; /* the watch thread: no broker, no batches */
    sr->sink = config_sink_new(config, err);
    if (sr->sink == NULL)
        return -1;
    sr->messages = calloc(n, sizeof(*sr->messages));
    sr->places = calloc(n, sizeof(*sr->places));
    sr->outcomes = calloc(n, sizeof(*sr->outcomes));
    sr->refusals = calloc(n, sizeof(*sr->refusals));
    sr->lags = calloc(n, sizeof(*sr->lags));
    if (sr->messages == NULL || sr->places == NULL || sr->outcomes == NULL ||
        sr->refusals == NULL || sr->lags == NULL || queues_literal(sr, config) != 0)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    return 0;
}

static void
worker_clear(struct stream_worker *sr)
{
    sink_free(sr->sink);
    stream_store_free(sr->store);
    free(sr->messages);
    free(sr->places);
    free(sr->outcomes);
    free(sr->refusals);
    free(sr->lags);
    free(sr->queues);
}

stream_runner *
stream_runner_new(const struct relay_config *config, const char *worker_prefix, struct metrics *m,
                  struct outbox_error *err)
{
    stream_runner *runner = calloc(1, sizeof(*runner));

    if (runner == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        return NULL;
    }
    runner->config = config;
    runner->metrics = m;
    snprintf(runner->owner, sizeof(runner->owner), "%s/stream", worker_prefix);
    runner->worker_count = config->concurrency > 0 ? config->concurrency : 1;
    runner->workers = calloc((size_t)runner->worker_count + 1, sizeof(*runner->workers));
    if (runner->workers == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        goto fail;
    }
    for (int i = 0; i <= runner->worker_count; i++)
        if (worker_init(runner, &runner->workers[i], i, err) != 0)
            goto fail;
    return runner;

fail:
    stream_runner_free(runner);
    return NULL;
}

void
stream_runner_free(stream_runner *runner)
{
    if (runner == NULL)
        return;
    for (int i = 0; runner->workers != NULL && i <= runner->worker_count; i++)
        worker_clear(&runner->workers[i]);
    free(runner->workers);
    free(runner);
}

int
stream_runner_start(stream_runner *runner, struct outbox_error *err)
{
    for (int i = 0; i <= runner->worker_count; i++) {
        struct stream_worker *sr = &runner->workers[i];

        if (pthread_create(&sr->thread, NULL, i < runner->worker_count ? stream_run : watch_run,
                           sr) != 0) {
            stream_runner_stop(runner);
            return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "unable to start stream thread %d",
                                    i);
        }
        sr->started = true;
    }
    return 0;
}

int
stream_runner_check(stream_runner *runner, PGconn *conn, struct outbox_error *err)
{
    bool exists = false;

    if (runner == NULL || atomic_load(&runner->streams_seen))
        return 0;
    if (stream_admin_exists(conn, runner->workers[0].queues, &exists, err) != 0)
        return -1;
    if (exists) {
        log_event(OUTBOX_LOG_INFO, "stream queues found: the stream threads connect",
                  "threads=%d", runner->worker_count);
        atomic_store(&runner->streams_seen, 1);
    }
    atomic_store(&runner->checked, 1);
    return 0;
}

void
stream_runner_checks_over(stream_runner *runner)
{
    if (runner != NULL)
        atomic_store(&runner->checked, 1);
}

void
stream_runner_stop(stream_runner *runner)
{
    if (runner != NULL)
        atomic_store(&runner->stopping, 1);
}

void
stream_runner_join(stream_runner *runner)
{
    for (int i = 0; runner != NULL && i <= runner->worker_count; i++) {
        if (runner->workers[i].started)
            pthread_join(runner->workers[i].thread, NULL);
        runner->workers[i].started = false;
    }
}
