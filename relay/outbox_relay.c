/*
 * outbox-relay - publishes committed outbox rows to RabbitMQ, Redis Streams,
 * NATS JetStream or Kafka.
 *
 * main() owns configuration, logging, the metrics endpoint and signals; the
 * pipelines (relay.c) do the work. Signals are blocked in every thread and
 * taken here with sigtimedwait(), so no code runs in a signal handler:
 * the first SIGTERM/SIGINT/SIGHUP stops claiming and lets the batch in
 * flight finish, a second one exits at once (leases make that safe). SIGHUP
 * is a stop too: a lost terminal or a `kill -HUP` meant as a reload must not
 * end the process unlogged with rows left running until their lease ends.
 *
 * Under systemd (Type=notify) main tells the service manager READY=1 once
 * the pipelines run and STOPPING=1 at the first stop signal, and feeds the
 * watchdog while the relay loop turns: the liveness half of /healthz.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "error.h"
#include "exit_status.h"
#include "healthcheck.h"
#include "log.h"
#include "http.h"
#include "metrics.h"
#include "notify.h"
#include "otel.h"
#include "relay.h"
#include "sink.h"

#ifndef OUTBOX_VERSION
#define OUTBOX_VERSION "unknown"
#endif

static pthread_t main_thread;

/* Tells the service manager state; a failure is logged, never fatal. */
static void
notify_manager(const char *state)
{
    struct outbox_error err;

    if (notify_send(state, &err) != 0)
        log_event_limited("notify", OUTBOX_LOG_WARN, "unable to notify the service manager",
                          "state=%s error=\"%s\"", state, err.message);
}

/*
 * How long main waits for a signal between looks at the pipelines: 1 s,
 * shorter when the watchdog needs feeding more often (4 times a period).
 */
static struct timespec
wait_interval(uint64_t watchdog_usec)
{
    uint64_t usec = 1000000;

    if (watchdog_usec > 0 && watchdog_usec / 4 < usec)
        usec = watchdog_usec / 4 > 1000 ? watchdog_usec / 4 : 1000;
    return (struct timespec){.tv_sec = (time_t)(usec / 1000000),
                             .tv_nsec = (long)(usec % 1000000) * 1000};
}

/* Called by the last pipeline to return: wakes main from sigtimedwait. */
static void
wake_main(void *arg)
{
    (void)arg;
    pthread_kill(main_thread, SIGUSR1);
}

/* Whether the log speaks JSON: then the last line of a failure does too. */
static bool log_json;

/* Prints err as the one line of a failure (a log event under --log-format json) and returns status. */
static int
report_exit(int status, const struct outbox_error *err)
{
    if (log_json)
        log_event(OUTBOX_LOG_ERROR, "exiting", "status=%d error=\"%s\"", status, err->message);
    else
        fprintf(stderr, "outbox-relay: %s\n", err->message);
    return status;
}

/* --check: both ends reachable, the role's privileges, the broker's objects; the exit status. */
static int
run_check(relay *r)
{
    struct outbox_error err;
    bool configuration = false;

    if (relay_check(r, stdout, &configuration, &err) != 0)
        return report_exit(configuration ? EXIT_USAGE : EXIT_RUNTIME, &err);
    printf("configuration OK\n");
    return 0;
}

/*
 * --healthcheck: asks the /healthz of the relay serving addr; 0 when it is
 * healthy, 1 when it is not or does not answer (a container's health check).
 */
static int
run_healthcheck(const struct listen_addr *addr)
{
    struct outbox_error err;
    char answer[512];
    int rc;

    if (addr->off) {
        outbox_error_set(&err, OUTBOX_ERR_CONFIG,
                         "--healthcheck: --metrics-addr is off, no /healthz to ask");
        return report_exit(EXIT_USAGE, &err);
    }
    rc = healthcheck_run(addr, answer, sizeof(answer), &err);
    if (rc < 0) {
        struct outbox_error named = err;

        outbox_error_set(&named, err.code, "--healthcheck: %s", err.message);
        return report_exit(EXIT_RUNTIME, &named);
    }
    if (rc > 0) {
        outbox_error_set(&err, OUTBOX_ERR_CONNECTION, "--healthcheck: /healthz answered %s",
                         answer);
        return report_exit(EXIT_RUNTIME, &err);
    }
    printf("%s\n", answer);
    return 0;
}

/* Says which signal a log line is about. */
static const char *
signal_name(int signo)
{
    return signo == SIGTERM ? "SIGTERM" : signo == SIGHUP ? "SIGHUP" : "SIGINT";
}

/* The signals main waits for: SIGTERM, SIGINT, SIGHUP, and SIGUSR1 (the last pipeline returned). */
static void
stop_signals(sigset_t *signals)
{
    sigemptyset(signals);
    sigaddset(signals, SIGTERM);
    sigaddset(signals, SIGINT);
    sigaddset(signals, SIGHUP);
    sigaddset(signals, SIGUSR1);
}

/*
 * Runs the relay until its pipelines return: the first SIGTERM, SIGINT or SIGHUP
 * stops claiming and lets the batch in flight finish, a second exits at
 * once. Tells systemd READY, STOPPING and WATCHDOG along the way. The exit
 * status.
 */
