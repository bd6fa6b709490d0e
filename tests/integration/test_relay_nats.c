/*
 * test_relay_nats.c - outbox-relay publishing to a real NATS JetStream server.
 *
 * Each test has its own database and its own subject prefix
 * "nats-<pid>-<n>.", with a stream the test makes (the relay never does)
 * over the subjects the test wants covered. The shared broker scenarios
 * (rollback, a bad row, a server restart or outage, kill -9, SIGTERM) run
 * for NATS from test_relay_brokers.c; here is what only NATS does: the
 * message's headers, subjects without a stream, the server's max_payload,
 * invalid subjects, JetStream's dedup of a re-driven row, --check, TLS and
 * tokens.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixtures.h"
#include "harness.h"
#include "nats_consumer.h"
#include "relay_runner.h"

/* A fresh database, a NATS consumer and a stream name of the test's own. */
#define fixture fixture_nats

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    fixture_nats_open(f, "nats", NULL);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    fixture_nats_close(f);
    free(f);
    return 0;
}

/* Makes the test's stream over prefix + covered (e.g. ">" for every subject of the prefix). */
static void
make_stream(struct fixture *f, const char *covered, int64_t duplicates_ms)
{
    char subject[128];

    snprintf(subject, sizeof(subject), "%s%s", f->prefix, covered);
    assert_int_equal(nats_consumer_create_stream(f->nats, f->stream,
                                                 &(struct nats_consumer_stream_options){
                                                     .subject = subject,
                                                     .duplicates_ms = duplicates_ms,
                                                 }),
                     0);
    f->made_stream = true;
}

static int
compare_id(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return (x > y) - (x < y);
}

/*
 * The stream holds every row of queue 'orders' exactly once (by Nats-Msg-Id)
 * and nothing else; expected is the number of rows.
 */
static void
assert_each_row_once(struct fixture *f, long long expected)
{
    struct nats_consumer_message *messages;
    size_t count;
    PGresult *rows;
    int64_t *ids;

    rows = PQexec(f->conn, "SELECT job_id FROM outbox.job WHERE queue = 'orders' ORDER BY 1");
    assert_int_equal(PQresultStatus(rows), PGRES_TUPLES_OK);
    assert_int_equal(PQntuples(rows), expected);
    assert_int_equal(nats_consumer_read(f->nats, f->stream, &messages, &count), 0);
    assert_int_equal((long long)count, expected);
    ids = calloc(count + 1, sizeof(*ids));
    assert_non_null(ids);
    for (size_t i = 0; i < count; i++)
        ids[i] = messages[i].job_id;
    qsort(ids, count, sizeof(*ids), compare_id);
    for (size_t i = 0; i < count; i++) {
        if (i > 0 && ids[i] == ids[i - 1])
            fail_msg("job %lld stored twice", (long long)ids[i]);
        if (ids[i] != strtoll(PQgetvalue(rows, (int)i, 0), NULL, 10))
            fail_msg("stream and table differ at job %lld", (long long)ids[i]);
    }
    free(ids);
    nats_consumer_messages_free(messages, count);
    PQclear(rows);
}

/* The sum of count= over the relay's "acked messages as duplicates" log lines. */
static long long
logged_duplicates(const char *log_path)
{
    char line[2048];
    long long sum = 0;
    FILE *file = fopen(log_path, "r");

    assert_non_null(file);
    while (fgets(line, sizeof(line), file) != NULL) {
        const char *count = strstr(line, "count=");

        if (strstr(line, "acked messages as duplicates") != NULL && count != NULL)
            sum += strtoll(count + 6, NULL, 10);
    }
    fclose(file);
    return sum;
}

