/*
 * relay.c - the relay: its slots made, started, stopped and joined; --check.
 *
 * The relay owns every slot's state (relay_state.h); the slots run in
 * scheduler.c, which gives each the database to serve next, of a list or
 * the relay's own. The first fatal error of any slot is kept and stops
 * them all.
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

#include "cause_log.h"
#include "clock.h"
#include "error.h"
#include "json.h"
#include "log.h"
#include "outbox.h"
#include "relay_state.h"
#include "scheduler.h"
#include "settle.h"
#include "sink.h"
#include "wait.h"

#include <uuid/uuid.h>

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
pipeline_clear(struct pipeline *p)
{
    sink_free(p->sink);
    outbox_store_free(p->db.store);
    free(p->messages);
    cloudevents_free(p->cloudevents);
    otel_batch_free(p->otel);
    free(p->leases);
    free(p->done);
    free(p->lags);
    settlement_free(&p->settlements[0]);
    settlement_free(&p->settlements[1]);
    order_checks_clear(&p->checks);
}

/* The latches every wait of the relay's threads ends on (wait.h). */
static int
open_latches(relay *r, struct outbox_error *err)
{
    r->stop.fd = r->reaped.fd = -1;
    if (wait_latch_open(&r->stop, err) != 0 || wait_latch_open(&r->reaped, err) != 0)
        return -1;
    return 0;
}

/* Slot i of r: its names, its databases' reconnect pace, its sink and batch buffers. */
static int
pipeline_init(relay *r, int i, struct outbox_error *err)
{
    struct pipeline *p = &r->pipelines[i];
    size_t n = (size_t)r->config->batch_size;

    p->relay = r;
    p->index = i;
    p->db.relay = r;
    p->db.seed = (unsigned int)getpid() ^ (unsigned int)(i * 7919) ^ (unsigned int)time(NULL);
    p->db.reconnect =
        backoff_make(RELAY_RECONNECT_FIRST_SECONDS, RELAY_RECONNECT_MAX_SECONDS,
                     p->db.seed ^ 0x85ebca6bu);
    snprintf(p->db.worker_id, sizeof(p->db.worker_id), "%s/%d", r->worker_prefix, i);
    snprintf(p->db.who, sizeof(p->db.who), "pipeline=%d", i);
    p->sink = config_sink_new(r->config, err);
    p->messages = calloc(n, sizeof(*p->messages));
    p->leases = calloc(n, sizeof(*p->leases));
    p->done = calloc(n, sizeof(*p->done));
    p->lags = calloc(n, sizeof(*p->lags));
    p->cloudevents = cloudevents_new(r->config->cloudevents, r->config->cloudevents_source);
    p->otel = otel_enabled() ? otel_batch_new() : NULL;
    if (p->sink == NULL)
        return -1;
    if ((p->cloudevents == NULL && r->config->cloudevents != CLOUDEVENTS_OFF) ||
        (p->otel == NULL && otel_enabled()) || p->messages == NULL || p->leases == NULL ||
        p->done == NULL || p->lags == NULL ||
        settlement_init(&p->settlements[0], n) != 0 || settlement_init(&p->settlements[1], n) != 0)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    return 0;
}

/* The broker endpoints' names, for the metrics' endpoint labels. */
static int
name_endpoints(relay *r, struct outbox_error *err)
{
    const sink *first = r->pipelines[0].sink;
    const char *names[METRICS_MAX_ENDPOINTS];
    size_t count = sink_endpoint_count(first);

    for (size_t i = 0; i < count && i < METRICS_MAX_ENDPOINTS; i++)
        names[i] = sink_endpoint_name(first, i);
    if (metrics_set_endpoints(r->metrics, names, count) != 0)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    return 0;
}

relay *
relay_new(const struct relay_config *config, struct metrics *m, struct outbox_error *err)
{
    relay *r = calloc(1, sizeof(*r));

    if (r == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        return NULL;
    }
    r->config = config;
    r->metrics = m;
    pthread_mutex_init(&r->fatal_lock, NULL);
    if (open_latches(r, err) != 0)
        goto fail;
    make_worker_prefix(r->worker_prefix, sizeof(r->worker_prefix));
    r->pipeline_count = scheduler_slot_count(config);
    r->pipelines = calloc((size_t)r->pipeline_count, sizeof(*r->pipelines));
    if (r->pipelines == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        goto fail;
    }
    for (int i = 0; i < r->pipeline_count; i++)
        if (pipeline_init(r, i, err) != 0)
            goto fail;
    if (name_endpoints(r, err) != 0)
        goto fail;
    r->scheduler = scheduler_new(r, err); /* streams too, on the slots (scheduler_stream.h) */
    if (r->scheduler == NULL)
        goto fail;
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
    for (int i = 0; r->pipelines != NULL && i < r->pipeline_count; i++)
        pipeline_clear(&r->pipelines[i]);
    scheduler_free(r->scheduler);
    free(r->pipelines);
    wait_latch_close(&r->stop);
    wait_latch_close(&r->reaped);
    pthread_mutex_destroy(&r->fatal_lock);
    free(r);
}

