/*
 * stream_partition.c - the partitions a stream thread holds: their leases
 * (renewed, given back, taken) and each one's publishing turn (read a
 * batch after the cursor, publish it, settle every row, advance).
 */
#include "stream_worker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "error.h"
#include "job_message.h"
#include "log.h"
#include "metrics.h"
#include "mutant.h"
#include "otel.h"
#include "timeouts.h"

/* Leases are renewed, and free partitions looked for, this often (fraction of the lease). */
#define STREAM_RENEW_FRACTION 3.0
/* The place's digits at the start of a broker's check; the row's identity follows. */
#define STREAM_PLACE_DIGITS_OF_CHECK (STREAM_PLACE_SIZE - 1)
/* Batches one partition publishes in a row before the thread turns to its others. */
#define STREAM_TURN_BATCHES 8
/* Times a chunk is published again with the answers to its broker's checks. */
#define STREAM_CHECK_ROUNDS 3

bool
stream_worker_stopping(const struct stream_worker *sr)
{
    return atomic_load(&sr->runner->stopping) != 0;
}

/* Forgets held partition index, logging why. */
static void
drop_owned(struct stream_worker *sr, size_t index, const char *why)
{
    log_event(OUTBOX_LOG_INFO, why, "%s queue=%s partition=%d generation=%lld", sr->who,
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
    struct stream_rebase_report report = {0};
    int32_t was = p->history_epoch;
    bool held = false;

    *kept = true;
    if (p->history_epoch == sr->identity.epoch && !p->ahead)
        return 0;
    if (stream_store_rebase(sr->store, p, sr->identity.epoch, &held, &report, err) != 0) {
        if (err->code != OUTBOX_ERR_STATE)
            return -1;
        log_event(OUTBOX_LOG_ERROR, "stream partition not published", "%s error=\"%s\"", sr->who,
                  err->message);
        if (stream_store_release(sr->store, p, err) != 0)
            return -1;
        held = false;
    } else if (held) {
        log_event(OUTBOX_LOG_WARN, "stream partition rebased onto a new database history",
                  "%s queue=%s partition=%d epoch=%d->%d places=%s keys_reset=%d key_levels=%d",
                  sr->who, p->queue, p->partition, (int)was, (int)p->history_epoch,
                  report.places_kept ? "kept" : "placed-anew", report.keys_reset, report.levels);
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
int
stream_leases_turn(struct stream_worker *sr, struct outbox_error *err)
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
    if (stream_store_acquire(sr->store, sr->queues, sr->modulus, sr->residue,
                             sr->lease_seconds, taken, STREAM_MAX_PARTITIONS - sr->owned_count,
                             &count, err) != 0)
        return -1;
    for (size_t i = 0; i < count; i++) {
        bool kept;

        sr->owned[sr->owned_count].p = taken[i];
        sr->owned[sr->owned_count].wait_until = 0;
        sr->owned_count++;
        log_event(sr->acquired_log, "stream partition acquired",
                  "%s queue=%s partition=%d generation=%lld cursor=%s/%lld", sr->who,
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
static int
build_partition_messages(struct stream_worker *sr, const struct owned *o,
                         const struct stream_batch *batch)
{
    const char *order = o->p.order[0] != '\0' ? o->p.order : NULL;
    bool floor = stream_place_format(sr->floor, o->p.cursor_xid, o->p.cursor_job_id);

    for (size_t i = 0; i < batch->count; i++) {
        const char *from = batch->froms[i];

        sr->messages[i] = job_message_from_job(&batch->jobs[i], &sr->identity);
        sr->places[i][0] = '\0';
        sr->outcomes[i].check[0] = '\0';
        if (order == NULL ||
            !stream_place_format(sr->places[i], batch->xids[i], batch->jobs[i].job_id))
            continue;
        if (from != NULL) {
            /* judged by the order it left, whose record may be of another history: checked */
            sr->messages[i].place.order = from[0] != '\0' ? from : NULL;
            sr->messages[i].place.at = from[0] != '\0' ? sr->places[i] : NULL;
            sr->messages[i].place.uid = batch->jobs[i].message_uid;
            continue;
        }
        sr->messages[i].place.order = order;
        sr->messages[i].place.at = sr->places[i];
        sr->messages[i].place.floor = floor ? sr->floor : NULL;
        sr->messages[i].place.uid = batch->jobs[i].message_uid;
    }
    sr->traced = otel_prepare(sr->otel, sr->messages, batch->count) == 0;
    cloudevents_reset(sr->cloudevents);
    for (size_t i = 0; sr->cloudevents != NULL && i < batch->count; i++)
        if (cloudevents_apply(sr->cloudevents, sink_cloudevents_prefix(sr->sink), &sr->identity,
                              &sr->messages[i]) != 0)
            return -1;
    return 0;
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

/*
 * Answers the checks the broker asked for in the first published messages:
 * whether the database holds the row the partition's order record names (a
 * record of another history - a crash lost commits it had appended, a
 * restore to an earlier point - is dropped, said once). True when any was
 * answered, so the batch goes out again; a failed look-up leaves the rows
 * deferred. The store must be idle (no read ahead in flight).
 */
static bool
answer_checks(struct stream_worker *sr, const struct owned *o, size_t published)
{
    size_t last = 0; /* 1 + the message answered last: the next checks are mostly the same */
    bool answered = false, held = false;

    for (size_t i = 0; i < published; i++) {
        const char *check = sr->outcomes[i].check, *uid = check + STREAM_PLACE_DIGITS_OF_CHECK;
        char place[STREAM_PLACE_SIZE];
        struct outbox_error err;

        if (check[0] == '\0' || strlen(check) < STREAM_PLACE_DIGITS_OF_CHECK)
            continue;
        snprintf(place, sizeof(place), "%.*s", STREAM_PLACE_DIGITS_OF_CHECK, check);
        if (last > 0 && strcmp(sr->outcomes[last - 1].check, check) == 0) {
            memcpy(sr->verdicts[i], sr->verdicts[last - 1], sizeof(sr->verdicts[i]));
            sr->messages[i].place.verdict = sr->verdicts[i];
            continue;
        }
        last = i + 1;
        if (stream_store_row_held(sr->store, place, uid, &held, &err) != 0) {
            log_event(OUTBOX_LOG_WARN, "stream order record not checked", "%s queue=%s error=\"%s\"",
                      sr->who, o->p.queue, err.message);
            return false;
        }
#ifdef OUTBOX_MUTANTS
        if (!held && mutant_fires("stream_record_trusted")) /* the broker's record believed */
            held = true;
#endif
        if (!held)
            log_event(OUTBOX_LOG_WARN,
                      "stream order record of another database history dropped",
                      "%s queue=%s partition=%d place=%s row=%s hint=\"the broker recorded a row"
                      " this database does not hold (a crash lost commits, or a restore): the rows"
                      " after the cursor are published again\"",
                      sr->who, o->p.queue, o->p.partition, place, uid[0] != '\0' ? uid : "unnamed");
        snprintf(sr->verdicts[i], sizeof(sr->verdicts[i]), "%s%s", held ? "ok" : "gone", check);
        sr->messages[i].place.verdict = sr->verdicts[i];
        answered = true;
    }
    return answered;
}

/*
 * Gives each row not published this round the verdict a row of its order
 * got in it (the verdict is on the order's record; one that is not its
 * record's is ignored by the broker). Rows taken from the claims go out one
 * chunk per order they left, and a chunk is a script call of its own: else
 * each chunk of an order would ask again, a round each.
 */
static void
spread_verdicts(struct stream_worker *sr, size_t published, size_t count)
{
    for (size_t j = published; j < count; j++) {
        const char *order = sr->messages[j].place.order;

        for (size_t i = published; order != NULL && i-- > 0;)
            if (sr->outcomes[i].check[0] != '\0' && sr->messages[i].place.order != NULL &&
                strcmp(sr->messages[i].place.order, order) == 0) {
                sr->messages[j].place.verdict = sr->messages[i].place.verdict;
                break;
            }
    }
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

/* Whether two rows of a batch are judged by one order: the partition's own (NULL) or one left. */
static bool
judged_by_one_order(const char *from, const char *other)
{
    return from == other || (from != NULL && other != NULL && strcmp(from, other) == 0);
}

/*
 * Where a chunk of batch from start, ending at end or before, ends: at the
 * first row judged by another order than start's. A row `stream enable`
 * took from the claims is judged by the order it left ("" for none), the
 * others by the partition's own; the taken rows come first. A row the
 * broker holds back to check its order's record must not see the rows
 * after it, judged by another record or none, go out first.
 */
static size_t
chunk_end_at_order_change(const struct stream_batch *batch, size_t start, size_t end)
{
    for (size_t i = start + 1; i < end; i++)
        if (!judged_by_one_order(batch->froms[i], batch->froms[start]))
            return i;
    return end;
}

/*
 * Publishes the batch; returns how many rows (a prefix) were handed to the
 * broker. With --ordering-dead-policy block the batch goes out in chunks
 * holding one row per ordering key, and a chunk with a row not accepted is
 * the last: a key's next row is never published past an earlier row of the
 * key the broker did not take. Rows taken from the claims go out in chunks
 * of their own, one per order they left, before the others
 * (chunk_end_at_order_change()).
 */
static size_t
publish_partition_rows(struct stream_worker *sr, const struct owned *o,
                       const struct stream_batch *batch, struct outbox_error *err)
{
    size_t start = 0;
    double started;

    while (start < batch->count) {
        size_t end = start + 1;
        bool all_accepted = true;

        if (!sr->config->block_on_dead_head)
            end = batch->count;
        while (end < batch->count && !chunk_has_key(batch, start, end))
            end++;
        end = chunk_end_at_order_change(batch, start, end);
        if (start > 0 && sr->places[start - 1][0] != '\0') /* the chunks before were accepted */
            for (size_t i = start; i < end; i++)
                if (sr->messages[i].place.order != NULL && batch->froms[i] == NULL)
                    sr->messages[i].place.floor = sr->places[start - 1];
        started = sr->traced && otel_enabled() ? otel_wall_seconds() : 0;
        if (sink_publish(sr->sink, sr->messages + start, end - start, sr->outcomes + start, err) != 0)
            log_event(OUTBOX_LOG_WARN, "stream publish failed", "%s queue=%s error=\"%s\"", sr->who,
                      o->p.queue, err->message);
        if (started > 0)
            otel_publish(sr->otel, start, sr->messages + start, sr->outcomes + start,
                         end - start, started, otel_wall_seconds());
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
    sr->settled += accepted + refused;
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
                  "%s queue=%s partition=%d rows=%zu first_job=%lld reason=\"%s\"", sr->who,
                  o->p.queue, o->p.partition, refused, (long long)sr->refusals[0].job_id,
                  sr->refusals[0].error);
    return 0;
}

#ifdef OUTBOX_MUTANTS
/* The planted defect reverse_batch: a batch's messages published last first... */
static void
mutant_reverse_messages(struct stream_worker *sr, size_t count)
{
    for (size_t i = 0, j = count - 1; i < j; i++, j--) {
        struct sink_message m = sr->messages[i];

        sr->messages[i] = sr->messages[j];
        sr->messages[j] = m;
    }
}

/* ... then their outcomes put back in the batch's order. */
static void
mutant_reverse_outcomes(struct stream_worker *sr, size_t count)
{
    for (size_t i = 0, j = count - 1; i < j; i++, j--) {
        struct sink_outcome outcome = sr->outcomes[i];

        sr->outcomes[i] = sr->outcomes[j];
        sr->outcomes[j] = outcome;
    }
}
#endif

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
    if (build_partition_messages(sr, o, batch) != 0)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory building cloudevents");
#ifdef OUTBOX_MUTANTS
    bool reversed = batch->count > 1 && mutant_fires("reverse_batch");
    if (reversed)
        mutant_reverse_messages(sr, batch->count);
#endif
    if (prefetch && stream_store_read_send(sr->store, &o->p, batch->xids[batch->count - 1],
                                           batch->jobs[batch->count - 1].job_id,
                                           sr->config->batch_size, err) != 0)
        return -1;
    published = publish_partition_rows(sr, o, batch, err); /* rows after it are read again */
#ifdef OUTBOX_MUTANTS
    if (reversed)
        mutant_reverse_outcomes(sr, batch->count);
#endif
    if (sink_is_connected(sr->sink))
        metrics_round_trip(sr->runner->metrics, METRICS_BROKER);
    if (prefetch && stream_store_read_receive(sr->store, next, err) != 0)
        return -1;
#ifdef OUTBOX_MUTANTS
    if (next->count > 1 && mutant_fires("stream_cursor_skip")) { /* the next batch's first row */
        next->count--;
        memmove(next->jobs, next->jobs + 1, next->count * sizeof(*next->jobs));
        memmove(next->xids, next->xids + 1, next->count * sizeof(*next->xids));
        memmove(next->froms, next->froms + 1, next->count * sizeof(*next->froms));
    }
#endif
    for (int round = 0; round < STREAM_CHECK_ROUNDS && answer_checks(sr, o, published); round++) {
        spread_verdicts(sr, published, batch->count);
        published = publish_partition_rows(sr, o, batch,
                                           err); /* with the answers: nothing appended twice */
    }
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
int
stream_partition_turn(struct stream_worker *sr, size_t index, size_t *rows, struct outbox_error *err)
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
        more = more && rc == 0 && turn + 1 < STREAM_TURN_BATCHES && !stream_worker_stopping(sr) &&
               sink_is_connected(sr->sink) &&
               (sr->turn_until <= 0 || clock_monotonic_seconds() < sr->turn_until);
    }
    stream_batch_release_memory(&batch);
    return rc;
}