/* The subject, headers and body of one message. */
static void
test_message_shape(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--subject-prefix", f->prefix, NULL};
    struct nats_consumer_message *messages;
    char expected[512];
    size_t count;
    long long id;

    make_stream(f, ">", 0);
    harness_exec(f->conn,
                 "SELECT outbox.enqueue('orders', '{\"order\": 1}', NULL,"
                 " '{\"source\": \"test\", \"Outbox-Queue\": \"forged\", \"traceparent\":"
                 " \"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\"}',"
                 " routing_key => 'order.created.eu')");
    id = harness_query_ll(f->conn, "SELECT job_id FROM outbox.job");
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);

    assert_int_equal(nats_consumer_read(f->nats, f->stream, &messages, &count), 0);
    assert_int_equal(count, 1);
    snprintf(expected, sizeof(expected), "%sorder.created.eu", f->prefix);
    assert_string_equal(messages[0].subject, expected);
    assert_string_equal(messages[0].body, "{\"order\": 1}");
    assert_int_equal(messages[0].job_id, id);
    harness_message_id(f->conn, id, 0, expected, sizeof(expected));
    assert_string_equal(messages[0].msg_id, expected);
    assert_non_null(strstr(messages[0].headers, "source: test\n"));
    assert_non_null(strstr(messages[0].headers,
                           "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n"));
    assert_non_null(strstr(messages[0].headers, "Outbox-Queue: orders\n"));
    assert_null(strstr(messages[0].headers, "forged"));
    assert_non_null(strstr(messages[0].headers, "Outbox-Attempt: 1\n"));
    assert_non_null(strstr(messages[0].headers, "Content-Type: application/json\n"));
    nats_consumer_messages_free(messages, count);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded'"),
                     1);
}

/* A subject no stream covers fails only its own rows, with the server's answer. */
static void
test_subject_without_stream_fails_alone(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--subject-prefix", f->prefix, NULL};

    make_stream(f, "covered.>", 0);
    harness_query_ll(f->conn, "SELECT count(outbox.enqueue('orders', jsonb_build_object('n', g),"
                              " routing_key => CASE WHEN g % 4 = 0 THEN 'uncovered.x'"
                              " ELSE 'covered.x' END)) FROM generate_series(1, 200) AS g");
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded'"
                                               " AND routing_key = 'covered.x'"),
                     150);
    /* failed once, with the reason, and waiting for a retry: not dead, not lost */
    assert_int_equal(harness_query_ll(f->conn,
                                      "SELECT count(*) FROM outbox.job"
                                      " WHERE routing_key = 'uncovered.x' AND state = 'ready'"
                                      " AND attempts = 1 AND last_error LIKE"
                                      " '%no jetstream stream covers subject%uncovered.x%no responders%'"),
                     50);
    assert_int_equal(nats_consumer_stream_count(f->nats, f->stream), 150);
}

/* A row over the server's max_payload dies at once; the 200 around it go. */
static void
test_oversized_row_dies_alone(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--subject-prefix", f->prefix, "--batch-size", "500", NULL};

    make_stream(f, ">", 0);
    harness_query_ll(f->conn, "SELECT count(outbox.enqueue('orders', jsonb_build_object('n', g),"
                              " max_attempts => 1)) FROM generate_series(1, 100) AS g");
    /* nats-server's default max_payload is 1 MiB */
    harness_exec(f->conn, "SELECT outbox.enqueue('orders',"
                          " jsonb_build_object('pad', repeat('x', 1200000)), max_attempts => 1)");
    harness_query_ll(f->conn, "SELECT count(outbox.enqueue('orders', jsonb_build_object('n', g),"
                              " max_attempts => 1)) FROM generate_series(101, 200) AS g");
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded'"),
                     200);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'dead' AND last_error LIKE"
                                               " '%exceeds the server''s max_payload%'"),
                     1);
    assert_int_equal(nats_consumer_stream_count(f->nats, f->stream), 200);
}

/*
 * Routing keys that make no valid subject die at once, naming the subject;
 * the rest go. The first batch of the connection holds only such rows, so
 * that nothing of it reaches the library (whose JetStream context has made
 * no publish yet).
 */
static void
test_invalid_subjects_die(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--subject-prefix", f->prefix, "--batch-size", "5", "--concurrency",
                           "1", NULL};

    make_stream(f, ">", 0);
    harness_exec(f->conn, "SELECT outbox.enqueue('orders', '{}', routing_key => 'order created')");
    harness_exec(f->conn, "SELECT outbox.enqueue('orders', '{}', routing_key => 'order.*')");
    harness_exec(f->conn, "SELECT outbox.enqueue('orders', '{}', routing_key => 'order.>')");
    harness_exec(f->conn, "SELECT outbox.enqueue('orders', '{}', routing_key => 'order..eu')");
    harness_exec(f->conn, "SELECT outbox.enqueue('orders', '{}', routing_key => 'order.')");
    enqueue_rows(f->conn, "orders", 10);
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'dead' AND attempts = 1"
                                               " AND last_error LIKE 'invalid nats subject%'"),
                     5);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded'"),
                     10);
}

