/*
 * relay_runner.c - see relay_runner.h.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fixtures.h"
#include "harness.h"
#include "http_client.h"
#include "relay_runner.h"

static int log_counter;

/* True when the extra arguments already contain option. */
static bool
has_option(const char *const *extra, const char *option)
{
    size_t len = strlen(option);

    for (size_t i = 0; extra != NULL && extra[i] != NULL; i++)
        if (strncmp(extra[i], option, len) == 0 && (extra[i][len] == '\0' || extra[i][len] == '='))
            return true;
    return false;
}

/* Builds the relay's argv: binary, URLs, defaults the extras do not override, extras. */
static void
build_argv(const char **argv, char *binary, size_t binary_size, const char *database_url,
           const char *broker, const char *const *extra)
{
    size_t n = 0;

    snprintf(binary, binary_size, "%s/outbox-relay", harness_env("OUTBOX_BIN"));
    argv[n++] = binary;
    if (database_url != NULL) { /* NULL: the extras name --databases */
        argv[n++] = "--database-url";
        argv[n++] = database_url;
    }
    argv[n++] = "--broker";
    argv[n++] = broker;
    if (!has_option(extra, "--metrics-addr")) {
        argv[n++] = "--metrics-addr";
        argv[n++] = "off";
    }
    if (!has_option(extra, "--lease")) {
        argv[n++] = "--lease";
        argv[n++] = "5";
    }
    for (size_t i = 0; extra != NULL && extra[i] != NULL && n < RELAY_MAX_ARGS - 1; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
}

void
relay_start_process(struct relay_process *relay, const char *database_url, const char *broker,
                    const char *const *extra)
{
    const char *argv[RELAY_MAX_ARGS];
    char binary[512];

    build_argv(argv, binary, sizeof(binary), database_url, broker, extra);
    snprintf(relay->log_path, sizeof(relay->log_path), "/tmp/outbox-relay-test-%d-%d.log",
             (int)getpid(), log_counter++);
    unlink(relay->log_path);
    relay->pid = harness_spawn(argv, relay->log_path);
    assert_true(relay->pid > 0);
}

int
relay_wait(struct relay_process *relay, int timeout_ms)
{
    int status = harness_wait_exit(relay->pid, timeout_ms);

    if (status != 0)
        relay_dump_log(relay);
    return status;
}

void
relay_signal(struct relay_process *relay, int signo)
{
    kill(relay->pid, signo);
}

int
relay_run_once(const char *database_url, const char *broker, const char *const *extra)
{
    const char *with_once[RELAY_MAX_ARGS];
    struct relay_process relay;
    size_t n = 0;
    int status;

    with_once[n++] = "--once";
    for (size_t i = 0; extra != NULL && extra[i] != NULL && n < RELAY_MAX_ARGS - 1; i++)
        with_once[n++] = extra[i];
    with_once[n] = NULL;
    relay_start_process(&relay, database_url, broker, with_once);
    status = relay_wait(&relay, 60000);
    unlink(relay.log_path);
    return status;
}

int
relay_run_capture(const char *const *argv_tail, char *output, size_t size)
{
    return fixture_run_program("outbox-relay", argv_tail, output, size, 30000);
}

void
relay_dump_log(const struct relay_process *relay)
{
    char line[1024];
    FILE *f = fopen(relay->log_path, "r");
    int lines = 0;

    if (f == NULL)
        return;
    fprintf(stderr, "---- relay log %s ----\n", relay->log_path);
    while (fgets(line, sizeof(line), f) != NULL && lines++ < 200)
        fputs(line, stderr);
    fclose(f);
}

double
wall_clock_seconds(void)
{
    struct timespec now;

    clock_gettime(CLOCK_REALTIME, &now);
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

/* The timestamp that opens a text log line (2026-11-30T03:41:13.123Z), or -1. */
static double
log_line_time(const char *line)
{
    struct tm tm = {0};
    int millis = 0;

    if (sscanf(line, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
               &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &millis) != 7)
        return -1;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return (double)timegm(&tm) + millis / 1000.0;
}

double
relay_log_find(const struct relay_process *relay, double not_before, bool last,
               const char *const *needles, char *line, size_t size)
{
    char buffer[2048];
    FILE *f = fopen(relay->log_path, "r");
    double found = -1;

    if (f == NULL)
        return -1;
    while ((last || found < 0) && fgets(buffer, sizeof(buffer), f) != NULL) {
        double at = log_line_time(buffer);
        bool all = at >= 0 && at >= not_before;

        for (size_t i = 0; all && needles[i] != NULL; i++)
            all = strstr(buffer, needles[i]) != NULL;
        if (all) {
            found = at;
            if (line != NULL)
                snprintf(line, size, "%.*s", (int)strcspn(buffer, "\n"), buffer);
        }
    }
    fclose(f);
    return found;
}

char *
relay_scrape_metrics(int port)
{
    struct http_reply reply = http_get(port, "/metrics");
    char *body = reply.body;

    if (reply.status == 0)
        return NULL;
    free(reply.head);
    return body;
}

long long
wait_for_value(PGconn *conn, const char *sql, long long expected, int timeout_ms)
{
    long long value = harness_query_ll(conn, sql);

    for (int waited = 0; value != expected && waited < timeout_ms; waited += 50) {
        usleep(50 * 1000);
        value = harness_query_ll(conn, sql);
    }
    if (value != expected) /* a wait that runs out costs its whole timeout: say so */
        fprintf(stderr, "wait_for_value: %lld, not %lld, after %d ms: %s\n", value, expected,
                timeout_ms, sql);
    return value;
}

void
enqueue_rows(PGconn *conn, const char *queue, int count)
{
    char sql[512];

    snprintf(sql, sizeof(sql),
             "SELECT count(outbox.enqueue('%s', jsonb_build_object('n', g),"
             " headers => jsonb_build_object('source', 'test')))"
             " FROM generate_series(1, %d) AS g",
             queue, count);
    harness_query_ll(conn, sql);
}
