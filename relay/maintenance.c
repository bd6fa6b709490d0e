/*
 * maintenance.c - a database's maintenance: named, bounded phases (reap,
 * release waiting rows, cleanup, sample, table sample), run when due by the
 * slot serving the database, on its connection, between two slices.
 *
 * Each phase runs when due and stops at its bound; one with work left runs
 * again at the next visit (at once for --once's last), one whose database
 * failed a second later.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "buffer.h"
#include "cause_log.h"
#include "clock.h"
#include "database_list.h"
#include "error.h"
#include "json.h"
#include "log.h"
#include "outbox.h"
#include "ends.h"
#include "maintenance.h"
#include "sink.h"
#include "timeouts.h"
#include "wait.h"

/* The bounds of one run of a maintenance phase (how often each runs: timeouts.h). */
#define REAP_LIMIT 1000
#define REAP_MAX_ROUNDS 20 /* per run; more expired leases: the phase runs again at once */
#define SWEEP_KEY_LIMIT 1000
/* cleanup: batches back to back while old rows remain, for MAINTENANCE_CLEANUP_RUN_SECONDS */
#define CLEANUP_LIMIT 5000

/* Collects backlog samples; queue names are copied out of the result. */
struct samples {
    struct metrics_queue_sample *items;
    size_t count;
    size_t capacity;
};

static void
record_backlog(void *arg, const struct outbox_backlog *backlog)
{
    struct samples *s = arg;

    struct metrics_queue_sample *items =
        array_grow(s->items, &s->capacity, s->count, sizeof(*items));

    if (items == NULL)
        return; /* a sample short of a queue only leaves its gauge at 0 */
    s->items = items;
    s->items[s->count].queue = strdup(backlog->queue);
    if (s->items[s->count].queue == NULL)
        return;
    s->items[s->count].ready_rows = backlog->ready;
    s->items[s->count].oldest_ready_age_seconds = backlog->oldest_ready_age;
    s->items[s->count].paused = backlog->paused;
    s->items[s->count].paused_keys = backlog->paused_keys;
    s->count++;
}

/* What one run of a phase left behind. */
enum phase_result {
    PHASE_DONE,   /* caught up: the phase runs again after its interval */
    PHASE_MORE,   /* stopped at its bound with work left: it runs again at once */
    PHASE_FAILED, /* the database failed: err says why, the caller drops the connection */
};

/*
 * One run of the phases on one database: the maintenance thread's own, or a
 * listed database's on the slot visiting it.
 */
struct phase_run {
    relay *relay;
    outbox_store *store;
    struct maintenance_schedule *schedule;
    const char *who;         /* leads the log lines' fields: "" or "database=NAME " */
    enum maintenance_pace pace;
    size_t readied;          /* rows the waiting rows' sweep made ready */
    struct outbox_error err; /* why the database failed (PHASE_FAILED) */
};

/*
 * Reaps expired leases, REAP_LIMIT rows a round, up to REAP_MAX_ROUNDS
 * rounds (one in a visit: the database's rows wait for it).
 */
static enum phase_result
phase_reap(struct phase_run *run)
{
    relay *r = run->relay;
    struct outbox_reap_result reaped;
    int rounds = run->pace == MAINTENANCE_STEP ? 1 : REAP_MAX_ROUNDS;

    for (int round = 0; round < rounds && !relay_stopping(r); round++) {
        if (outbox_reap(run->store, REAP_LIMIT, MAINTENANCE_REAP_RETRY_SECONDS, &reaped,
                        &run->err) != 0)
            return PHASE_FAILED;
        if (reaped.ready + reaped.dead > 0)
            log_event(OUTBOX_LOG_INFO, "reaped expired leases", "%sready=%zu dead=%zu", run->who,
                      reaped.ready, reaped.dead);
        metrics_add(r->metrics, METRICS_ROWS_REAPED, reaped.ready + reaped.dead);
        if (run->pace != MAINTENANCE_STEP)
            metrics_round_trip(r->metrics, METRICS_DATABASE); /* an idle relay's database answers */
        if (reaped.ready + reaped.dead < REAP_LIMIT) {
            if (run->pace != MAINTENANCE_STEP)
                wait_latch_set(&r->reaped);
            return PHASE_DONE;
        }
    }
    return PHASE_MORE;
}