/*
 * With the default empty --subject-prefix a producer's routing key is the
 * whole subject: rows naming the server's reserved subjects ($JS.API...
 * purge and delete, $SYS., $KV., _INBOX., any leading '$') and rows with a
 * header JetStream obeys (Nats-Rollup, Nats-Expected-*, any Nats- name)
 * die at their first attempt, naming what is reserved; the stream keeps its
 * messages and the good rows go.
 */
static void
test_reserved_subjects_and_headers_die(void **state)
{
    struct fixture *f = *state;
    static const char *const subjects[] = {"$JS.API.STREAM.PURGE.%s", "$JS.API.STREAM.DELETE.%s",
                                           "$SYS.REQ.SERVER.PING", "$KV.bucket.key", "$O.x",
                                           "_INBOX.abc"};
    static const char *const headers[] = {
        "{\"Nats-Rollup\": \"all\"}", "{\"Nats-Expected-Stream\": \"other\"}",
        "{\"Nats-Expected-Last-Sequence\": \"1\"}", "{\"nats-rollup\": \"sub\"}",
        "{\"Nats-Msg-Id\": \"1\"}"};
    char sql[512], subject[128];

    make_stream(f, ">", 0);
    for (int i = 0; i < 50; i++) {
        snprintf(sql, sizeof(sql), "SELECT outbox.enqueue('orders', '{}', routing_key => '%sok')",
                 f->prefix);
        harness_exec(f->conn, sql);
    }
    assert_int_equal(relay_run_once(f->url, f->broker, NULL), 0);
    assert_int_equal(nats_consumer_stream_count(f->nats, f->stream), 50);

    for (size_t i = 0; i < sizeof(subjects) / sizeof(subjects[0]); i++) {
        snprintf(subject, sizeof(subject), subjects[i], f->stream);
        snprintf(sql, sizeof(sql),
                 "SELECT outbox.enqueue('bad', '{}', routing_key => '%s', max_attempts => 5)",
                 subject);
        harness_exec(f->conn, sql);
    }
    for (size_t i = 0; i < sizeof(headers) / sizeof(headers[0]); i++) {
        snprintf(sql, sizeof(sql),
                 "SELECT outbox.enqueue('bad', '{}', NULL, '%s', routing_key => '%sok',"
                 " max_attempts => 5)",
                 headers[i], f->prefix);
        harness_exec(f->conn, sql);
    }
    for (int i = 0; i < 10; i++) {
        snprintf(sql, sizeof(sql), "SELECT outbox.enqueue('orders', '{}', routing_key => '%sok')",
                 f->prefix);
        harness_exec(f->conn, sql);
    }
    assert_int_equal(relay_run_once(f->url, f->broker, NULL), 0);
    assert_int_equal(nats_consumer_stream_count(f->nats, f->stream), 60);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE queue = 'bad'"
                                               " AND state = 'dead' AND attempts = 1 AND last_error"
                                               " LIKE 'nats subject % is reserved to the server%'"),
                     6);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE queue = 'bad'"
                                               " AND state = 'dead' AND attempts = 1 AND last_error"
                                               " LIKE 'header % is reserved to nats%'"),
                     5);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE queue = 'orders' AND state = 'succeeded'"),
                     60);
}

/*
 * A subject a core NATS subscriber listens on, with no stream behind it:
 * the server sends no "no responders", and the answer, if any, is no
 * JetStream ack. Such rows spend their attempt (dead after max_attempts,
 * like any refused row, the subscriber getting one copy per attempt), and
 * the good rows of their batches go at once, not after the I/O timeout.
 */
