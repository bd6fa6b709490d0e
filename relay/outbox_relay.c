/*
 * outbox-relay - publishes committed outbox rows to RabbitMQ or Redis Streams.
 *
 * main() owns configuration, logging, the metrics endpoint and signals; the
 * pipelines (relay.c) do the work. Signals are blocked in every thread and
 * taken here with sigtimedwait(), so no code runs in a signal handler:
 * the first SIGTERM/SIGINT stops claiming and lets the batch in flight
 * finish, a second one exits at once (leases make that safe).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config.h"
#include "error.h"
#include "log.h"
#include "metrics.h"
#include "relay.h"

#define EXIT_RUNTIME 1
#define EXIT_USAGE 2

#ifndef OUTBOX_VERSION
#define OUTBOX_VERSION "0.1.0"
#endif

int
main(int argc, char **argv)
{
    struct relay_config config;
    struct outbox_error err;
    metrics *m = NULL;
    metrics_server *server = NULL;
    relay *r = NULL;
    sigset_t signals;
    int status = EXIT_RUNTIME;
    int signals_seen = 0;

    signal(SIGPIPE, SIG_IGN);
    if (config_parse(&config, argc, (const char *const *)argv, &err) != 0) {
        fprintf(stderr, "outbox-relay: %s\n", err.message);
        return EXIT_USAGE;
    }
    if (config.help) {
        config_usage(stdout);
        config_clear(&config);
        return 0;
    }
    if (config.version) {
        printf("outbox-relay %s\n", OUTBOX_VERSION);
        config_clear(&config);
        return 0;
    }
    log_configure((enum log_level)config.log_level,
                  config.log_format == CONFIG_LOG_JSON ? LOG_FORMAT_JSON : LOG_FORMAT_TEXT,
                  stderr);

    m = metrics_new(&err);
    if (m == NULL)
        goto fail;
    r = relay_new(&config, m, &err);
    if (r == NULL) {
        if (err.code == OUTBOX_ERR_CONFIG) {
            fprintf(stderr, "outbox-relay: --broker: %s\n", err.message);
            status = EXIT_USAGE;
            goto cleanup;
        }
        goto fail;
    }

    if (config.check) {
        if (relay_check(r, &err) != 0)
            goto fail;
        printf("configuration OK\n");
        status = 0;
        goto cleanup;
    }

    if (strcmp(config.metrics_addr, "off") != 0) {
        server = metrics_server_start(m, config.metrics_addr, &err);
        if (server == NULL) {
            fprintf(stderr, "outbox-relay: --metrics-addr: %s\n", err.message);
            status = err.code == OUTBOX_ERR_CONFIG ? EXIT_USAGE : EXIT_RUNTIME;
            goto cleanup;
        }
    }

    /* block the stop signals before any thread exists, so only main takes them */
    sigemptyset(&signals);
    sigaddset(&signals, SIGTERM);
    sigaddset(&signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &signals, NULL);

    if (relay_start(r, &err) != 0)
        goto fail;
    while (!relay_finished(r)) {
        struct timespec timeout = {.tv_sec = 0, .tv_nsec = 200 * 1000 * 1000};
        int signo = sigtimedwait(&signals, NULL, &timeout);

        if (signo < 0)
            continue; /* timeout or EINTR: look at the pipelines again */
        if (++signals_seen == 1) {
            log_event(OUTBOX_LOG_INFO, "stopping", "signal=%s",
                      signo == SIGTERM ? "SIGTERM" : "SIGINT");
            relay_stop(r);
        } else {
            log_event(OUTBOX_LOG_WARN, "stopping now; rows in flight return after their lease",
                      "signal=%s", signo == SIGTERM ? "SIGTERM" : "SIGINT");
            _exit(EXIT_RUNTIME);
        }
    }
    if (relay_join(r, &err) != 0)
        goto fail;
    log_event(OUTBOX_LOG_INFO, "stopped", NULL);
    status = 0;
    goto cleanup;

fail:
    fprintf(stderr, "outbox-relay: %s\n", err.message);
    status = EXIT_RUNTIME;
cleanup:
    metrics_server_stop(server);
    relay_free(r);
    metrics_free(m);
    config_clear(&config);
    return status;
}
