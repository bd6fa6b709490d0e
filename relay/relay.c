/*
 * relay.c - claim, publish, mark: the pipelines of outbox-relay, and its
 * maintenance thread.
 *
 * Each pipeline owns one database connection and one broker connection and
 * repeats a turn (relay_turn): the marks of the batch published last and the
 * claim of the next batch are sent to the database ahead of their results,
 * the current batch is published meanwhile, then the results are collected.
 * The database and the broker work at the same time, and no row is marked
 * before the broker confirmed it.
 *
 * The maintenance thread has a database connection of its own and runs a
 * loop of named, bounded phases (reap, release waiting rows, cleanup,
 * sample), so none of that work ever holds up a pipeline's publishing.
 */
#include "relay.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <uuid/uuid.h>

#include "cause_log.h"
#include "clock.h"
#include "error.h"
#include "json.h"
#include "log.h"
#include "outbox.h"
#include "sink.h"

/* While rows keep coming, an empty claim waits at most this long before the next. */
#define BUSY_POLL_MAX_MS 8
#define BUSY_WINDOW_SECONDS 1.0
/* Pipelines check the stop flag at least this often while waiting. */
#define WAIT_SLICE_MS 100
/* Longest wait after a turn whose rows the still connected broker deferred. */
#define DEFERRED_PAUSE_MAX_MS 2000
/* Reconnect backoff: from the first to the longest wait. */
#define RECONNECT_FIRST_MS 200
#define RECONNECT_MAX_MS 10000
/* Maintenance phases: how often each runs, and the bounds of one run. */
#define REAP_EVERY_SECONDS 5.0
#define REAP_LIMIT 1000
#define REAP_MAX_ROUNDS 20 /* per run; more expired leases: the phase runs again at once */
#define REAP_RETRY_SECONDS 1.0
#define SWEEP_EVERY_SECONDS 5.0
#define SWEEP_KEY_LIMIT 1000
/* cleanup: batches back to back while old rows remain, each run at most CLEANUP_RUN_SECONDS */
#define CLEANUP_EVERY_SECONDS 10.0
#define CLEANUP_LIMIT 5000
#define CLEANUP_RUN_SECONDS 0.5
#define SAMPLE_EVERY_SECONDS 15.0
#define TABLE_SAMPLE_EVERY_SECONDS 30.0
/* A phase whose database failed tries again this soon after the reconnect. */
#define PHASE_RETRY_SECONDS 1.0
/* --once gives up on an end it cannot reach for this long (connect_ends). */
#define ONCE_CONNECT_BUDGET_SECONDS 10.0
/* Batches in a row that lose the broker connection before one is published in halves. */
#define BISECT_AFTER_LOSSES 2
/* The broker connection is serviced (heartbeats) at least this often when idle. */
#define SINK_IDLE_EVERY_SECONDS 1.0

/*
 * The rows of one claimed batch, and once it is published, its rows sorted
 * by outcome until the database has marked them: accepted rows are
 * completed, rows that failed through their own fault are failed (an
 * attempt spent), deferred rows (broker connection or channel lost, broker
 * busy: nobody's fault) are released with their attempt handed back. Queue
 * names point into the batch, error texts into the outcomes, so both live
 * as long as the settlement.
 */
struct settlement {
    struct outbox_batch batch;
    struct sink_outcome *outcomes;
    struct outbox_lease *leases; /* accepted rows */
    const char **lease_queues;
    size_t accepted;                 /* rows in leases[] not marked yet */
    struct outbox_failure *failures; /* rejected or failed rows */
    const char **failure_queues;
    size_t failed;                 /* rows in failures[] not marked yet */
    struct outbox_lease *releases; /* deferred rows */
    size_t released;               /* rows in releases[] not given back yet */
    size_t published; /* rows published, counted in flight until the settlement is cleared */
    bool *done;
    bool *dead;
};

/*
 * A thread's own database connection: each pipeline and the maintenance
 * thread has one, and reconnects it on its own.
 */
struct database {
    relay *relay;
    outbox_store *store; /* NULL while disconnected */
    char worker_id[192];
    char who[24];      /* leads the thread's log fields: "pipeline=0", "thread=maintenance" */
    unsigned int seed; /* reconnect jitter, and a pipeline's retry jitter */
    struct cause_log connect_log, error_log;
};

struct pipeline {
    relay *relay;
    int index;
    pthread_t thread;
    bool started;
    struct database db;
    sink *sink;
    bool sink_counted;      /* connected and counted in outbox_broker_endpoint */
    size_t endpoint_in_use; /* the endpoint connected to, while sink_counted */

    /* per-batch scratch, sized for --batch-size */
    struct sink_message *messages;
    struct outbox_lease *leases; /* for extend and give back */
    bool *done;
    double *lags; /* commit-to-publish seconds of accepted rows */
    /*
     * settlements[current] holds the batch being published, the other slot
     * the one before it, being marked (see relay_turn)
     */
    struct settlement settlements[2];
    int current;

    int deferred_pause_ms; /* see pause_after_deferral() */
    double last_sink_idle;
    struct cause_log deferred_log;
    int connection_losses; /* publishes in a row that lost the broker connection (publish_rows) */
    /* --once: when rows last moved, and why they did not since (once_stalled) */
    double progress_at;
    struct outbox_error cause;
};

/* The maintenance phases, in the order one pass of the loop runs them. */
enum maintenance_phase {
    PHASE_REAP = 0,        /* expired leases back to ready (or dead) */
    PHASE_RELEASE_WAITING, /* held rows whose key's head finished while they were inserted */
    PHASE_CLEANUP,         /* succeeded rows older than --retention */
    PHASE_SAMPLE,          /* backlog gauges and the xmin horizon warning */
    PHASE_TABLE_SAMPLE,    /* size, dead tuples and succeeded rows of outbox.job */
    PHASE_COUNT,
};

struct maintenance {
    pthread_t thread;
    bool started;
    struct database db;
    double due[PHASE_COUNT]; /* monotonic seconds when each phase runs next */
    size_t cleaned;          /* rows deleted by the cleanup runs since it last caught up */
    double cleanup_started;  /* when those runs began */
};

struct relay {
    const struct relay_config *config;
    struct metrics *metrics;
    char worker_prefix[160];
    struct pipeline *pipelines;
    struct maintenance maintenance;
    atomic_int stopping;
    atomic_int running;           /* threads (pipelines and maintenance) not yet returned */
    atomic_int pipelines_running; /* pipelines not yet returned; maintenance ends with them */
    atomic_int reaped;            /* the maintenance thread reaped once (--once waits for it) */
    void (*finished)(void *arg);  /* called by the last thread to return */
    void *finished_arg;
    atomic_int fatal;
    pthread_mutex_t fatal_lock;
    struct outbox_error fatal_error;
};

/* Wall-clock seconds since the epoch, to compare with created_at. */
static double
wall_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static bool
stopping(const relay *r)
{
    return atomic_load(&r->stopping) || atomic_load(&r->fatal);
}

/* Sleeps up to ms in slices, returning early when the relay stops. */
static void
sleep_ms(relay *r, int ms)
{
    while (ms > 0 && !stopping(r)) {
        int slice = ms < WAIT_SLICE_MS ? ms : WAIT_SLICE_MS;

        usleep((useconds_t)slice * 1000);
        ms -= slice;
    }
}

/* Records the first fatal error and stops every pipeline. */
static void
set_fatal(relay *r, const struct outbox_error *err)
{
    pthread_mutex_lock(&r->fatal_lock);
    if (!atomic_load(&r->fatal)) {
        r->fatal_error = *err;
        atomic_store(&r->fatal, 1);
    }
    pthread_mutex_unlock(&r->fatal_lock);
}

/* The next reconnect wait: doubling, capped, with jitter. */
static int
next_backoff_ms(unsigned int *seed, int attempt)
{
    double seconds =
        outbox_backoff_seconds(attempt, RECONNECT_FIRST_MS / 1000.0, RECONNECT_MAX_MS / 1000.0,
                               (double)rand_r(seed) / ((double)RAND_MAX + 1));

    return (int)(seconds * 1000);
}

/* ---- connections ------------------------------------------------------------ */

/*
 * libpq hands what the server says outside a query result (a WARNING from a
 * user's trigger, the FATAL sent to idle sessions at shutdown) to a notice
 * processor whose default writes it raw to stderr, in the middle of the log.
 * This one makes it a log event of the thread, rate-limited.
 */