/* --check of a broker URL with one endpoint (or whose endpoints the sink uses together). */
static int
check_sink(sink *broker, FILE *report, bool *configuration, struct outbox_error *err)
{
    struct sink_replication replication;
    int rc;

    if (sink_connect(broker, err) != 0)
        return -1;
    rc = sink_check(broker, err);
    if (sink_replication(broker, &replication))
        fprintf(report, "broker replicas: %s (%s %d)\n", replication.replicas,
                replication.wait_option, replication.wait);
    sink_disconnect(broker);
    if (rc != 0) {
        *configuration = err->code == OUTBOX_ERR_CONFIG;
        return -1;
    }
    return 0;
}

/* --check of every endpoint of the list, so that one down is seen before it matters. */
static int
check_endpoints(sink *broker, size_t count, FILE *report, bool *configuration,
                struct outbox_error *err)
{
    struct outbox_error endpoint_err, refused = {.code = OUTBOX_OK}, missing = {.code = OUTBOX_OK};
    size_t reached = 0;

    for (size_t i = 0; i < count; i++) {
        const char *name = sink_endpoint_name(broker, i);

        if (sink_connect_endpoint(broker, i, &endpoint_err) != 0) {
            fprintf(report, "broker endpoint %s: skipped: %s\n", name, endpoint_err.message);
            if (endpoint_err.code == OUTBOX_ERR_CONFIG)
                refused = endpoint_err;
        } else if (sink_check(broker, &endpoint_err) != 0) {
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
        sink_disconnect(broker);
    }
    /* a refused login, a missing vhost or what publishing needs is wrong even when others answered */
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
                                sink_display_url(broker), count, endpoint_err.message);
    return 0;
}

int
relay_check(relay *r, FILE *report, bool *configuration, struct outbox_error *err)
{
    struct pipeline *p = &r->pipelines[0];
    outbox_store *store = outbox_store_connect(r->config->database_url, p->db.worker_id, err);
    size_t count = sink_endpoint_count(p->sink);
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
    if (count <= 1)
        return check_sink(p->sink, report, configuration, err);
    return check_endpoints(p->sink, count, report, configuration, err);
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
    const struct relay_config *c = r->config;

    r->finished = finished;
    r->finished_arg = arg;
    log_event(OUTBOX_LOG_INFO, "relay starting",
              "worker=%s broker=%s databases=\"%s\" concurrency=%d max_db_connections=%d"
              " slots=%d batch_size=%d lease=%ds",
              r->worker_prefix, sink_display_url(r->pipelines[0].sink),
              scheduler_source(r->scheduler), c->concurrency,
              c->max_db_connections, r->pipeline_count, c->batch_size, c->lease_seconds);
    warn_other_broker_options(r);
    for (int i = 0; i < r->pipeline_count; i++) {
        struct pipeline *p = &r->pipelines[i];

        atomic_fetch_add(&r->running, 1);
        if (pthread_create(&p->thread, NULL, scheduler_slot_run, p) != 0) {
            atomic_fetch_sub(&r->running, 1);
            relay_stop(r);
            return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "unable to start slot %d", i);
        }
        p->started = true;
    }
    return 0;
}

void
relay_stop(relay *r)
{
    atomic_store(&r->stopping, 1);
    wait_latch_set(&r->stop);
    scheduler_stop(r->scheduler);
}

bool
relay_finished(relay *r)
{
    return atomic_load(&r->running) == 0;
}

int
relay_join(relay *r, struct outbox_error *err)
{
    for (int i = 0; i < r->pipeline_count; i++) {
        if (r->pipelines[i].started)
            pthread_join(r->pipelines[i].thread, NULL);
        r->pipelines[i].started = false;
    }
    if (atomic_load(&r->fatal)) {
        *err = r->fatal_error;
        return -1;
    }
    return 0;
}