/* release waiting: readies held rows whose key's head finished while they were being inserted. */
static enum phase_result
phase_release_waiting(struct phase_run *run)
{
    size_t readied = 0;

    if (outbox_release_waiting(run->store, SWEEP_KEY_LIMIT, &readied, &run->err) != 0)
        return PHASE_FAILED;
    if (readied > 0)
        log_event(OUTBOX_LOG_INFO, "released rows waiting for a finished key", "%srows=%zu",
                  run->who, readied);
    run->readied += readied;
    return PHASE_DONE;
}

/*
 * Deletes succeeded rows older than --retention: batches of CLEANUP_LIMIT
 * rows, each its own short transaction, back to back for up to
 * MAINTENANCE_CLEANUP_RUN_SECONDS (one batch in a visit); with old rows
 * left the phase runs again at once (after the other phases due; in a
 * list, at the database's next visit), so cleanup keeps up with any drain
 * rate. A batch that finds another relay's (or a purge's) batch holding
 * the cleanup lock leaves the work to it until the next interval.
 */
static enum phase_result
phase_cleanup(struct phase_run *run)
{
    relay *r = run->relay;
    struct maintenance_schedule *m = run->schedule;
    struct outbox_cleanup_result cleaned = {.locked = true};
    double started = clock_monotonic_seconds();
    char cutoff[64];

    if (r->config->retention_seconds <= 0)
        return PHASE_DONE;
    if (m->cleaned == 0)
        m->cleanup_started = started;
    if (outbox_store_cleanup_cutoff(run->store, r->config->retention_seconds, cutoff,
                                    sizeof(cutoff), &run->err) != 0)
        return PHASE_FAILED;
    do {
        if (outbox_store_cleanup_batch(run->store, cutoff, CLEANUP_LIMIT, &cleaned, &run->err) != 0)
            return PHASE_FAILED;
        m->cleaned += cleaned.deleted;
        metrics_add(r->metrics, METRICS_ROWS_DELETED, cleaned.deleted);
    } while (run->pace != MAINTENANCE_STEP && cleaned.locked && cleaned.deleted == CLEANUP_LIMIT &&
             !relay_stopping(r) &&
             clock_monotonic_seconds() - started < MAINTENANCE_CLEANUP_RUN_SECONDS);
    if (cleaned.locked && cleaned.deleted == CLEANUP_LIMIT)
        return PHASE_MORE;
    if (m->cleaned > 0)
        log_event(OUTBOX_LOG_INFO, "deleted old succeeded rows", "%srows=%zu seconds=%.1f",
                  run->who, m->cleaned, clock_monotonic_seconds() - m->cleanup_started);
    m->cleaned = 0;
    return PHASE_DONE;
}

/* Samples the size and cleanup figures of outbox.job for the gauges. */
static enum phase_result
phase_table_sample(struct phase_run *run)
{
    relay *r = run->relay;
    struct outbox_table_sample t;

    if (outbox_store_sample_table(run->store, r->config->retention_seconds, &t, &run->err) != 0)
        return PHASE_FAILED;
    metrics_set_table_sample(r->metrics, &(struct metrics_table_sample){
                                              .table_bytes = t.table_bytes,
                                              .index_bytes = t.index_bytes,
                                              .dead_tuples = t.dead_tuples,
                                              .succeeded_rows = t.succeeded_rows,
                                              .succeeded_past_retention_rows =
                                                  t.past_retention_rows,
                                              .oldest_succeeded_past_retention_seconds =
                                                  t.oldest_past_retention_seconds,
                                          });
    return PHASE_DONE;
}