static void
log_database_notice(void *arg, const char *message)
{
    const struct database *db = arg;
    size_t len = strlen(message);

    while (len > 0 && (message[len - 1] == '\n' || message[len - 1] == ' '))
        len--;
    log_event_limited("database-notice", OUTBOX_LOG_WARN, "database notice",
                      "%s notice=\"%.*s\"", db->who, (int)len, message);
}

/* What one connection attempt came to. */
enum attempt_result {
    ATTEMPT_CONNECTED,
    ATTEMPT_FAILED, /* worth another try; logged */
    ATTEMPT_FATAL,  /* bad password, no schema at first start: set_fatal() done */
};

/*
 * --on-success delete: the role must be able to delete, or every row would
 * be published, fail its delete and stay running until its lease ends, to
 * be published again. Checked at connect, where a missing SELECT or UPDATE
 * is too; the message names the option.
 */
static int
require_delete(outbox_store *store, struct outbox_error *err)
{
    char message[sizeof(err->message)];

    if (outbox_store_check_privileges(store, err) == 0)
        return 0;
    snprintf(message, sizeof(message), "%s", err->message);
    snprintf(err->message, sizeof(err->message), "--on-success delete: %.*s",
             (int)(sizeof(message) - 32), message);
    return -1;
}

/* One attempt to connect a thread's store; err says why it failed. */
static enum attempt_result
try_store(struct database *db, bool first, int attempt, struct outbox_error *err)
{
    relay *r = db->relay;
    unsigned long repeats;

    db->store = outbox_store_connect(r->config->database_url, db->worker_id, err);
    if (db->store != NULL && r->config->delete_on_success && require_delete(db->store, err) != 0) {
        outbox_store_free(db->store);
        db->store = NULL;
    }
    if (db->store != NULL) {
        PQsetNoticeProcessor(outbox_store_conn(db->store), log_database_notice, db);
        outbox_store_set_block_on_dead_head(db->store, r->config->block_on_dead_head);
        outbox_store_set_delete_on_success(db->store, r->config->delete_on_success);
        metrics_set_up(r->metrics, METRICS_DATABASE, true);
        /* the server in use, so that a failover to another host shows in the log */
        log_event(OUTBOX_LOG_INFO, "database connected", "%s server=%s:%s attempts=%d", db->who,
                  PQhost(outbox_store_conn(db->store)), PQport(outbox_store_conn(db->store)),
                  attempt);
        return ATTEMPT_CONNECTED;
    }
    metrics_set_up(r->metrics, METRICS_DATABASE, false);
    if (first && !outbox_error_is_transient(err)) {
        set_fatal(r, err);
        return ATTEMPT_FATAL;
    }
    if (cause_log_due(&db->connect_log, err->message, &repeats))
        log_event(OUTBOX_LOG_WARN, "database unavailable, retrying",
                  "%s error=\"%s\" repeats=%lu", db->who, err->message, repeats);
    metrics_reconnected(r->metrics, METRICS_DATABASE);
    return ATTEMPT_FAILED;
}

/* Like try_store, for a pipeline's broker. */
static enum attempt_result
try_sink(struct pipeline *p, bool first, int attempt, struct outbox_error *err)
{
    relay *r = p->relay;

    if (sink_connect(p->sink, err) == 0) {
        metrics_set_up(r->metrics, METRICS_BROKER, true);
        p->endpoint_in_use = sink_endpoint(p->sink);
        metrics_add_endpoint_connections(r->metrics, p->endpoint_in_use, 1);
        p->sink_counted = true;
        p->last_sink_idle = clock_monotonic_seconds();
        /* each (re)connect names the endpoint, so a failover can be read from the log */
        if (sink_endpoint_count(p->sink) > 0)
            log_event(OUTBOX_LOG_INFO, "broker connected", "%s endpoint=%s attempts=%d",
                      p->db.who, sink_endpoint_name(p->sink, p->endpoint_in_use), attempt);
        else
            log_event(OUTBOX_LOG_INFO, "broker connected", "%s broker=%s attempts=%d", p->db.who,
                      sink_display_url(p->sink), attempt);
        if (sink_replicas(p->sink)[0] != '\0')
            log_event(OUTBOX_LOG_INFO, "broker replicas", "%s replicas=\"%s\" redis_wait=%d",
                      p->db.who, sink_replicas(p->sink), sink_replicas_to_wait(p->sink));
        return ATTEMPT_CONNECTED;
    }
    metrics_set_up(r->metrics, METRICS_BROKER, false);
    if (first && !outbox_error_is_transient(err)) {
        set_fatal(r, err);
        return ATTEMPT_FATAL;
    }
    log_event_limited("broker-connect", OUTBOX_LOG_WARN, "broker unavailable, retrying",
                      "%s broker=%s error=\"%s\"", p->db.who, sink_display_url(p->sink),
                      err->message);
    metrics_reconnected(r->metrics, METRICS_BROKER);
    return ATTEMPT_FAILED;
}

/* Logs a lost broker connection with the endpoint it was on and updates the metrics. */
static void
sink_lost(struct pipeline *p, const struct outbox_error *err)
{
    relay *r = p->relay;
    size_t lost = p->sink_counted ? p->endpoint_in_use : sink_endpoint(p->sink);
    char key[48];

    /* limited per pipeline: each pipeline's loss of its node shows, a flapping one does not flood */
    snprintf(key, sizeof(key), "broker-error %s", p->db.who);
    if (sink_endpoint_count(p->sink) > 0)
        log_event_limited(key, OUTBOX_LOG_WARN, "broker connection lost",
                          "%s endpoint=%s error=\"%s\"", p->db.who,
                          sink_endpoint_name(p->sink, lost), err->message);
    else
        log_event_limited(key, OUTBOX_LOG_WARN, "broker connection lost",
                          "%s broker=%s error=\"%s\"", p->db.who, sink_display_url(p->sink),
                          err->message);
    metrics_set_up(r->metrics, METRICS_BROKER, false);
    if (p->sink_counted)
        metrics_add_endpoint_connections(r->metrics, lost, -1);
    p->sink_counted = false;
}

/* Closes a pipeline's broker connection on the way out. */
static void
sink_close(struct pipeline *p)
{
    if (p->sink_counted)
        metrics_add_endpoint_connections(p->relay->metrics, p->endpoint_in_use, -1);
    p->sink_counted = false;
    sink_disconnect(p->sink);
}

/*
 * The one connect-with-backoff loop, for every thread and both ends.
 * Connects what is not connected (db's store when want_store, pipeline p's
 * broker when want_sink; p is NULL for the maintenance thread), trying each
 * end on every attempt so that /healthz knows the state of both, until both
 * work, the relay stops, or a fatal error (bad password, no schema) at first
 * start. With --once it gives up after ONCE_CONNECT_BUDGET_SECONDS: a
 * one-shot run must end. Returns 0 when connected.
 */
static int
connect_ends(struct database *db, struct pipeline *p, bool want_store, bool want_sink, bool first)
{
    relay *r = db->relay;
    double started = clock_monotonic_seconds();

    for (int attempt = 1; !stopping(r); attempt++) {
        struct outbox_error store_err, sink_err;
        enum attempt_result store = ATTEMPT_CONNECTED, broker = ATTEMPT_CONNECTED;

        if (want_store && db->store == NULL)
            store = try_store(db, first, attempt, &store_err);
        if (store != ATTEMPT_FATAL && want_sink && p != NULL && !sink_is_connected(p->sink))
            broker = try_sink(p, first, attempt, &sink_err);
        if (store == ATTEMPT_FATAL || broker == ATTEMPT_FATAL)
            return -1;
        if (store == ATTEMPT_CONNECTED && broker == ATTEMPT_CONNECTED)
            return 0;
        /*
         * The pipelines give up for --once, naming every end they could not
         * reach; the maintenance thread sees only the database and stops with
         * them.
         */
        if (r->config->once && db != &r->maintenance.db &&
            clock_monotonic_seconds() - started >= ONCE_CONNECT_BUDGET_SECONDS) {
            struct outbox_error err;

            if (store == ATTEMPT_FAILED && broker == ATTEMPT_FAILED)
                outbox_error_set(&err, OUTBOX_ERR_CONNECTION,
                                 "--once: database and broker unreachable for %.0f s, giving up:"
                                 " %s; %s",
                                 ONCE_CONNECT_BUDGET_SECONDS, store_err.message, sink_err.message);
            else if (store == ATTEMPT_FAILED && (store_err.code == OUTBOX_ERR_BUSY ||
                                                 store_err.code == OUTBOX_ERR_TIMEOUT))
                /* it answered, but a statement waited past its timeout: say what for */
                outbox_error_set(&err, OUTBOX_ERR_CONNECTION,
                                 "--once: database statements waited past their timeout for"
                                 " %.0f s (a lock on outbox.job held by another session?),"
                                 " giving up: %s",
                                 ONCE_CONNECT_BUDGET_SECONDS, store_err.message);
            else if (store == ATTEMPT_FAILED && store_err.code == OUTBOX_ERR_CONFIG)
                outbox_error_set(&err, OUTBOX_ERR_CONFIG, "--once: giving up: %s",
                                 store_err.message);
            else
                outbox_error_set(&err, OUTBOX_ERR_CONNECTION,
                                 "--once: %s unreachable for %.0f s, giving up: %s",
                                 store == ATTEMPT_FAILED ? "database" : "broker",
                                 ONCE_CONNECT_BUDGET_SECONDS,
                                 store == ATTEMPT_FAILED ? store_err.message : sink_err.message);
            set_fatal(r, &err);
            return -1;
        }
        sleep_ms(r, next_backoff_ms(&db->seed, attempt));
    }
    return -1;
}