static int
run_until_stopped(relay *r, struct metrics *m)
{
    uint64_t watchdog_usec = notify_watchdog_usec();
    struct outbox_error err;
    int signals_seen = 0;
    sigset_t signals;

    stop_signals(&signals); /* blocked by run_relay() */
    main_thread = pthread_self();

    if (relay_start(r, wake_main, NULL, &err) != 0)
        return report_exit(EXIT_RUNTIME, &err);
    notify_manager("READY=1");
    while (!relay_finished(r)) {
        struct timespec timeout = wait_interval(watchdog_usec);
        int signo = sigtimedwait(&signals, NULL, &timeout);

        /* a stalled loop stops feeding the watchdog, and systemd restarts the relay */
        if (watchdog_usec > 0 && metrics_loop_alive(m))
            notify_manager("WATCHDOG=1");
        if (signo < 0 || signo == SIGUSR1)
            continue; /* look at the pipelines again */
        if (++signals_seen == 1) {
            log_event(OUTBOX_LOG_INFO, "stopping", "signal=%s", signal_name(signo));
            notify_manager("STOPPING=1");
            relay_stop(r);
        } else {
            log_event(OUTBOX_LOG_WARN, "stopping now; rows in flight return after their lease",
                      "signal=%s", signal_name(signo));
            _exit(EXIT_RUNTIME);
        }
    }
    if (relay_join(r, &err) != 0)
        return report_exit(EXIT_RUNTIME, &err);
    log_event(OUTBOX_LOG_INFO, "stopped", NULL);
    return 0;
}

/*
 * What is done before a relay is made: the options read, --help and
 * --version answered, --healthcheck run, the log and the span settings
 * set. True when the program ends here, with *status; config is then
 * cleared.
 */
static bool
ends_before_relay(struct relay_config *config, int argc, char **argv,
                  struct listen_addr *metrics_addr, struct otel_settings *otel, bool *spans,
                  int *status)
{
    struct outbox_error err;

    if (config_parse(config, argc, (const char *const *)argv, &err) != 0) {
        *status = report_exit(EXIT_USAGE, &err);
        return true;
    }
    *status = 0;
    if (config->help)
        config_usage(stdout);
    else if (config->version)
        printf("outbox-relay %s\n", OUTBOX_VERSION);
    else if (listen_addr_parse(config->metrics_addr, metrics_addr, &err) != 0)
        *status = report_exit(EXIT_USAGE, &err); /* the message names --metrics-addr itself */
    else if (config->healthcheck)
        *status = run_healthcheck(metrics_addr);
    else {
        /* config's level and format choices are listed in log.h's order */
        log_configure((enum log_level)config->log_level, (enum log_format)config->log_format,
                      stderr);
        log_json = (enum log_format)config->log_format == OUTBOX_LOG_JSON;
        if (otel_settings_read(config->otel_endpoint, otel, spans, &err) == 0)
            return false;
        *status = report_exit(EXIT_USAGE, &err);
    }
    config_clear(config);
    return true;
}

/* The relay made, then checked (--check) or run with its metrics server until it stops. */
static int
run_relay(const struct relay_config *config, const struct listen_addr *metrics_addr,
          const struct otel_settings *otel, bool spans, struct metrics *m)
{
    struct http_server *server = NULL;
    struct outbox_error err;
    relay *r = NULL;
    sigset_t signals;
    int status;

    /*
     * The stop signals blocked before any thread exists (the span exporter,
     * the scheduler's watch, the metrics server), so that only main takes
     * them: one delivered to a thread that left them at their default ended
     * the relay at once (exit 143) whenever main was not waiting for them.
     */
    stop_signals(&signals);
    if (!config->check)
        pthread_sigmask(SIG_BLOCK, &signals, NULL);
    if (spans && !config->check &&
        otel_start(otel, otel_messaging_system(sink_kind_of_url(config->broker.url)), m, &err) !=
            0) {
        status = report_exit(EXIT_RUNTIME, &err);
    } else if ((r = relay_new(config, m, &err)) == NULL) {
        /* config_parse checked the URL and the options; what is left is about the broker */
        status = report_exit(err.code == OUTBOX_ERR_CONFIG ? EXIT_USAGE : EXIT_RUNTIME, &err);
    } else if (config->check) {
        status = run_check(r);
    } else if (!metrics_addr->off && http_server_start(metrics_addr, m, &server, &err) != 0) {
        struct outbox_error named = err;

        status = err.code == OUTBOX_ERR_CONFIG ? EXIT_USAGE : EXIT_RUNTIME;
        outbox_error_set(&named, err.code, "--metrics-addr: %s", err.message);
        report_exit(status, &named);
    } else {
        status = run_until_stopped(r, m);
    }
    relay_free(r);
    otel_stop(OTEL_FLUSH_SECONDS); /* after every pipeline: none records a span any more */
    http_server_stop(server);
    return status;
}

int
main(int argc, char **argv)
{
    struct relay_config config;
    struct outbox_error err;
    struct metrics *m;
    struct listen_addr metrics_addr;
    struct otel_settings otel;
    bool spans = false;
    int status;

    signal(SIGPIPE, SIG_IGN);
    if (ends_before_relay(&config, argc, argv, &metrics_addr, &otel, &spans, &status))
        return status;
    /* config_parse checked that a broker of the registry speaks the URL's scheme */
    m = metrics_new(sink_kind_of_url(config.broker.url));
    if (m == NULL) {
        outbox_error_set(&err, OUTBOX_ERR_INTERNAL, "out of memory");
        status = report_exit(EXIT_RUNTIME, &err);
    } else {
        metrics_set_max_queues(m, (size_t)config.metrics_max_queues);
        metrics_set_idle_wait(m, config.poll_interval_ms / 1000.0);
        status = run_relay(&config, &metrics_addr, &otel, spans, m);
    }
    otel_settings_clear(&otel);
    metrics_free(m);
    config_clear(&config);
    return status;
}