static void
test_core_subscriber_without_stream(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--subject-prefix", f->prefix, "--concurrency", "1", "--retry-base", "1m",
                           NULL};
    char subject[128];
    double started, took;

    make_stream(f, "covered.>", 0);
    snprintf(subject, sizeof(subject), "%splain.>", f->prefix);
    assert_int_equal(nats_consumer_subscribe(f->nats, subject, NULL), 0);
    snprintf(subject, sizeof(subject), "%sreplying.>", f->prefix);
    assert_int_equal(nats_consumer_subscribe(f->nats, subject, "ok"), 0);
    harness_query_ll(f->conn, "SELECT count(outbox.enqueue('orders', jsonb_build_object('n', g),"
                              " routing_key => CASE WHEN g % 100 = 0 THEN 'plain.x'"
                              " WHEN g % 100 = 50 THEN 'replying.x' ELSE 'covered.x' END,"
                              " max_attempts => 2)) FROM generate_series(1, 2000) AS g");

    started = wall_clock_seconds();
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    took = wall_clock_seconds() - started;
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded'"
                                               " AND routing_key = 'covered.x'"),
                     1960);
    /*
     * Held behind the rows without a stream, the 4 batches of 500 would each
     * wait out the 10 s I/O timeout: 40 s. Under valgrind the relay alone
     * takes about 12 s for these rows on a loaded host.
     */
    if (took > (harness_time_scale() > 1 ? 25.0 : 6.0))
        fail_msg("the good rows took %.1f s: held behind the rows without a stream", took);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE routing_key = 'plain.x' AND state = 'ready'"
                                               " AND attempts = 1 AND last_error LIKE"
                                               " '%no jetstream stream covers subject%plain.x%'"),
                     20);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE routing_key = 'replying.x' AND state = 'ready'"
                                               " AND attempts = 1 AND last_error LIKE"
                                                " '%reply on%replying.x%is not a jetstream ack%'"),
                     20);
    assert_int_equal(nats_consumer_received(f->nats), 40);

    /* the second and last attempt: dead, one more copy each */
    harness_exec(f->conn, "UPDATE outbox.job SET run_at = now() WHERE state = 'ready'");
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'dead' AND attempts = 2"),
                     40);
    assert_int_equal(nats_consumer_received(f->nats), 80);
    assert_int_equal(nats_consumer_stream_count(f->nats, f->stream), 1960);
}

/*
 * Rows a NATS message can never carry die at their first attempt, saying
 * why: a header block over 64 KiB, a header name that is not ASCII (named
 * as written).
 */
static void
test_unsendable_headers_and_subjects_die(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--subject-prefix", f->prefix, NULL};

    make_stream(f, ">", 0);
    enqueue_rows(f->conn, "orders", 5);
    harness_exec(f->conn, "SELECT outbox.enqueue('bad', '{}', NULL,"
                          " jsonb_build_object('big', repeat('x', 70000)), max_attempts => 5)");
    harness_exec(f->conn, "SELECT outbox.enqueue('bad', '{}', NULL, '{\"cl\u00e9\": \"v\"}',"
                          " max_attempts => 5)");
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE queue = 'bad'"
                                               " AND state = 'dead' AND attempts = 1"
                                               " AND last_error LIKE '%headers of % bytes exceed%'"),
                     1);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE queue = 'bad'"
                                               " AND state = 'dead' AND attempts = 1"
                                               " AND last_error LIKE 'header ''cl\u00e9'' cannot be%'"),
                     1);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE queue = 'orders' AND state = 'succeeded'"),
                     5);
}

/*
 * A re-driven row (as if a relay died between publish and mark) is acked as
 * a duplicate and counts as published; the stream holds it once. A replayed
 * row is appended once more, under <message id>.r1.
 */
static void
test_redriven_row_is_a_duplicate_replay_is_not(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--subject-prefix", f->prefix, NULL};
    const char *once_info[] = {"--subject-prefix", f->prefix, "--once", "--log-level", "info",
                               NULL};
    struct nats_consumer_message *messages;
    struct relay_process relay;
    char expected[64];
    size_t count;
    long long first;

    make_stream(f, ">", 0);
    enqueue_rows(f->conn, "orders", 3000);
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    assert_each_row_once(f, 3000);

    harness_exec(f->conn, "UPDATE outbox.job SET state = 'ready', finished_at = NULL");
    relay_start_process(&relay, f->url, f->broker, once_info);
    assert_int_equal(relay_wait(&relay, 60000), 0);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded' AND attempts = 2"),
                     3000);
    assert_each_row_once(f, 3000);
    /* the server said so: every one of them was acked as a duplicate */
    {
        long long duplicates = logged_duplicates(relay.log_path);

        if (duplicates != 3000) {
            relay_dump_log(&relay);
            fail_msg("%lld duplicate acks logged, expected 3000", duplicates);
        }
    }
    unlink(relay.log_path);

    first = harness_query_ll(f->conn, "SELECT min(job_id) FROM outbox.job");
    harness_exec(f->conn, "UPDATE outbox.job SET state = 'ready', finished_at = NULL,"
                          " replays = replays + 1 WHERE job_id = (SELECT min(job_id) FROM outbox.job)");
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    assert_int_equal(nats_consumer_read(f->nats, f->stream, &messages, &count), 0);
    assert_int_equal(count, 3001);
    harness_message_id(f->conn, first, 1, expected, sizeof(expected));
    assert_string_equal(messages[3000].msg_id, expected);
    nats_consumer_messages_free(messages, count);
}