/* Connects a thread's store; see connect_ends(). */
static int
connect_store(struct database *db, bool first)
{
    return connect_ends(db, NULL, true, false, first);
}

static void
drop_store(struct database *db)
{
    outbox_store_free(db->store);
    db->store = NULL;
    metrics_set_up(db->relay->metrics, METRICS_DATABASE, false);
}

/* Connects a pipeline's broker; see connect_ends(). */
static int
connect_sink(struct pipeline *p, bool first)
{
    return connect_ends(&p->db, p, false, true, first);
}

/*
 * Reacts to a failed store call. A missing schema or refused credentials stop
 * the relay; anything else (a lost connection, a timeout, a statement the
 * server rejected, a privilege revoked) drops the connection and carries on
 * after reconnecting:
 * the rows involved keep their lease and come back after it, never lost.
 */
static void
database_failed(struct database *db, const struct outbox_error *err)
{
    unsigned long repeats;

    /*
     * A privilege revoked while the relay runs is an operator's change that
     * the next grant undoes: the connection is dropped (health says the
     * database is down) and reconnecting, which checks the privileges, is
     * retried with backoff. At the first start it is fatal (try_store).
     */
    if (err->code == OUTBOX_ERR_SCHEMA ||
        (err->code == OUTBOX_ERR_CONFIG && strcmp(err->sqlstate, "42501") != 0)) {
        set_fatal(db->relay, err);
        return;
    }
    if (cause_log_due(&db->error_log, err->message, &repeats))
        log_event(outbox_error_is_transient(err) ? OUTBOX_LOG_WARN : OUTBOX_LOG_ERROR,
                  "database error, reconnecting", "%s error=\"%s\" repeats=%lu", db->who,
                  err->message, repeats);
    drop_store(db);
}

/* database_failed() of a pipeline's connection. */
static void
store_failed(struct pipeline *p, const struct outbox_error *err)
{
    p->cause = *err;
    database_failed(&p->db, err);
}

/* ---- one batch -------------------------------------------------------------- */

/* Keeps a broker's reason printable ASCII, so the database always takes it as text. */
static void
sanitize_reason(char *reason)
{
    for (unsigned char *c = (unsigned char *)reason; *c != '\0'; c++)
        if (*c < 0x20 || *c > 0x7e)
            *c = '?';
}

/* Fills the failure of one message from its sink outcome. */
static void
add_failure(struct pipeline *p, struct outbox_failure *failure, const struct outbox_job *job,
            struct sink_outcome *outcome)
{
    const struct relay_config *c = p->relay->config;

    sanitize_reason(outcome->reason);
    *failure = (struct outbox_failure){
        .job_id = job->job_id,
        .generation = job->generation,
        .error = outcome->reason[0] ? outcome->reason : "publish failed",
        .retry_seconds =
            outbox_backoff_seconds(job->generation, c->retry_base_seconds, c->retry_max_seconds,
                                   (double)rand_r(&p->db.seed) / ((double)RAND_MAX + 1)),
        .permanent = outcome->status == SINK_REJECTED,
    };
}

static bool
has_rows(const struct settlement *st)
{
    return st->accepted + st->failed + st->released > 0;
}

/*
 * ' trace_id="<32 hex>"' for the log lines about a row, empty for a row
 * without a W3C traceparent; quoted, so that a JSON log keeps it a string.
 */
struct trace_field {
    char text[48];
};

/*
 * The trace field of row job_id of the settlement's batch (sorted by job
 * id), read from its traceparent header "00-<trace id>-<parent id>-<flags>".
 * Only log lines about single rows need it, so the headers are parsed here
 * and not on the way to the broker.
 */
static struct trace_field
trace_field_of(const struct settlement *st, int64_t job_id)
{
    struct trace_field field = {{0}};
    struct json_string_object headers = {0};
    struct outbox_error err;
    size_t low = 0, high = st->batch.count;

    while (low < high) {
        size_t mid = low + (high - low) / 2;

        if (st->batch.jobs[mid].job_id < job_id)
            low = mid + 1;
        else
            high = mid;
    }
    if (low == st->batch.count || st->batch.jobs[low].job_id != job_id ||
        strstr(st->batch.jobs[low].headers, "traceparent") == NULL ||
        json_parse_string_object(st->batch.jobs[low].headers, strlen(st->batch.jobs[low].headers),
                                 &headers, &err) != 0)
        return field;
    for (size_t i = 0; i < headers.count; i++) {
        const struct json_member *m = &headers.members[i];

        if (strcmp(m->key, "traceparent") == 0 && m->value_len == 55 && m->value[2] == '-' &&
            m->value[35] == '-' && strspn(m->value + 3, "0123456789abcdef") == 32)
            snprintf(field.text, sizeof(field.text), " trace_id=\"%.32s\"", m->value + 3);
    }
    json_string_object_clear(&headers);
    return field;
}

/* Records what marking the accepted rows changed; the rest lost their lease. */
static void
record_completed(struct pipeline *p, const struct settlement *st, size_t changed)
{
    relay *r = p->relay;

    for (size_t i = 0; i < st->accepted; i++)
        if (st->done[i])
            metrics_add_queue(r->metrics, METRICS_ROWS_COMPLETED, st->lease_queues[i], 1);
    if (changed < st->accepted) {
        metrics_add(r->metrics, METRICS_LEASE_LOST, st->accepted - changed);
        for (size_t i = 0; i < st->accepted; i++)
            if (!st->done[i])
                log_event_limited("lease-lost", OUTBOX_LOG_WARN,
                                  "lease lost before marking a published row",
                                  "pipeline=%d job_id=%lld%s", p->index,
                                  (long long)st->leases[i].job_id,
                                  trace_field_of(st, st->leases[i].job_id).text);
    }
}

/* Records what giving the failed rows back changed: retried later, or dead. */
static void
record_failed(struct pipeline *p, const struct settlement *st, size_t changed)
{
    relay *r = p->relay;

    for (size_t i = 0; i < st->failed; i++) {
        const struct outbox_failure *f = &st->failures[i];

        if (!st->done[i])
            continue;
        /* a row's last attempt counts as dead only, as the metric's help says */
        if (st->dead[i]) {
            metrics_add_queue(r->metrics, METRICS_ROWS_DEAD, st->failure_queues[i], 1);
            log_event(OUTBOX_LOG_ERROR, "row is dead", "pipeline=%d job_id=%lld%s error=\"%s\"",
                      p->index, (long long)f->job_id, trace_field_of(st, f->job_id).text,
                      f->error);
        } else {
            metrics_add_queue(r->metrics, METRICS_ROWS_FAILED, st->failure_queues[i], 1);
            log_event_limited("publish-failed", OUTBOX_LOG_WARN, "publish failed, will retry",
                              "pipeline=%d job_id=%lld%s retry_in=%.1fs error=\"%s\"", p->index,
                              (long long)f->job_id, trace_field_of(st, f->job_id).text,
                              f->retry_seconds, f->error);
        }
    }
    if (changed < st->failed)
        metrics_add(r->metrics, METRICS_LEASE_LOST, st->failed - changed);
}