/* Samples the backlog for the gauges, and warns about an old open transaction. */
static enum phase_result
phase_sample(struct phase_run *run)
{
    relay *r = run->relay;
    struct outbox_horizon horizon;
    struct samples samples = {0};
    int rc = outbox_sample_backlog(run->store, record_backlog, &samples, &run->err);

    if (rc == 0)
        metrics_set_queue_samples(r->metrics, samples.items, samples.count);
    for (size_t i = 0; i < samples.count; i++)
        free((char *)samples.items[i].queue);
    free(samples.items);
    if (rc != 0 || outbox_sample_horizon(run->store, &horizon, &run->err) != 0)
        return PHASE_FAILED;
    metrics_set_horizon_age(r->metrics, horizon.found ? horizon.age_seconds : 0);
    if (horizon.found && r->config->horizon_warning_seconds > 0 &&
        horizon.age_seconds > r->config->horizon_warning_seconds)
        log_event_limited("xmin-horizon", OUTBOX_LOG_WARN,
                          "an open transaction holds back vacuum; the queue will slow down",
                          "age=%.0fs pid=%d application=\"%s\" state=\"%s\"", horizon.age_seconds,
                          horizon.pid, horizon.application, horizon.state);
    return PHASE_DONE;
}

/*
 * The phases, like pg_cron's loop: each named, bounded, run when due. The
 * relay's own database (--database-url) runs them all; a database of a list
 * those of_list (a list's databases sample no gauges: /metrics has its
 * per-database figures instead).
 */
static const struct phase {
    const char *name;
    double every_seconds;
    bool of_list;
    enum phase_result (*run)(struct phase_run *run);
} PHASES[PHASE_COUNT] = {
    [PHASE_REAP] = {"reap", MAINTENANCE_REAP_EVERY_SECONDS, true, phase_reap},
    [PHASE_RELEASE_WAITING] = {"release-waiting", MAINTENANCE_SWEEP_EVERY_SECONDS, true,
                               phase_release_waiting},
    [PHASE_CLEANUP] = {"cleanup", MAINTENANCE_CLEANUP_EVERY_SECONDS, true, phase_cleanup},
    [PHASE_SAMPLE] = {"sample", MAINTENANCE_SAMPLE_EVERY_SECONDS, false, phase_sample},
    [PHASE_TABLE_SAMPLE] = {"table-sample", MAINTENANCE_TABLE_SAMPLE_EVERY_SECONDS, false,
                            phase_table_sample},
};

/* Runs one phase and schedules its next run. */
static enum phase_result
run_phase(struct phase_run *run, enum maintenance_phase phase)
{
    const struct phase *ph = &PHASES[phase];
    double started = clock_monotonic_seconds();
    enum phase_result result = ph->run(run);
    double finished = clock_monotonic_seconds();

    log_event(OUTBOX_LOG_DEBUG, "maintenance phase ran", "%sphase=%s seconds=%.3f result=%s",
              run->who, ph->name, finished - started,
              result == PHASE_DONE   ? "done"
              : result == PHASE_MORE ? "more"
                                     : "failed");
    run->schedule->due[phase] = result == PHASE_DONE   ? finished + ph->every_seconds
                                : result == PHASE_MORE ? finished
                                                       : finished + MAINTENANCE_PHASE_RETRY_SECONDS;
    return result;
}

int
maintenance_visit(relay *r, outbox_store *store, const char *who, enum maintenance_pace pace,
                  struct maintenance_schedule *schedule, size_t *readied, struct outbox_error *err)
{
    char prefix[DATABASE_NAME_MAX + 32];
    struct phase_run run = {
        .relay = r, .store = store, .schedule = schedule, .who = prefix, .pace = pace};

    snprintf(prefix, sizeof(prefix), "%s%s", who, who[0] != '\0' ? " " : "");
    *readied = 0;
    for (int i = 0; i < PHASE_COUNT && !relay_stopping(r); i++) {
        enum phase_result result = PHASE_DONE;

        if ((pace == MAINTENANCE_STEP && !PHASES[i].of_list) ||
            clock_monotonic_seconds() < schedule->due[i])
            continue;
        do
            result = run_phase(&run, (enum maintenance_phase)i);
        while (pace == MAINTENANCE_WHOLE && result == PHASE_MORE && !relay_stopping(r));
        if (result == PHASE_FAILED) {
            *err = run.err;
            return -1;
        }
    }
    *readied = run.readied;
    return 0;
}

double
maintenance_next_due(const struct maintenance_schedule *schedule)
{
    double next = schedule->due[0];

    for (int i = 1; i < PHASE_COUNT; i++)
        if (schedule->due[i] < next)
            next = schedule->due[i];
    return next;
}