/* --check: no stream behind the prefix is exit 2; a short duplicate window is a warning. */
static void
test_check(void **state)
{
    struct fixture *f = *state;
    char output[8192];
    const char *argv[] = {"--check", "--database-url", f->url, "--broker", f->broker,
                          "--subject-prefix", f->prefix, "--lease", "30", NULL};
    const char *bad_prefix[] = {"--check", "--database-url", f->url, "--broker", f->broker,
                                "--subject-prefix", "events.*.", NULL};

    assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 2);
    assert_non_null(strstr(output, "no jetstream stream covers subjects"));
    assert_non_null(strstr(output, f->prefix));

    make_stream(f, ">", 1000);
    assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 0);
    assert_non_null(strstr(output, "duplicate window shorter"));
    assert_non_null(strstr(output, f->stream));

    assert_int_equal(relay_run_capture(bad_prefix, output, sizeof(output)), 2);
    assert_non_null(strstr(output, "not a valid nats subject prefix"));
}

/* ---- a private server: TLS and token auth need one of their own ---- */

struct private_server {
    pid_t pid;
    int port;
    char dir[512];
};

/*
 * Starts nats-server on a free loopback port with JetStream and the extra
 * arguments (NULL-terminated; "@" in one stands for the server's directory),
 * its store and log under the stack directory; fails the test unless it
 * listens within 10 s.
 */
static void
private_server_start(struct private_server *server, const char *name, const char *const *extra)
{
    char port[16], store[600], log_path[600], args[8][600];
    const char *argv[24];
    size_t n = 0;

    server->port = harness_closed_port();
    snprintf(server->dir, sizeof(server->dir), "%s/%s-%d", harness_env("OUTBOX_TEST_STACK_DIR"),
             name, (int)getpid());
    snprintf(port, sizeof(port), "%d", server->port);
    snprintf(store, sizeof(store), "%s/store", server->dir);
    snprintf(log_path, sizeof(log_path), "%s/nats.log", server->dir);
    mkdir(server->dir, 0755);
    argv[n++] = "nats-server";
    argv[n++] = "-a";
    argv[n++] = "127.0.0.1";
    argv[n++] = "-p";
    argv[n++] = port;
    argv[n++] = "-js";
    argv[n++] = "-sd";
    argv[n++] = store;
    for (size_t i = 0; extra[i] != NULL && i < 8; i++) {
        const char *at = strchr(extra[i], '@');

        if (at != NULL)
            snprintf(args[i], sizeof(args[i]), "%.*s%s%s", (int)(at - extra[i]), extra[i],
                     server->dir, at + 1);
        else
            snprintf(args[i], sizeof(args[i]), "%s", extra[i]);
        argv[n++] = args[i];
    }
    argv[n] = NULL;
    fflush(NULL);
    server->pid = fork();
    assert_true(server->pid >= 0);
    if (server->pid == 0) {
        int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);

        prctl(PR_SET_PDEATHSIG, SIGTERM); /* a failed test leaves no server behind */
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
        }
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    for (int i = 0; i < 100 && !fixture_port_open(server->port); i++)
        usleep(100 * 1000);
    if (!fixture_port_open(server->port))
        fail_msg("nats-server did not listen on 127.0.0.1:%d (log %s)", server->port, log_path);
}

static void
private_server_stop(struct private_server *server)
{
    if (server->pid > 0) {
        kill(server->pid, SIGTERM);
        harness_wait_exit(server->pid, 10000);
        server->pid = 0;
    }
}