/* Records what giving the deferred rows back changed. */
static void
record_released(struct pipeline *p, const struct settlement *st, size_t changed)
{
    relay *r = p->relay;

    metrics_add(r->metrics, METRICS_ROWS_RELEASED, changed);
    if (changed < st->released)
        metrics_add(r->metrics, METRICS_LEASE_LOST, st->released - changed);
}

/* Forgets a settled (or abandoned) batch. */
static void
settlement_clear(struct pipeline *p, struct settlement *st)
{
    metrics_add_in_flight(p->relay->metrics, -(int64_t)st->published);
    st->accepted = st->failed = st->released = st->published = 0;
    outbox_batch_release_memory(&st->batch);
}

/*
 * Sends the marks of a published batch (complete, fail, then release) ahead
 * of their results. Returns 0, or -1 after dropping the store.
 */
static int
settle_send(struct pipeline *p, const struct settlement *st)
{
    struct outbox_error err;

    if (outbox_complete_send(p->db.store, st->leases, st->accepted, &err) != 0 ||
        outbox_fail_send(p->db.store, st->failures, st->failed, &err) != 0 ||
        outbox_release_send(p->db.store, st->releases, st->released, &err) != 0) {
        store_failed(p, &err);
        return -1;
    }
    return 0;
}

/*
 * Collects what settle_send() sent and records it. On an error the store is
 * dropped and the marks that were not confirmed are left to settle_now().
 */
static void
settle_receive(struct pipeline *p, struct settlement *st)
{
    struct outbox_error err;
    size_t changed;

    if (outbox_complete_receive(p->db.store, st->leases, st->accepted, st->done, &changed, &err) !=
        0) {
        store_failed(p, &err);
        return;
    }
    record_completed(p, st, changed);
    st->accepted = 0;
    if (outbox_fail_receive(p->db.store, st->failures, st->failed, st->done, st->dead, &changed,
                            &err) != 0) {
        store_failed(p, &err);
        return;
    }
    record_failed(p, st, changed);
    st->failed = 0;
    if (outbox_release_receive(p->db.store, st->releases, st->released, st->done, &changed, &err) !=
        0) {
        store_failed(p, &err);
        return;
    }
    record_released(p, st, changed);
    st->released = 0;
}

/*
 * Marks a published batch and waits. If the database is gone, reconnects
 * once and tries again while the leases may still hold; rows it cannot mark
 * stay running and are re-published after their lease (at least once).
 */
static void
settle_now(struct pipeline *p, struct settlement *st)
{
    for (int attempt = 0; attempt < 2 && has_rows(st); attempt++) {
        if (p->db.store == NULL && connect_store(&p->db, false) != 0)
            break;
        if (settle_send(p, st) == 0)
            settle_receive(p, st);
    }
    settlement_clear(p, st);
}

/* Fills p->leases with the rows of a batch. */
static void
lease_batch(struct pipeline *p, const struct outbox_batch *batch)
{
    for (size_t i = 0; i < batch->count; i++)
        p->leases[i] = (struct outbox_lease){batch->jobs[i].job_id, batch->jobs[i].generation};
}

/*
 * Publishing a row whose lease has ended would put it out after rows of its
 * key that another relay published meanwhile: that relay reaped the row,
 * published it and went on with the key. So before a batch goes out, every
 * row whose lease the pipeline cannot prove it still holds is dropped. A
 * batch claimed less than half a lease ago is held for sure (claimed_at is
 * taken before the claim was sent, on the monotonic clock, so the lease
 * began later); an older one (a broker that kept it waiting, a process
 * stopped by SIGSTOP or a stalled VM, the claim made ahead and collected
 * after such a pause) is extended, and only the rows the extend returned
 * stay. Without a database nothing can be proved and every row is dropped.
 * Dropped rows are neither published nor marked: another relay owns them,
 * or will once the lease ends. What stays open is a pause between this
 * check and the write to the broker (the README's ordering promise).
 */
static void
keep_held_rows(struct pipeline *p, struct outbox_batch *batch, double *claimed_at)
{
    const struct relay_config *c = p->relay->config;
    double checked = clock_monotonic_seconds(), held_for = checked - *claimed_at;
    struct outbox_error err;
    size_t changed = 0, kept = 0;

    if (batch->count == 0 || held_for <= c->lease_seconds / 2.0)
        return;
    lease_batch(p, batch);
    memset(p->done, 0, batch->count * sizeof(*p->done));
    if (p->db.store != NULL) {
        if (outbox_extend(p->db.store, p->leases, batch->count, c->lease_seconds, p->done, &changed,
                          &err) == 0)
            *claimed_at = checked;
        else {
            store_failed(p, &err);
            memset(p->done, 0, batch->count * sizeof(*p->done));
        }
    }
    for (size_t i = 0; i < batch->count; i++)
        if (p->done[i])
            batch->jobs[kept++] = batch->jobs[i];
    if (kept < batch->count) {
        metrics_add(p->relay->metrics, METRICS_LEASE_LOST, batch->count - kept);
        log_event_limited("lease-lost-unpublished", OUTBOX_LOG_WARN,
                          "lease lost before publishing, rows left to their new owner",
                          "pipeline=%d rows=%zu held_for=%.1fs", p->index, batch->count - kept,
                          held_for);
    }
    batch->count = kept;
}

/*
 * Hands a claimed batch that will not be published back at once, attempt
 * included, then frees it. Without a database the rows come back when
 * their lease runs out.
 */
static void
give_back(struct pipeline *p, struct outbox_batch *batch)
{
    struct outbox_error err;
    size_t changed;

    if (batch->count > 0 && p->db.store != NULL) {
        lease_batch(p, batch);
        if (outbox_release(p->db.store, p->leases, batch->count, p->done, &changed, &err) != 0)
            store_failed(p, &err);
    }
    outbox_batch_release_memory(batch);
}

/* Sets a message's outcome, as the sinks do. */
static void __attribute__((format(printf, 3, 4)))
outcome_set(struct sink_outcome *outcome, enum sink_status status, const char *format, ...)
{
    va_list args;

    outcome->status = status;
    va_start(args, format);
    vsnprintf(outcome->reason, sizeof(outcome->reason), format, args);
    va_end(args);
}

/*
 * Publishes messages [low, high) of st's batch in halves, each half in
 * halves again while it breaks the connection, so that a message that
 * breaks the connection by itself (one the broker answers by closing the
 * connection, or one the client library refuses mid-frame) ends up alone:
 * it fails (an attempt spent, dead after max_attempts) and the others go
 * out. A half whose messages the broker all confirmed is not published
 * again; one confirmed in part is (at least once). Without a broker the
 * rest is deferred.
 */
static void
publish_halves(struct pipeline *p, struct settlement *st, size_t low, size_t high)
{
    struct outbox_error err;
    size_t pending = 0, middle;

    for (size_t i = low; i < high; i++)
        pending += st->outcomes[i].status != SINK_ACCEPTED;
    if (pending == 0)
        return;
    if (!sink_is_connected(p->sink) && connect_sink(p, false) != 0) {
        for (size_t i = low; i < high; i++)
            if (st->outcomes[i].status != SINK_ACCEPTED)
                outcome_set(&st->outcomes[i], SINK_DEFERRED, "not published: broker unreachable");
        return;
    }
    if (sink_publish(p->sink, p->messages + low, high - low, st->outcomes + low, &err) == 0)
        return;
    sink_lost(p, &err);
    if (high - low == 1) {
        if (st->outcomes[low].status == SINK_DEFERRED)
            outcome_set(&st->outcomes[low], SINK_FAILED,
                             "the broker connection broke on this message alone: %s", err.message);
        return;
    }
    middle = low + (high - low) / 2;
    publish_halves(p, st, low, middle);
    publish_halves(p, st, middle, high);
}

/*
 * Publishes st's batch. A batch after BISECT_AFTER_LOSSES publishes in a
 * row that lost the connection goes out in halves (publish_halves): a
 * message that breaks the connection would otherwise be given back, no
 * attempt spent, and break it again for ever. Returns what sink_publish
 * returned for the whole batch (0 after halves).
 */
