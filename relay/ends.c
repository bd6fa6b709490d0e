/*
 * ends.c - a thread's two ends, the database and the broker: connecting
 * with backoff, reacting to a failure, closing.
 *
 * Every (re)connect of every thread goes through ends_connect(), which
 * tries each missing end on every attempt so that health always knows
 * both. A failed end is dropped here and reconnected by the thread's loop;
 * rows in flight keep their lease and are never lost.
 */
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
#include "job_message.h"
#include "json.h"
#include "log.h"
#include "outbox.h"
#include "ends.h"
#include "sink.h"
#include "store_connect.h"
#include "wait.h"

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
    const char *who = arg;
    size_t len = strlen(message);

    while (len > 0 && (message[len - 1] == '\n' || message[len - 1] == ' '))
        len--;
    log_event_limited("database-notice", OUTBOX_LOG_WARN, "database notice", "%s notice=\"%.*s\"",
                      who, (int)len, message);
}

/* Tries of a broker login refused at a relay's start before the refusal is fatal. */
#define START_LOGIN_TRIES 3

/* What one connection attempt came to. */
enum attempt_result {
    ATTEMPT_CONNECTED,
    ATTEMPT_FAILED, /* worth another try; logged */
    ATTEMPT_FATAL,  /* bad password, no schema at first start: relay_set_fatal() done */
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

outbox_store *
database_open(const struct relay_config *config, struct metrics *m, const struct database_open *how,
              struct store_identity *identity, struct outbox_error *err)
{
    outbox_store *store = store_connect(how->url, how->worker_id, how->steps, err);