/* Runs `outbox-relay --check` against broker and returns its exit status; output in out. */
static int
check_broker(struct fixture *f, const char *broker, char *out, size_t size)
{
    const char *argv[] = {"--check", "--database-url", f->url, "--broker", broker,
                          "--subject-prefix", f->prefix, NULL};

    return relay_run_capture(argv, out, size);
}

/*
 * tls:// verifies the server by default: its chain (a private CA through
 * SSL_CERT_FILE) and the host name in the URL.
 */
static void
test_tls_verifies_the_server(void **state)
{
    struct fixture *f = *state;
    const char *const extra[] = {"--tls", "--tlscert", "@/server.pem", "--tlskey", "@/server.key",
                                 NULL};
    struct private_server server = {0};
    char command[4096], broker[128], output[8192], ca[600];
    int rc;

    private_server_start(&server, "nats-tls", (const char *const[]){NULL});
    private_server_stop(&server); /* made the directory; now the certificates */
    snprintf(command, sizeof(command),
             "cd '%s' && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem"
             " -days 2 -subj /CN=outbox-test-ca >/dev/null 2>&1"
             " && openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr"
             " -subj /CN=localhost >/dev/null 2>&1"
             " && printf 'subjectAltName=DNS:localhost\\n' > san.ext"
             " && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial"
             " -out server.pem -days 2 -extfile san.ext >/dev/null 2>&1",
             server.dir);
    assert_int_equal(system(command), 0);
    private_server_start(&server, "nats-tls", extra);
    snprintf(ca, sizeof(ca), "%s/ca.pem", server.dir);

    /* the system CAs do not know the private CA: refused */
    unsetenv("SSL_CERT_FILE");
    snprintf(broker, sizeof(broker), "tls://localhost:%d", server.port);
    rc = check_broker(f, broker, output, sizeof(output));
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(output, "unable to get local issuer certificate"));

    /* trusted, the right name: connected (then no stream behind the prefix: exit 2) */
    setenv("SSL_CERT_FILE", ca, 1);
    rc = check_broker(f, broker, output, sizeof(output));
    assert_non_null(strstr(output, "no jetstream stream covers subjects"));
    assert_int_equal(rc, 2);

    /* trusted, but the URL names an address the certificate does not */
    snprintf(broker, sizeof(broker), "tls://127.0.0.1:%d", server.port);
    rc = check_broker(f, broker, output, sizeof(output));
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(output, "mismatch"));
    unsetenv("SSL_CERT_FILE");
    private_server_stop(&server);
}

/* A token in the URL authenticates, and appears in no error. */
static void
test_token_is_used_and_redacted(void **state)
{
    struct fixture *f = *state;
    const char *const extra[] = {"--auth", "s3cr3t-t0ken", NULL};
    struct private_server server = {0};
    char broker[128], output[8192];
    int rc;

    private_server_start(&server, "nats-token", extra);
    snprintf(broker, sizeof(broker), "nats://wrong-t0ken@127.0.0.1:%d", server.port);
    rc = check_broker(f, broker, output, sizeof(output));
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(output, "Authorization Violation"));
    assert_non_null(strstr(output, "nats://***@127.0.0.1"));
    assert_null(strstr(output, "wrong-t0ken"));

    snprintf(broker, sizeof(broker), "nats://s3cr3t-t0ken@127.0.0.1:%d", server.port);
    rc = check_broker(f, broker, output, sizeof(output));
    assert_non_null(strstr(output, "no jetstream stream covers subjects"));
    assert_null(strstr(output, "s3cr3t-t0ken"));
    assert_int_equal(rc, 2);
    private_server_stop(&server);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_message_shape, setup, teardown),
        cmocka_unit_test_setup_teardown(test_subject_without_stream_fails_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_oversized_row_dies_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalid_subjects_die, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reserved_subjects_and_headers_die, setup, teardown),
        cmocka_unit_test_setup_teardown(test_core_subscriber_without_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unsendable_headers_and_subjects_die, setup, teardown),
        cmocka_unit_test_setup_teardown(test_redriven_row_is_a_duplicate_replay_is_not, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_check, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tls_verifies_the_server, setup, teardown),
        cmocka_unit_test_setup_teardown(test_token_is_used_and_redacted, setup, teardown),
    };

    return cmocka_run_group_tests_name("relay_nats", tests, NULL, NULL);
}