static int
publish_rows(struct pipeline *p, struct settlement *st, struct outbox_error *err)
{
    size_t count = st->batch.count;
    int rc;

    if (p->connection_losses >= BISECT_AFTER_LOSSES && count > 1) {
        log_event(OUTBOX_LOG_WARN, "broker connection lost by batches in a row, publishing in halves",
                  "pipeline=%d rows=%zu losses=%d", p->index, count, p->connection_losses);
        for (size_t i = 0; i < count; i++)
            outcome_set(&st->outcomes[i], SINK_DEFERRED, "not published");
        publish_halves(p, st, 0, count);
        p->connection_losses = 0;
        return 0;
    }
    rc = sink_publish(p->sink, p->messages, count, st->outcomes, err);
    p->connection_losses = rc != 0 ? p->connection_losses + 1 : 0;
    if (rc != 0 && count == 1 && p->connection_losses >= BISECT_AFTER_LOSSES &&
        st->outcomes[0].status == SINK_DEFERRED) {
        /* alone already: it is the one that breaks the connection */
        outcome_set(&st->outcomes[0], SINK_FAILED,
                         "the broker connection broke on this message alone: %s", err->message);
        p->connection_losses = 0;
    }
    return rc;
}

/* Publishes the claimed batch of st and sorts its rows into accepted and failed. */
static void
publish_batch(struct pipeline *p, struct settlement *st)
{
    relay *r = p->relay;
    const struct outbox_batch *batch = &st->batch;
    size_t accepted = 0, failed = 0, timed = 0, released = 0;
    const char *deferred_reason = "";
    struct outbox_error err;
    double started, finished, wall;
    int rc;

    if (batch->count == 0)
        return;
    for (size_t i = 0; i < batch->count; i++) {
        const struct outbox_job *job = &batch->jobs[i];

        p->messages[i] = (struct sink_message){
            .job_id = job->job_id,
            .attempt = job->generation,
            .queue = job->queue,
            .payload = job->payload,
            .payload_len = job->payload_len,
            .headers = job->headers,
            .created_at = job->created_at,
            .replay = job->replays,
            .exchange = job->exchange,
            .routing_key = job->routing_key,
        };
        metrics_add_queue(r->metrics, METRICS_ROWS_CLAIMED, job->queue, 1);
    }

    metrics_add_in_flight(r->metrics, (int64_t)batch->count);
    st->published = batch->count;
    started = clock_monotonic_seconds();
    rc = publish_rows(p, st, &err);
    finished = clock_monotonic_seconds();
    wall = wall_seconds();
    metrics_observe(r->metrics, METRICS_PUBLISH_DURATION, finished - started);
    if (rc != 0)
        sink_lost(p, &err);

    for (size_t i = 0; i < batch->count; i++) {
        const struct outbox_job *job = &batch->jobs[i];

        if (st->outcomes[i].status == SINK_ACCEPTED) {
            st->lease_queues[accepted] = job->queue;
            if (job->created_at > 0) /* 0: an infinite created_at, no latency to observe */
                p->lags[timed++] = wall - job->created_at;
            st->leases[accepted++] = (struct outbox_lease){job->job_id, job->generation};
            metrics_add_queue(r->metrics, METRICS_ROWS_PUBLISHED, job->queue, 1);
        } else if (st->outcomes[i].status == SINK_DEFERRED) {
            if (released == 0)
                deferred_reason = st->outcomes[i].reason;
            st->releases[released++] = (struct outbox_lease){job->job_id, job->generation};
        } else {
            st->failure_queues[failed] = job->queue;
            add_failure(p, &st->failures[failed++], job, &st->outcomes[i]);
        }
    }
    if (released > 0) {
        unsigned long repeats;

        outbox_error_set(&p->cause, OUTBOX_ERR_CONNECTION, "rows deferred: %s", deferred_reason);
        if (cause_log_due(&p->deferred_log, deferred_reason, &repeats))
            log_event(OUTBOX_LOG_WARN, "rows not published through no fault of their own, given back",
                      "pipeline=%d rows=%zu error=\"%s\" repeats=%lu", p->index, released,
                      deferred_reason, repeats);
    }
    /* a broker that takes none of a batch (no replica for --redis-wait, ...) shows in health */
    metrics_set_broker_held(r->metrics, accepted == 0 && released > 0 ? deferred_reason : NULL);
    metrics_observe_many(r->metrics, METRICS_COMMIT_TO_PUBLISH, p->lags, timed);
    st->accepted = accepted;
    st->failed = failed;
    st->released = released;
}

/*
 * One turn of a pipeline. settlements[current] holds a claimed batch (empty
 * on the first turn and after an outage), settlements[previous] the batch
 * before it, published but not yet marked. The marks of the previous batch
 * and the next claim go to the database ahead of their results, then the
 * current batch is published while the database works on them, then their
 * results are collected:
 *
 *   database  | mark N-1, claim N+1 |              | mark N, claim N+2 | ...
 *   broker    | publish N ........  |              | publish N+1 ....  |
 *
 * Afterwards the slots swap: settlements[current] holds the new claim.
 * Returns true when that claim was made (even if it found nothing), false
 * when it was not (stopping, or the database failed).
 */
static bool
relay_turn(struct pipeline *p, double *claimed_at)
{
    relay *r = p->relay;
    const struct relay_config *c = r->config;
    struct settlement *current = &p->settlements[p->current];
    struct settlement *previous = &p->settlements[!p->current];
    struct outbox_batch next = {0};
    struct outbox_error err;
    double next_claimed_at = clock_monotonic_seconds();
    bool marking = false, claiming = false;

    /* before anything is sent ahead, so the claim below sees pauses a fifth of a second old at most */
    if (p->db.store != NULL && outbox_store_refresh_pauses(p->db.store, &err) != 0)
        store_failed(p, &err);
    /* the last round trip before the publish, so the least time passes after it */
    keep_held_rows(p, &current->batch, claimed_at);
    if (p->db.store != NULL && has_rows(previous))
        marking = settle_send(p, previous) == 0;
    if (p->db.store != NULL && !stopping(r)) {
        if (outbox_claim_send(p->db.store, (const char *const *)c->queues, c->queue_count,
                              c->batch_size, c->lease_seconds, &err) == 0)
            claiming = true;
        else
            store_failed(p, &err);
    }
    publish_batch(p, current);
    if (marking && p->db.store != NULL)
        settle_receive(p, previous);
    if (claiming && p->db.store == NULL)
        claiming = false; /* collecting the marks failed and dropped the connection */
    if (claiming && outbox_claim_receive(p->db.store, &next, &err) != 0) {
        store_failed(p, &err);
        claiming = false;
    }
    if (claiming)
        metrics_add(r->metrics, METRICS_CLAIMS, 1);
    /* marks not confirmed above (the database failed) get one more try */
    settle_now(p, previous);

    previous->batch = next;
    p->current = !p->current;
    *claimed_at = next_claimed_at;
    return claiming;
}

/* ---- the maintenance thread ------------------------------------------------- */

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

    if (s->count == s->capacity) {
        size_t capacity = s->capacity ? s->capacity * 2 : 16;
        struct metrics_queue_sample *items = realloc(s->items, capacity * sizeof(*items));

        if (items == NULL)
            return; /* a sample short of a queue only leaves its gauge at 0 */
        s->items = items;
        s->capacity = capacity;
    }
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
    PHASE_FAILED, /* the database failed and the connection is dropped */
};

/* Reaps expired leases, up to REAP_MAX_ROUNDS x REAP_LIMIT rows. */
static enum phase_result
phase_reap(struct maintenance *m)
{
    relay *r = m->db.relay;
    struct outbox_reap_result reaped;
    struct outbox_error err;

    for (int round = 0; round < REAP_MAX_ROUNDS && !stopping(r); round++) {
        if (outbox_reap(m->db.store, REAP_LIMIT, REAP_RETRY_SECONDS, &reaped, &err) != 0) {
            database_failed(&m->db, &err);
            return PHASE_FAILED;
        }
        if (reaped.ready + reaped.dead > 0)
            log_event(OUTBOX_LOG_INFO, "reaped expired leases", "ready=%zu dead=%zu",
                      reaped.ready, reaped.dead);
        metrics_add(r->metrics, METRICS_ROWS_REAPED, reaped.ready + reaped.dead);
        if (reaped.ready + reaped.dead < REAP_LIMIT) {
            atomic_store(&r->reaped, 1);
            return PHASE_DONE;
        }
    }
    return PHASE_MORE;
}