    if (store == NULL)
        return NULL;
    if ((config->delete_on_success && require_delete(store, err) != 0) ||
        store_identity_observe(outbox_store_conn(store), identity, err) != 0) {
        outbox_store_free(store);
        return NULL;
    }
    job_message_warn_history(identity, how->who);
    PQsetNoticeProcessor(outbox_store_conn(store), log_database_notice, (void *)how->who);
    outbox_store_set_block_on_dead_head(store, config->block_on_dead_head);
    outbox_store_set_delete_on_success(store, config->delete_on_success);
    metrics_set_up(m, METRICS_DATABASE, true);
    return store;
}

/* One attempt to connect a thread's store; err says why it failed. */
static enum attempt_result
try_store(struct database *db, enum ends_attempt when, int attempt, struct outbox_error *err)
{
    relay *r = db->relay;
    const struct store_connect_options every_step = {0};
    const struct database_open how = {
        .url = db->url != NULL ? db->url : r->config->database_url,
        .worker_id = db->worker_id,
        .who = db->notice_who != NULL ? db->notice_who : db->who,
        .steps = db->steps != NULL ? db->steps : &every_step,
    };
    bool own = db->faults == DATABASE_FAULT_STOPS_RELAY;
    unsigned long repeats;

    db->store = database_open(r->config, r->metrics, &how, &db->identity, err);
    if (db->store != NULL) {
        db->connects++;
        /* the server in use, so that a failover to another host shows in the log */
        log_event(own ? OUTBOX_LOG_INFO : OUTBOX_LOG_DEBUG, "database connected",
                  "%s server=%s:%s attempts=%d", db->who, PQhost(outbox_store_conn(db->store)),
                  PQport(outbox_store_conn(db->store)), attempt);
        return ATTEMPT_CONNECTED;
    }
    if (!own)
        return ATTEMPT_FAILED; /* a database of a list: the scheduler backs it off, logs, counts */
    metrics_set_up(r->metrics, METRICS_DATABASE, false);
    if (when == ENDS_FIRST && !outbox_error_is_transient(err)) {
        relay_set_fatal(r, err);
        return ATTEMPT_FATAL;
    }
    if (cause_log_due(&(db->log_owner != NULL ? db->log_owner : db)->connect_log, err->message,
                      &repeats))
        log_event(OUTBOX_LOG_WARN, "database unavailable, retrying",
                  "%s error=\"%s\" repeats=%lu", db->who, err->message, repeats);
    metrics_reconnected(r->metrics, METRICS_DATABASE);
    return ATTEMPT_FAILED;
}

/* Like try_store, for a pipeline's broker. */
static enum attempt_result
try_sink(struct pipeline *p, enum ends_attempt when, int attempt, struct outbox_error *err)
{
    relay *r = p->relay;
    struct sink_replication replication;

    if (sink_connect(p->sink, err) == 0) {
        atomic_store(&r->broker_logged_in, 1);
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
        if (sink_replication(p->sink, &replication))
            log_event(OUTBOX_LOG_INFO, "broker replicas", "%s replicas=\"%s\" %s=%d", p->db.who,
                      replication.replicas, replication.wait_field, replication.wait);
        return ATTEMPT_CONNECTED;
    }
    metrics_set_up(r->metrics, METRICS_BROKER, false);
    /*
     * A refused login at start stops the relay, but only when it holds: a
     * server under load or still loading its accounts can refuse a right
     * login once (one pipeline refused while the other got in with the
     * same credentials), and once any pipeline got in the credentials are
     * known to work.
     */
    if (when == ENDS_FIRST && !outbox_error_is_transient(err) && attempt >= START_LOGIN_TRIES &&
        atomic_load(&r->broker_logged_in) == 0) {
        relay_set_fatal(r, err);
        return ATTEMPT_FATAL;
    }
    log_event_limited("broker-connect", OUTBOX_LOG_WARN, "broker unavailable, retrying",
                      "%s broker=%s error=\"%s\"", p->db.who, sink_display_url(p->sink),
                      err->message);
    metrics_reconnected(r->metrics, METRICS_BROKER);
    return ATTEMPT_FAILED;
}

/* Logs a lost broker connection with the endpoint it was on and updates the metrics. */
void
ends_broker_lost(struct pipeline *p, const struct outbox_error *err)
{
    relay *r = p->relay;
    size_t lost = p->sink_counted ? p->endpoint_in_use : sink_endpoint(p->sink);
    char key[112];

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
void
ends_broker_close(struct pipeline *p)
{
    if (p->sink_counted)
        metrics_add_endpoint_connections(p->relay->metrics, p->endpoint_in_use, -1);
    p->sink_counted = false;
    sink_disconnect(p->sink);
}

/*
 * --once: an end stayed unreachable for RELAY_ONCE_CONNECT_BUDGET_SECONDS;
 * stops the relay with why.
 */
static void
give_up_once(relay *r, enum attempt_result store, enum attempt_result broker,
             const struct outbox_error *store_err, const struct outbox_error *sink_err)
{
    struct outbox_error err;

    if (store == ATTEMPT_FAILED && broker == ATTEMPT_FAILED)
        outbox_error_set(&err, OUTBOX_ERR_CONNECTION,
                         "--once: database and broker unreachable for %.0f s, giving up:"
                         " %s; %s",
                         RELAY_ONCE_CONNECT_BUDGET_SECONDS, store_err->message, sink_err->message);
    else if (store == ATTEMPT_FAILED && (store_err->code == OUTBOX_ERR_BUSY ||
                                         store_err->code == OUTBOX_ERR_TIMEOUT))
        /* it answered, but a statement waited past its timeout: say what for */
        outbox_error_set(&err, OUTBOX_ERR_CONNECTION,
                         "--once: database statements waited past their timeout for"
                         " %.0f s (a lock on outbox.job held by another session?),"
                         " giving up: %s",
                         RELAY_ONCE_CONNECT_BUDGET_SECONDS, store_err->message);
    else if (store == ATTEMPT_FAILED && store_err->code == OUTBOX_ERR_CONFIG)
        outbox_error_set(&err, OUTBOX_ERR_CONFIG, "--once: giving up: %s", store_err->message);
    else
        outbox_error_set(&err, OUTBOX_ERR_CONNECTION,
                         "--once: %s unreachable for %.0f s, giving up: %s",
                         store == ATTEMPT_FAILED ? "database" : "broker",
                         RELAY_ONCE_CONNECT_BUDGET_SECONDS,
                         store == ATTEMPT_FAILED ? store_err->message : sink_err->message);
    relay_set_fatal(r, &err);
}

/*
 * While a pipeline waits for its database, its broker connection is still
 * serviced (heartbeats), and its answers count for health: an outage of
 * one end does not make the other look down.
 */
static void
service_broker(struct pipeline *p)
{
    struct outbox_error err;

    if (p == NULL || !sink_is_connected(p->sink))
        return;
    if (sink_idle(p->sink, &err) != 0)
        ends_broker_lost(p, &err);
    else
        metrics_round_trip(p->relay->metrics, METRICS_BROKER);
}

/*
 * The one connect-with-backoff loop, for every slot and both ends.
 * Connects what is not connected (db's store when want has ENDS_STORE, slot p's
 * broker when it has ENDS_SINK), trying each end on every attempt so that
 * /healthz knows the state of both, until both work, the relay stops, or a
 * fatal error (bad password, no schema) at the first attempt of a slot
 * (ENDS_FIRST). A database of a list (DATABASE_FAULT_BACKS_OFF) is tried
 * once, why in p->cause. With --once it gives up after
 * RELAY_ONCE_CONNECT_BUDGET_SECONDS: a one-shot run must end. Returns 0 when connected.
 */
int
ends_connect(struct database *db, struct pipeline *p, unsigned int want, enum ends_attempt when)
{
    relay *r = db->relay;
    double started = clock_monotonic_seconds();

    backoff_reset(&db->reconnect);
    for (int attempt = 1; !relay_stopping(r); attempt++) {
        struct outbox_error store_err, sink_err;
        enum attempt_result store = ATTEMPT_CONNECTED, broker = ATTEMPT_CONNECTED;

        if ((want & ENDS_STORE) && db->store == NULL)
            store = try_store(db, when, attempt, &store_err);
        if (store != ATTEMPT_FATAL && (want & ENDS_SINK) && p != NULL &&
            !sink_is_connected(p->sink))
            broker = try_sink(p, when, attempt, &sink_err);
        if (store == ATTEMPT_FATAL || broker == ATTEMPT_FATAL)
            return -1;
        if (store == ATTEMPT_CONNECTED && broker == ATTEMPT_CONNECTED)
            return 0;
        if (store == ATTEMPT_FAILED && p != NULL)
            p->cause = store_err; /* why, for the caller (a list's backoff, --once) */
        if (db->faults == DATABASE_FAULT_BACKS_OFF && store == ATTEMPT_FAILED)
            return -1;
        /* --once gives up, naming every end it could not reach */
        if (r->config->once && !db->waits_out_once &&
            clock_monotonic_seconds() - started >= RELAY_ONCE_CONNECT_BUDGET_SECONDS) {
            give_up_once(r, store, broker, &store_err, &sink_err);
            return -1;
        }
        service_broker(p);
        if (p != NULL)
            metrics_loop_turned(r->metrics); /* waiting for an end is no stall (/livez) */
        wait_until(&r->stop, -1, clock_monotonic_seconds() + backoff_next(&db->reconnect));
    }
    return -1;
}

/* Connects a thread's store; see ends_connect(). */
int
ends_connect_store(struct database *db, enum ends_attempt when)
{
    return ends_connect(db, NULL, ENDS_STORE, when);
}

void
ends_drop_store(struct database *db)
{
    outbox_store_free(db->store);
    db->store = NULL;
    metrics_set_up(db->relay->metrics, METRICS_DATABASE, false);
}

/* Connects a pipeline's broker; see ends_connect(). */
int
ends_connect_sink(struct pipeline *p, enum ends_attempt when)
{
    return ends_connect(&p->db, p, ENDS_SINK, when);
}

/*
 * Reacts to a failed store call. A missing schema or refused credentials stop
 * the relay; anything else (a lost connection, a timeout, a statement the
 * server rejected, a privilege revoked) drops the connection and carries on
 * after reconnecting:
 * the rows involved keep their lease and come back after it, never lost.
 */
void
ends_database_failed(struct database *db, const struct outbox_error *err)
{
    unsigned long repeats;

    /*
     * A privilege revoked while the relay runs is an operator's change that
     * the next grant undoes: the connection is dropped (health says the
     * database is down) and reconnecting, which checks the privileges, is
     * retried with backoff. At the first start it is fatal (try_store).
     */
    if (db->faults == DATABASE_FAULT_STOPS_RELAY &&
        (err->code == OUTBOX_ERR_SCHEMA ||
         (err->code == OUTBOX_ERR_CONFIG && strcmp(err->sqlstate, "42501") != 0))) {
        relay_set_fatal(db->relay, err);
        return;
    }
    if (cause_log_due(&(db->log_owner != NULL ? db->log_owner : db)->error_log, err->message,
                      &repeats))
        log_event(outbox_error_is_transient(err) ? OUTBOX_LOG_WARN : OUTBOX_LOG_ERROR,
                  "database error, reconnecting", "%s error=\"%s\" repeats=%lu", db->who,
                  err->message, repeats);
    ends_drop_store(db);
}

/* ends_database_failed() of the connection db that pipeline p serves, err its cause. */
void
ends_store_failed(struct pipeline *p, struct database *db, const struct outbox_error *err)
{
    p->cause = *err;
    ends_database_failed(db, err);
}