/* Releases held rows whose key's head finished while they were being inserted. */
static enum phase_result
phase_release_waiting(struct maintenance *m)
{
    struct outbox_error err;
    size_t released = 0;

    if (outbox_release_waiting(m->db.store, SWEEP_KEY_LIMIT, &released, &err) != 0) {
        database_failed(&m->db, &err);
        return PHASE_FAILED;
    }
    if (released > 0)
        log_event(OUTBOX_LOG_INFO, "released rows waiting for a finished key", "rows=%zu",
                  released);
    return PHASE_DONE;
}

/*
 * Deletes succeeded rows older than --retention: batches of CLEANUP_LIMIT
 * rows, each its own short transaction, back to back for up to
 * CLEANUP_RUN_SECONDS; with old rows left the phase runs again at once
 * (after the other phases due), so cleanup keeps up with any drain rate.
 * A batch that finds another relay's (or a purge's) batch holding the
 * cleanup lock leaves the work to it until the next interval.
 */
static enum phase_result
phase_cleanup(struct maintenance *m)
{
    relay *r = m->db.relay;
    struct outbox_cleanup_result cleaned = {.locked = true};
    double started = clock_monotonic_seconds();
    struct outbox_error err;
    char cutoff[64];

    if (r->config->retention_seconds <= 0)
        return PHASE_DONE;
    if (m->cleaned == 0)
        m->cleanup_started = started;
    if (outbox_store_cleanup_cutoff(m->db.store, r->config->retention_seconds, cutoff,
                                    sizeof(cutoff), &err) != 0) {
        database_failed(&m->db, &err);
        return PHASE_FAILED;
    }
    do {
        if (outbox_store_cleanup_batch(m->db.store, cutoff, CLEANUP_LIMIT, &cleaned, &err) != 0) {
            database_failed(&m->db, &err);
            return PHASE_FAILED;
        }
        m->cleaned += cleaned.deleted;
        metrics_add(r->metrics, METRICS_ROWS_DELETED, cleaned.deleted);
    } while (cleaned.locked && cleaned.deleted == CLEANUP_LIMIT && !stopping(r) &&
             clock_monotonic_seconds() - started < CLEANUP_RUN_SECONDS);
    if (cleaned.locked && cleaned.deleted == CLEANUP_LIMIT)
        return PHASE_MORE;
    if (m->cleaned > 0)
        log_event(OUTBOX_LOG_INFO, "deleted old succeeded rows", "rows=%zu seconds=%.1f",
                  m->cleaned, clock_monotonic_seconds() - m->cleanup_started);
    m->cleaned = 0;
    return PHASE_DONE;
}

/* Samples the size and cleanup figures of outbox.job for the gauges. */
static enum phase_result
phase_table_sample(struct maintenance *m)
{
    relay *r = m->db.relay;
    struct outbox_table_sample t;
    struct outbox_error err;

    if (outbox_store_sample_table(m->db.store, r->config->retention_seconds, &t, &err) != 0) {
        database_failed(&m->db, &err);
        return PHASE_FAILED;
    }
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
phase_sample(struct maintenance *m)
{
    relay *r = m->db.relay;
    struct outbox_horizon horizon;
    struct outbox_error err;
    struct samples samples = {0};
    int rc = outbox_sample_backlog(m->db.store, record_backlog, &samples, &err);

    if (rc == 0)
        metrics_set_queue_samples(r->metrics, samples.items, samples.count);
    for (size_t i = 0; i < samples.count; i++)
        free((char *)samples.items[i].queue);
    free(samples.items);
    if (rc != 0 || outbox_sample_horizon(m->db.store, &horizon, &err) != 0) {
        database_failed(&m->db, &err);
        return PHASE_FAILED;
    }
    metrics_set_horizon_age(r->metrics, horizon.found ? horizon.age_seconds : 0);
    if (horizon.found && r->config->horizon_warning_seconds > 0 &&
        horizon.age_seconds > r->config->horizon_warning_seconds)
        log_event_limited("xmin-horizon", OUTBOX_LOG_WARN,
                          "an open transaction holds back vacuum; the queue will slow down",
                          "age=%.0fs pid=%d application=\"%s\" state=\"%s\"", horizon.age_seconds,
                          horizon.pid, horizon.application, horizon.state);
    return PHASE_DONE;
}

/* The phases, like pg_cron's loop: each named, bounded, run when due. */
static const struct phase {
    const char *name;
    double every_seconds;
    enum phase_result (*run)(struct maintenance *m);
} PHASES[PHASE_COUNT] = {
    [PHASE_REAP] = {"reap", REAP_EVERY_SECONDS, phase_reap},
    [PHASE_RELEASE_WAITING] = {"release-waiting", SWEEP_EVERY_SECONDS, phase_release_waiting},
    [PHASE_CLEANUP] = {"cleanup", CLEANUP_EVERY_SECONDS, phase_cleanup},
    [PHASE_SAMPLE] = {"sample", SAMPLE_EVERY_SECONDS, phase_sample},
    [PHASE_TABLE_SAMPLE] = {"table-sample", TABLE_SAMPLE_EVERY_SECONDS, phase_table_sample},
};

/* Runs one phase and schedules its next run. */
static enum phase_result
run_phase(struct maintenance *m, enum maintenance_phase phase)
{
    const struct phase *ph = &PHASES[phase];
    double started = clock_monotonic_seconds();
    enum phase_result result = ph->run(m);
    double finished = clock_monotonic_seconds();

    log_event(OUTBOX_LOG_DEBUG, "maintenance phase ran", "phase=%s seconds=%.3f result=%s",
              ph->name, finished - started,
              result == PHASE_DONE ? "done" : result == PHASE_MORE ? "more" : "failed");
    m->due[phase] = result == PHASE_DONE   ? finished + ph->every_seconds
                    : result == PHASE_MORE ? finished
                                           : finished + PHASE_RETRY_SECONDS;
    return result;
}

/* The maintenance thread goes on while the relay runs and a pipeline works. */
static bool
maintenance_goes_on(relay *r)
{
    return !stopping(r) && atomic_load(&r->pipelines_running) > 0;
}

/* Called by each thread as it returns; the last one tells the caller. */
static void
thread_returned(relay *r)
{
    if (atomic_fetch_sub(&r->running, 1) == 1 && r->finished != NULL)
        r->finished(r->finished_arg);
}

/*
 * Starts the phases that are due, in order. A whole pass (the first one of
 * --once) runs each phase until it is done, even after the pipelines
 * returned, so --once reaps, cleans up and samples completely.
 */
static void
run_due_phases(struct maintenance *m, bool whole)
{
    relay *r = m->db.relay;

    for (int i = 0; i < PHASE_COUNT; i++) {
        enum phase_result result = PHASE_DONE;

        if (m->db.store == NULL || stopping(r) || (!whole && !maintenance_goes_on(r)))
            return;
        if (clock_monotonic_seconds() < m->due[i])
            continue;
        do
            result = run_phase(m, (enum maintenance_phase)i);
        while (whole && result == PHASE_MORE && !stopping(r));
    }
}

static void *
maintenance_run(void *arg)
{
    relay *r = arg;
    struct maintenance *m = &r->maintenance;
    bool whole = r->config->once;

    if (connect_store(&m->db, true) != 0)
        goto done;
    while (whole || maintenance_goes_on(r)) {
        double next;

        if (m->db.store == NULL && connect_store(&m->db, false) != 0)
            break;
        run_due_phases(m, whole);
        if (m->db.store == NULL)
            continue; /* reconnect; a whole pass starts over */
        whole = false;
        /* wait for the next phase due */
        next = m->due[0];
        for (int i = 1; i < PHASE_COUNT; i++)
            if (m->due[i] < next)
                next = m->due[i];
        while (maintenance_goes_on(r) && clock_monotonic_seconds() < next) {
            int ms = (int)((next - clock_monotonic_seconds()) * 1000) + 1;

            usleep((useconds_t)(ms < WAIT_SLICE_MS ? ms : WAIT_SLICE_MS) * 1000);
        }
    }
done:
    drop_store(&m->db);
    thread_returned(r);
    return NULL;
}

/* ---- the pipeline thread ---------------------------------------------------- */

/* Waits for work: a NOTIFY, or the adaptive poll interval. */
static void
wait_for_work(struct pipeline *p, int wait_ms)
{
    relay *r = p->relay;
    struct outbox_error err;
    bool notified = false;

    while (wait_ms > 0 && !stopping(r) && !notified) {
        int slice = wait_ms < WAIT_SLICE_MS ? wait_ms : WAIT_SLICE_MS;

        if (outbox_store_wait(p->db.store, slice, &notified, &err) != 0) {
            store_failed(p, &err);
            return;
        }
        wait_ms -= slice;
    }
    if (clock_monotonic_seconds() - p->last_sink_idle >= SINK_IDLE_EVERY_SECONDS) {
        p->last_sink_idle = clock_monotonic_seconds();
        if (sink_idle(p->sink, &err) != 0)
            sink_lost(p, &err);
    }
}

/*
 * --once must end: a pipeline that connects but moves no row (every claim
 * fails, a lock holds it, the broker defers every row because too few
 * replicas acknowledge) gives up when no turn has published a row (or failed
 * one through its own fault) for ONCE_CONNECT_BUDGET_SECONDS, naming the
 * last cause.
 * True when it gave up (set_fatal done).
 */
static bool
once_stalled(struct pipeline *p)
{
    struct outbox_error err;

    if (!p->relay->config->once ||
        clock_monotonic_seconds() - p->progress_at < ONCE_CONNECT_BUDGET_SECONDS)
        return false;
    if (p->cause.code == OUTBOX_ERR_BUSY || p->cause.code == OUTBOX_ERR_TIMEOUT)
        outbox_error_set(&err, OUTBOX_ERR_CONNECTION,
                         "--once: no row moved for %.0f s (statements waiting, for a lock on"
                         " outbox.job held by another session?), giving up: %s",
                         ONCE_CONNECT_BUDGET_SECONDS, p->cause.message);
    else
        outbox_error_set(&err, OUTBOX_ERR_CONNECTION, "--once: no row moved for %.0f s, giving up: %s",
                         ONCE_CONNECT_BUDGET_SECONDS, p->cause.message);
    set_fatal(p->relay, &err);
    return true;
}

/* --once: pipelines claim only after the maintenance thread reaped expired leases. */
static void
wait_for_first_reap(relay *r)
{
    while (!atomic_load(&r->reaped) && !stopping(r))
        usleep(10 * 1000);
}

/*
 * A broker that defers rows while it stays connected (Redis BUSY or
 * LOADING, a cluster slot nobody serves) would have them claimed again at
 * once: the pipeline waits 50 ms, doubling per turn that defers again, up
 * to DEFERRED_PAUSE_MAX_MS, before the next turn releases them and claims
 * (in that order, so the claim can take them again). A lost connection has
 * its own backoff in connect_sink().
 */
static void
pause_after_deferral(struct pipeline *p)
{
    const struct settlement *last = &p->settlements[!p->current];

    if (last->released == 0 || !sink_is_connected(p->sink)) {
        p->deferred_pause_ms = 0;
        return;
    }
    p->deferred_pause_ms = p->deferred_pause_ms == 0 ? 50 : p->deferred_pause_ms * 2;
    if (p->deferred_pause_ms > DEFERRED_PAUSE_MAX_MS)
        p->deferred_pause_ms = DEFERRED_PAUSE_MAX_MS;
    sleep_ms(p->relay, p->deferred_pause_ms);
}

static void *
pipeline_run(void *arg)
{
    struct pipeline *p = arg;
    relay *r = p->relay;
    const struct relay_config *c = r->config;
    int idle_ms = 0;
    double last_work = 0, claimed_at = 0;

    if (connect_ends(&p->db, p, true, true, true) != 0)
        goto done;
    if (c->once)
        wait_for_first_reap(r);
    p->progress_at = clock_monotonic_seconds();
    outbox_error_set(&p->cause, OUTBOX_ERR_CONNECTION, "no claim succeeded");

    while (!stopping(r)) {
        const struct settlement *current, *previous;

        if (once_stalled(p))
            break;
        /* connect */
        if (p->db.store == NULL && connect_store(&p->db, false) != 0)
            break;
        if (!sink_is_connected(p->sink)) {
            /* published rows are marked and claimed ones handed back before the outage */
            settle_now(p, &p->settlements[!p->current]);
            give_back(p, &p->settlements[p->current].batch);
            if (connect_sink(p, false) != 0)
                break;
        }
        metrics_loop_turned(r->metrics);

        /* turn: publish the current batch, mark the previous one, claim the next */
        if (!relay_turn(p, &claimed_at))
            continue; /* no claim made: reconnect, or stop */
        /* the batch just published, not marked yet: some of its rows went out (or failed) */
        if (p->settlements[!p->current].accepted + p->settlements[!p->current].failed > 0)
            p->progress_at = clock_monotonic_seconds();
        pause_after_deferral(p);
        current = &p->settlements[p->current];
        previous = &p->settlements[!p->current];
        if (current->batch.count > 0 || has_rows(previous)) {
            idle_ms = 0;
            last_work = clock_monotonic_seconds();
            continue;
        }

        /* or wait */
        outbox_batch_release_memory(&p->settlements[p->current].batch);
        if (c->once)
            break;
        /*
         * Adaptive polling: 1, 2, 4 ... ms, up to BUSY_POLL_MAX_MS while
         * rows came in the last BUSY_WINDOW_SECONDS (a lull in a steady
         * stream must not cost its next rows a long sleep), and up to
         * --poll-interval once the queue has been quiet for longer.
         */
        idle_ms = idle_ms == 0 ? 1 : idle_ms * 2;
        if (clock_monotonic_seconds() - last_work < BUSY_WINDOW_SECONDS && idle_ms > BUSY_POLL_MAX_MS)
            idle_ms = BUSY_POLL_MAX_MS;
        if (idle_ms > c->poll_interval_ms)
            idle_ms = c->poll_interval_ms;
        wait_for_work(p, idle_ms);
    }
    /* the last published batch is marked; a claim made for the next turn goes back */
    settle_now(p, &p->settlements[!p->current]);
    give_back(p, &p->settlements[p->current].batch);

done:
    sink_close(p);
    drop_store(&p->db);
    atomic_fetch_sub(&r->pipelines_running, 1);
    thread_returned(r);
    return NULL;
}

/* ---- lifecycle ----------------------------------------------------------------- */

/* host:pid:uuid, so a restarted relay never inherits its predecessor's leases. */
static void
make_worker_prefix(char *out, size_t size)
{
    char host[64] = "localhost";
    char uuid_text[37];
    uuid_t uuid;

    gethostname(host, sizeof(host) - 1);
    host[sizeof(host) - 1] = '\0';
    uuid_generate(uuid);
    uuid_unparse_lower(uuid, uuid_text);
    snprintf(out, size, "%s:%d:%s", host, (int)getpid(), uuid_text);
}

static void
settlement_free(struct settlement *st)
{
    outbox_batch_release_memory(&st->batch);
    free(st->outcomes);
    free(st->leases);
    free(st->lease_queues);
    free(st->failures);
    free(st->failure_queues);
    free(st->releases);
    free(st->done);
    free(st->dead);
}

static int
settlement_init(struct settlement *st, size_t n)
{
    st->outcomes = calloc(n, sizeof(*st->outcomes));
    st->leases = calloc(n, sizeof(*st->leases));
    st->lease_queues = calloc(n, sizeof(*st->lease_queues));
    st->failures = calloc(n, sizeof(*st->failures));
    st->failure_queues = calloc(n, sizeof(*st->failure_queues));
    st->releases = calloc(n, sizeof(*st->releases));
    st->done = calloc(n, sizeof(*st->done));
    st->dead = calloc(n, sizeof(*st->dead));
    return st->outcomes && st->leases && st->lease_queues && st->failures && st->failure_queues &&
                   st->releases && st->done && st->dead
               ? 0
               : -1;
}

static void
pipeline_clear(struct pipeline *p)
{
    sink_free(p->sink);
    outbox_store_free(p->db.store);
    free(p->messages);
    free(p->leases);
    free(p->done);
    free(p->lags);
    settlement_free(&p->settlements[0]);
    settlement_free(&p->settlements[1]);
}

relay *
relay_new(const struct relay_config *config, struct metrics *m, struct outbox_error *err)
{
    relay *r = calloc(1, sizeof(*r));
    size_t n = (size_t)config->batch_size;

    if (r == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        return NULL;
    }
    r->config = config;
    r->metrics = m;
    pthread_mutex_init(&r->fatal_lock, NULL);
    make_worker_prefix(r->worker_prefix, sizeof(r->worker_prefix));
    r->maintenance.db.relay = r;
    r->maintenance.db.seed = (unsigned int)getpid() ^ (unsigned int)time(NULL) ^ 0x9e3779b9u;
    snprintf(r->maintenance.db.worker_id, sizeof(r->maintenance.db.worker_id), "%s/maintenance",
             r->worker_prefix);
    snprintf(r->maintenance.db.who, sizeof(r->maintenance.db.who), "thread=maintenance");
    r->pipelines = calloc((size_t)config->concurrency, sizeof(*r->pipelines));
    if (r->pipelines == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        goto fail;
    }
    for (int i = 0; i < config->concurrency; i++) {
        struct pipeline *p = &r->pipelines[i];
        struct sink_options options = config->broker;

        options.connect_timeout_ms = 5000;
        options.io_timeout_ms = 10000;
        options.heartbeat_seconds = 30;
        options.redelivery_horizon_ms =
            (int64_t)((config->lease_seconds + config->retry_max_seconds) * 1000.0);
        p->relay = r;
        p->index = i;
        p->db.relay = r;
        p->db.seed = (unsigned int)getpid() ^ (unsigned int)(i * 7919) ^ (unsigned int)time(NULL);
        snprintf(p->db.worker_id, sizeof(p->db.worker_id), "%s/%d", r->worker_prefix, i);
        snprintf(p->db.who, sizeof(p->db.who), "pipeline=%d", i);
        p->sink = sink_new(&options, err);
        p->messages = calloc(n, sizeof(*p->messages));
        p->leases = calloc(n, sizeof(*p->leases));
        p->done = calloc(n, sizeof(*p->done));
        p->lags = calloc(n, sizeof(*p->lags));
        if (p->sink == NULL)
            goto fail;
        if (p->messages == NULL || p->leases == NULL || p->done == NULL || p->lags == NULL ||
            settlement_init(&p->settlements[0], n) != 0 ||
            settlement_init(&p->settlements[1], n) != 0) {
            outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
            goto fail;
        }
    }
    {
        const sink *first = r->pipelines[0].sink;
        const char *names[METRICS_MAX_ENDPOINTS];
        size_t count = sink_endpoint_count(first);

        for (size_t i = 0; i < count && i < METRICS_MAX_ENDPOINTS; i++)
            names[i] = sink_endpoint_name(first, i);
        if (metrics_set_endpoints(m, names, count) != 0) {
            outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
            goto fail;
        }
    }
    return r;

fail:
    relay_free(r);
    return NULL;
}

void
relay_free(relay *r)
{
    if (r == NULL)
        return;
    for (int i = 0; r->pipelines != NULL && i < r->config->concurrency; i++)
        pipeline_clear(&r->pipelines[i]);
    free(r->pipelines);
    outbox_store_free(r->maintenance.db.store);
    pthread_mutex_destroy(&r->fatal_lock);
    free(r);
}

int
relay_check(relay *r, FILE *report, bool *configuration, struct outbox_error *err)
{
    struct pipeline *p = &r->pipelines[0];
    outbox_store *store = outbox_store_connect(r->config->database_url, p->db.worker_id, err);
    size_t count = sink_endpoint_count(p->sink), reached = 0;
    struct outbox_error endpoint_err, refused = {.code = OUTBOX_OK}, missing = {.code = OUTBOX_OK};
    int rc;

    *configuration = false;
    if (store == NULL) {
        /* a missing privilege, or a role whose sessions are read-only */
        *configuration = strcmp(err->sqlstate, "42501") == 0 ||
                         (err->code == OUTBOX_ERR_CONFIG && strcmp(err->sqlstate, "25006") == 0);
        return -1;
    }
    rc = outbox_store_check_privileges(store, err);
    outbox_store_free(store);
    if (rc != 0) {
        *configuration = err->code == OUTBOX_ERR_CONFIG;
        return -1;
    }
    if (count <= 1) {
        if (sink_connect(p->sink, err) != 0)
            return -1;
        rc = sink_check(p->sink, err);
        if (sink_replicas(p->sink)[0] != '\0')
            fprintf(report, "broker replicas: %s (--redis-wait %d)\n", sink_replicas(p->sink),
                    sink_replicas_to_wait(p->sink));
        sink_disconnect(p->sink);
        if (rc != 0) {
            *configuration = err->code == OUTBOX_ERR_CONFIG;
            return -1;
        }
        return 0;
    }
    /* every endpoint of the list, so that one down is seen before it matters */
    for (size_t i = 0; i < count; i++) {
        const char *name = sink_endpoint_name(p->sink, i);

        if (sink_connect_endpoint(p->sink, i, &endpoint_err) != 0) {
            fprintf(report, "broker endpoint %s: skipped: %s\n", name, endpoint_err.message);
            if (endpoint_err.code == OUTBOX_ERR_CONFIG)
                refused = endpoint_err;
        } else if (sink_check(p->sink, &endpoint_err) != 0) {
            fprintf(report, "broker endpoint %s: %s: %s\n", name,
                    endpoint_err.code == OUTBOX_ERR_CONFIG ? "misses what publishing needs"
                                                           : "skipped",
                    endpoint_err.message);
            if (endpoint_err.code == OUTBOX_ERR_CONFIG)
                missing = endpoint_err;
        } else {
            fprintf(report, "broker endpoint %s: reachable\n", name);
            reached++;
        }
        sink_disconnect(p->sink);
    }
    /* a refused login, a missing vhost or exchange is wrong even when other nodes answered */
    if (refused.code != OUTBOX_OK) {
        *err = refused;
        return -1;
    }
    if (missing.code != OUTBOX_OK) {
        *err = missing;
        *configuration = true;
        return -1;
    }
    if (reached == 0)
        return outbox_error_set(err, OUTBOX_ERR_CONNECTION,
                                "no endpoint of %s answered (%zu tried), the last: %s",
                                sink_display_url(p->sink), count, endpoint_err.message);
    return 0;
}

/*
 * Options of the broker not in use do nothing; one warning line at start
 * says which (config_parse listed them), so a mistyped --broker or a
 * copied option is noticed.
 */
static void
warn_other_broker_options(const relay *r)
{
    if (r->config->ignored_options[0] != '\0')
        log_event(OUTBOX_LOG_WARN, "options for the other broker are ignored",
                  "broker=%s ignored=\"%s\"", sink_kind(r->pipelines[0].sink),
                  r->config->ignored_options);
}

int
relay_start(relay *r, void (*finished)(void *arg), void *arg, struct outbox_error *err)
{
    r->finished = finished;
    r->finished_arg = arg;
    log_event(OUTBOX_LOG_INFO, "relay starting",
              "worker=%s broker=%s concurrency=%d batch_size=%d lease=%ds", r->worker_prefix,
              sink_display_url(r->pipelines[0].sink), r->config->concurrency, r->config->batch_size,
              r->config->lease_seconds);
    warn_other_broker_options(r);
    for (int i = 0; i < r->config->concurrency; i++) {
        struct pipeline *p = &r->pipelines[i];

        atomic_fetch_add(&r->running, 1);
        atomic_fetch_add(&r->pipelines_running, 1);
        if (pthread_create(&p->thread, NULL, pipeline_run, p) != 0) {
            atomic_fetch_sub(&r->pipelines_running, 1);
            atomic_fetch_sub(&r->running, 1);
            relay_stop(r);
            return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "unable to start pipeline %d", i);
        }
        p->started = true;
    }
    atomic_fetch_add(&r->running, 1);
    if (pthread_create(&r->maintenance.thread, NULL, maintenance_run, r) != 0) {
        atomic_fetch_sub(&r->running, 1);
        relay_stop(r);
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "unable to start the maintenance thread");
    }
    r->maintenance.started = true;
    return 0;
}

void
relay_stop(relay *r)
{
    atomic_store(&r->stopping, 1);
}

bool
relay_finished(relay *r)
{
    return atomic_load(&r->running) == 0;
}

int
relay_join(relay *r, struct outbox_error *err)
{
    for (int i = 0; i < r->config->concurrency; i++) {
        if (r->pipelines[i].started)
            pthread_join(r->pipelines[i].thread, NULL);
        r->pipelines[i].started = false;
    }
    if (r->maintenance.started)
        pthread_join(r->maintenance.thread, NULL);
    r->maintenance.started = false;
    if (atomic_load(&r->fatal)) {
        *err = r->fatal_error;
        return -1;
    }
    return 0;
}
