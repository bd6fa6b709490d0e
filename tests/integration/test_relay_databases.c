/*
 * test_relay_databases.c - one relay for many databases (--databases FILE,
 * --max-db-connections N), per broker from a table: databases from a
 * list, two relays with a budget each, one killed with -9 mid-run; every
 * row of every database delivered under its own database's message id
 * (and, for Redis, its own payload: no row of one database taken for
 * another's), connections within each relay's budget (Redis 30 databases,
 * RabbitMQ and Kafka 6), a database added to
 * the file at run time served, an unreachable database costing only
 * itself. Then the configuration mistakes of the mode.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "amqp_consumer.h"
#include "database_list_run.h"
#include "fixtures.h"
#include "harness.h"
#include "kafka_consumer.h"
#include "redis_consumer.h"
#include "relay_runner.h"

/* A lease of 15 s: the rows the killed relay had claimed wait for it, well within the drain's
 * 60 s (with the default 60 s, a kill within a batch left them out of it) */
static const struct broker_case CASES[] = {
    {"redis", "OUTBOX_TEST_REDIS_URL", 30, 100, 50, 8, "15", "--stream-prefix", ":"},
    {"amqp", "OUTBOX_TEST_AMQP_URL", 6, 60, 20, 3, "15", "--exchange", ""},
    {"kafka", "OUTBOX_TEST_KAFKA_URL", 6, 60, 20, 3, "15", "--topic-prefix", ""},
};

/* AMQP: every row's message id at least once. */
struct amqp_seen {
    char **ids;
    size_t count, capacity;
};

static void
on_message_id(const char *message_id, int64_t job_id, void *arg)
{
    struct amqp_seen *seen = arg;

    (void)job_id; /* the message id names the database too */
    if (seen->count == seen->capacity) {
        seen->capacity = seen->capacity ? seen->capacity * 2 : 1024;
        seen->ids = realloc(seen->ids, seen->capacity * sizeof(*seen->ids));
        assert_non_null(seen->ids);
    }
    seen->ids[seen->count++] = strdup(message_id);
}

/* Every row of every database arrived under its own database's message id. */
static void
check_ids(struct run *run, struct amqp_seen *seen_ids)
{
    struct amqp_seen seen = *seen_ids;

    for (int i = 0; i < run->count; i++) {
        PGresult *result = PQexec(run->conns[i], "SELECT job_id FROM outbox.job ORDER BY job_id");

        assert_int_equal(PQresultStatus(result), PGRES_TUPLES_OK);
        for (int r = 0; r < PQntuples(result); r++) {
            char want[128];
            bool found = false;

            harness_message_id(run->conns[i], atoll(PQgetvalue(result, r, 0)), 0, want,
                               sizeof(want));
            for (size_t k = 0; k < seen.count && !found; k++)
                found = strcmp(seen.ids[k], want) == 0;
            if (!found)
                fail_msg("%s of database %s never arrived", want, run->ids[i]);
        }
        PQclear(result);
    }
    for (size_t k = 0; k < seen.count; k++)
        free(seen.ids[k]);
    free(seen.ids);
}

static void
check_amqp(struct run *run, queue_consumer *mq)
{
    struct amqp_seen seen = {0};

    assert_int_equal(queue_consumer_drain(mq, run->prefix, 2000, on_message_id, &seen), 0);
    check_ids(run, &seen);
}

static void
kafka_topic(const struct run *run, char *topic, size_t size)
{
    snprintf(topic, size, "%s%s", run->prefix, LIST_RUN_QUEUE);
}

static void
check_kafka(struct run *run)
{
    struct kafka_consumer_topic records = {0};
    struct amqp_seen seen = {0};
    char topic[128], errbuf[256];

    kafka_topic(run, topic, sizeof(topic));
    if (kafka_consumer_read_topic(harness_env("OUTBOX_TEST_KAFKA_URL"), topic, 60000, &records,
                                  errbuf, sizeof(errbuf)) != 0)
        fail_msg("reading %s: %s", topic, errbuf);
    for (size_t k = 0; k < records.count; k++)
        if (records.records[k].message_id != NULL)
            on_message_id(records.records[k].message_id, records.records[k].job_id, &seen);
    kafka_consumer_topic_clear(&records);
    kafka_consumer_delete_topic(harness_env("OUTBOX_TEST_KAFKA_URL"), topic);
    check_ids(run, &seen);
}

/*
 * After the drain: the unreachable database named, the databases all served
 * by the survivor, its clean stop, then every row at the broker; cleanup.
 */
static void
finish_case(struct run *run, struct relay_process *b, queue_consumer *mq, int port,
            int served_before)
{
    const struct broker_case *bc = run->bc;
    char *metrics;

    /* the unreachable database is named, and costs one log line a minute */
    metrics = relay_scrape_metrics(port);
    assert_non_null(metrics);
    assert_non_null(strstr(metrics, "database=\"unreachable\"} 0"));
    assert_non_null(strstr(metrics, "outbox_databases_down{broker=\""));
    /* the relays divided the databases; after the kill the survivor took them all over */
    print_message("%s: relay b served %d databases before the kill, %d after\n", bc->name,
                  served_before, list_run_served_count(metrics));
    if (bc->databases >= 20) /* with a handful, one relay winning every hash is not rare */
        assert_true(served_before > 0 && served_before < bc->databases);
    assert_int_equal(list_run_served_count(metrics), bc->databases + 1);
    free(metrics);
    assert_true(list_run_log_lines_with(b, "database unavailable", "database=unreachable") == 1);
    assert_true(list_run_log_lines_with(b, "database added to the list", "database=db") == 1);
    relay_signal(b, SIGTERM);
    assert_int_equal(relay_wait(b, 15000), 0);
    if (mq != NULL) {
        check_amqp(run, mq);
        queue_consumer_delete_queue(mq, run->prefix);
        queue_consumer_delete_exchange(mq, run->prefix);
        queue_consumer_free(mq);
    } else if (strcmp(bc->name, "kafka") == 0) {
        check_kafka(run);
    } else {
        list_run_check_redis(run, bc->rows + bc->more_rows, bc->rows);
    }
    list_run_drop(run);
}

static void
run_case(const struct broker_case *bc)
{
    struct run run = {.bc = bc};
    struct relay_process a, b;
    queue_consumer *mq = NULL;
    long long most_a = 0, most_b = 0, left = -1;
    int port = harness_free_port();
    double killed_at;
    int served_before;
    char *metrics;

    run.admin = harness_connect(harness_env("OUTBOX_TEST_PG_URL"));
    snprintf(run.list_path, sizeof(run.list_path), "%s/databases-%s-%d.list",
             harness_env("OUTBOX_TEST_STACK_DIR"), bc->name, (int)getpid());
    snprintf(run.prefix, sizeof(run.prefix), "mdb-%s-%d%s", bc->name, (int)getpid(),
             bc->prefix_end);
    run.count = bc->databases + 1;
    for (int i = 0; i < run.count; i++)
        list_run_make_database(&run, i);
    if (strcmp(bc->name, "amqp") == 0) {
        mq = queue_consumer_connect(harness_env("OUTBOX_TEST_AMQP_URL"));
        assert_non_null(mq);
        assert_int_equal(queue_consumer_declare_queue(mq, run.prefix), 0);
        assert_int_equal(queue_consumer_declare_exchange(mq, run.prefix, "direct"), 0);
        assert_int_equal(queue_consumer_bind(mq, run.prefix, run.prefix, LIST_RUN_QUEUE), 0);
    } else if (strcmp(bc->name, "kafka") == 0) {
        char topic[128], errbuf[256];

        kafka_topic(&run, topic, sizeof(topic));
        if (kafka_consumer_create_topic(harness_env("OUTBOX_TEST_KAFKA_URL"), topic, 3, 1, NULL,
                                        60000, errbuf, sizeof(errbuf)) != 0)
            fail_msg("creating %s: %s", topic, errbuf);
    }
    /* the last database is listed only while the relays run */
    list_run_write_list(&run, bc->databases, true);
    list_run_start_relay(&run, &a, "mdb-relay-a", 0);
    list_run_start_relay(&run, &b, "mdb-relay-b", port);
    for (int sample = 0; sample < 12; sample++) {
        /* each relay of a budget of 4 or more has one watch session beside its slots */
        long long now_a = list_run_connections_of(run.admin, "mdb-relay-a") + (bc->budget >= 4);

        assert_true(list_run_watch_connections(run.admin) <= 2);
        most_a = now_a > most_a ? now_a : most_a;
        usleep(250 * 1000);
    }
    metrics = relay_scrape_metrics(port);
    assert_non_null(metrics);
    served_before = list_run_served_count(metrics);
    free(metrics);
    relay_signal(&a, SIGKILL); /* mid-run: rows of its batches stay running until their lease */
    assert_int_equal(relay_wait(&a, 5000), 128 + SIGKILL);
    killed_at = wall_clock_seconds();
    list_run_enqueue(&run, bc->databases, bc->rows + 1, bc->rows + bc->more_rows);
    list_run_write_list(&run, bc->databases + 1, true);
    for (int waited = 0; waited < 120 && (left = list_run_rows_left(&run)) > 0; waited++) {
        long long now_a = list_run_connections_of(run.admin, "mdb-relay-a");
        long long now_b = list_run_connections_of(run.admin, "mdb-relay-b") +
                          list_run_watch_connections(run.admin);

        most_a = now_a > most_a ? now_a : most_a;
        most_b = now_b > most_b ? now_b : most_b;
        usleep(500 * 1000);
    }
    if (left != 0)
        relay_dump_log(&b);
    print_message("%s: %d databases drained %.1f s after the kill; most connections %lld and %lld"
                  " of %d each\n",
                  bc->name, run.count, wall_clock_seconds() - killed_at, most_a, most_b,
                  bc->budget);
    assert_int_equal(left, 0);
    if (bc->budget >= 4) /* idle databases woken by one watch connection, within the budget */
        assert_int_equal(list_run_watch_connections(run.admin), 1);
    assert_true(most_a <= bc->budget);
    assert_true(most_b <= bc->budget);
    assert_true(most_a > 0 && most_b > 0);
    finish_case(&run, &b, mq, port, served_before);
}

static void
test_many_databases_redis(void **state)
{
    (void)state;
    run_case(&CASES[0]);
}

static void
test_many_databases_amqp(void **state)
{
    (void)state;
    run_case(&CASES[1]);
}

static void
test_many_databases_kafka(void **state)
{
    (void)state;
    run_case(&CASES[2]);
}

/*
 * The statistics watch keeps the leases: two relays with fewer connections
 * than databases leave idle databases alone (no connect to renew a lease
 * or to stay a member), and one killed with -9 has its databases taken
 * over as soon as its watch session ends, long before its lease would.
 */
static void
test_watch_keeps_leases(void **state)
{
    static const struct broker_case bc = {"redis", "OUTBOX_TEST_REDIS_URL", 10, 20, 5, 4, "20",
                                          "--stream-prefix", ":"};
    struct run run = {.bc = &bc};
    struct relay_process a, b;
    int port = harness_free_port();
    long long before, left = -1;
    double killed_at;

    (void)state;
    list_run_begin(&run, "watch", bc.databases);
    list_run_write_list(&run, run.count, false);
    list_run_start_relay(&run, &a, "mdb-watch-a", 0);
    list_run_start_relay(&run, &b, "mdb-watch-b", port);
    for (int waited = 0; waited < 60 && (left = list_run_rows_left(&run)) > 0; waited++)
        usleep(500 * 1000);
    assert_int_equal(left, 0);
    assert_int_equal(wait_for_value(run.admin,
                                    "SELECT count(*) FROM pg_stat_activity"
                                    " WHERE application_name LIKE 'outbox-relay watch %'",
                                    2, 10000),
                     2);
    /* the leases settle between the two relays; the statistics of their last
     * writes show within 10 s (a backend's report held back, then flushed) */
    usleep(12000 * 1000);
    /* idle: with a lease of 20 s, visits every 5 s would be a connect each */
    before = list_run_sessions_opened(&run);
    usleep(8000 * 1000);
    print_message("watch: %lld sessions opened to %d idle databases in 8 s\n",
                  list_run_sessions_opened(&run) - before, run.count);
    assert_true(list_run_sessions_opened(&run) - before <= 2);
    relay_signal(&a, SIGKILL);
    assert_int_equal(relay_wait(&a, 5000), 128 + SIGKILL);
    killed_at = wall_clock_seconds();
    list_run_enqueue(&run, run.count, bc.rows + 1, bc.rows + bc.more_rows);
    for (int waited = 0; waited < 100 && (left = list_run_rows_left(&run)) > 0; waited++)
        usleep(100 * 1000);
    print_message("watch: every database drained %.1f s after the kill (lease 20 s)\n",
                  wall_clock_seconds() - killed_at);
    if (left != 0)
        relay_dump_log(&b);
    assert_int_equal(left, 0); /* within 10 s: half the lease */
    relay_signal(&b, SIGTERM);
    assert_int_equal(relay_wait(&b, 15000), 0);
    list_run_check_redis(&run, bc.rows + bc.more_rows, bc.rows + bc.more_rows);
    list_run_drop(&run);
}

/*
 * One hot database among quiet ones, a budget of 8: it drains on
 * --concurrency (2) slots at most, as a relay of that one database would,
 * not on the six the busy share leaves (its claims contend for the same
 * rows, and their CPU is what a quiet database's row waits for); a quiet
 * database's row goes out while it drains.
 */
static void
test_hot_database_keeps_to_its_share(void **state)
{
    static const struct broker_case bc = {"redis", "OUTBOX_TEST_REDIS_URL", 4, 1, 0, 8, NULL,
                                          "--stream-prefix", ":"};
    struct run run = {.bc = &bc};
    struct relay_process relay;
    redisContext *redis = stream_consumer_connect(harness_env("OUTBOX_TEST_REDIS_URL"));
    static const char LEFT[] = "SELECT count(*) FROM outbox.job WHERE state <> 'succeeded'";
    long long most = 0, left = -1;
    bool quiet_out = false; /* the quiet row went out while the hot rows were still coming */

    (void)state;
    list_run_begin(&run, "share", bc.databases);
    list_run_write_list(&run, run.count, false);
    list_run_start_relay(&run, &relay, "mdb-share", 0);
    for (int waited = 0; waited < 100 && list_run_rows_left(&run) > 0; waited++)
        usleep(100 * 1000);
    list_run_enqueue_into(&run, 0, 2, 20001); /* 1 000 batches of 20 */
    list_run_enqueue_into(&run, 3, 2, 2);
    for (int waited = 0; waited < 1200 && (left = list_run_rows_left(&run)) > 0; waited++) {
        long long now = list_run_connections_to(run.admin, "mdb-share", PQdb(run.conns[0]));

        most = now > most ? now : most;
        quiet_out |= harness_query_ll(run.conns[3], LEFT) == 0 &&
                     harness_query_ll(run.conns[0], LEFT) > 0;
    }
    print_message("share: the hot database held %lld connections at most\n", most);
    assert_int_equal(left, 0);
    assert_true(most >= 1 && most <= 2);
    assert_true(quiet_out);
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    stream_consumer_delete_prefix(redis, run.prefix);
    redisFree(redis);
    list_run_drop(&run);
}

/* The mode's configuration mistakes: exit 2 with one line naming the option or the line. */
static void
test_configuration_mistakes(void **state)
{
    char path[256], output[4096];
    FILE *file;

    (void)state;
    snprintf(path, sizeof(path), "%s/databases-bad-%d.list", harness_env("OUTBOX_TEST_STACK_DIR"),
             (int)getpid());
    file = fopen(path, "w");
    assert_non_null(file);
    fprintf(file, "# ok\none postgresql://u@127.0.0.1:1/a\none postgresql://u@127.0.0.1:1/b\n");
    fclose(file);
    {
        const char *argv[] = {"--databases", path, "--broker", "redis://127.0.0.1:1", NULL};

        assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 2);
        assert_non_null(strstr(output, "line 3: the name 'one' is listed twice"));
    }
    {
        const char *argv[] = {"--databases", path, "--database-url", "postgresql:///x", "--broker",
                              "redis://127.0.0.1:1", NULL};

        assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 2);
        assert_non_null(strstr(output, "--databases and --database-url exclude each other"));
    }
    file = fopen(path, "w");
    assert_non_null(file);
    fprintf(file, "host=127.0.0.1 port=1\n");
    fclose(file);
    {
        const char *argv[] = {"--databases", path, "--broker", "redis://127.0.0.1:1", NULL};

        assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 2);
        assert_non_null(strstr(output, "line 1:"));
    }
    {
        const char *argv[] = {"--databases", "/nonexistent/list", "--broker", "redis://127.0.0.1:1",
                              NULL};

        assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 2);
        assert_non_null(strstr(output, "--databases /nonexistent/list"));
    }
    unlink(path);
}

/* Stream rows not yet published: after their partition's cursor. */
#define STREAM_ROWS_LEFT                                                                           \
    "SELECT count(*) FROM outbox.job AS j JOIN outbox.stream_cursor AS c"                          \
    " ON c.queue = j.queue AND c.partition = j.stream_partition"                                   \
    " WHERE j.state = 'stream' AND (j.xid, j.job_id) > (c.cursor_xid, c.cursor_job_id)"

/*
 * outboxctl pause --database: relays of a list stop serving the database
 * (its rows stay ready) while the others flow; resume --database: served.
 * A database's stream queue is served beside its rows: found once, its row
 * published; a paused database's stream queue waits with it.
 */
static void
test_pause_a_whole_database(void **state)
{
    struct run run = {.bc = &CASES[0]};
    struct relay_process relay;
    char output[4096];

    (void)state;
    list_run_begin(&run, "pause", 2);
    {
        const char *argv[] = {"--database-url", run.urls[1], "pause", "--database", "--reason",
                              "tenant migration", NULL};

        assert_int_equal(fixture_run_outboxctl(argv, output, sizeof(output)), 0);
        assert_non_null(strstr(output, "paused the database"));
    }
    {
        /* a stream queue in each database, served with the database's rows */
        for (int i = 0; i < run.count; i++) {
            const char *argv[] = {"--database-url", run.urls[i], "stream",
                                  "enable",         "events",    NULL};

            assert_int_equal(fixture_run_outboxctl(argv, output, sizeof(output)), 0);
            harness_exec(run.conns[i], "SELECT outbox.enqueue('events', '{\"stream\": 1}')");
        }
    }
    list_run_write_list(&run, run.count, false);
    list_run_start_relay(&run, &relay, "mdb-relay-pause", 0);
    assert_int_equal(wait_for_value(run.conns[0],
                                    "SELECT count(*) FROM outbox.job WHERE state = 'succeeded'",
                                    run.bc->rows, 20000),
                     run.bc->rows);
    assert_int_equal(wait_for_value(run.conns[0], STREAM_ROWS_LEFT, 0, 20000), 0);
    usleep(2000 * 1000);
    assert_int_equal(harness_query_ll(run.conns[1], "SELECT count(*) FROM outbox.job"
                                                    " WHERE state = 'ready'"),
                     run.bc->rows);
    assert_int_equal(harness_query_ll(run.conns[1], STREAM_ROWS_LEFT), 1);
    {
        const char *argv[] = {"--database-url", run.urls[1], "resume", "--database", NULL};

        assert_int_equal(fixture_run_outboxctl(argv, output, sizeof(output)), 0);
        assert_non_null(strstr(output, "resumed the database"));
    }
    assert_int_equal(wait_for_value(run.conns[1],
                                    "SELECT count(*) FROM outbox.job WHERE state = 'succeeded'",
                                    run.bc->rows, 20000),
                     run.bc->rows);
    assert_int_equal(wait_for_value(run.conns[1], STREAM_ROWS_LEFT, 0, 20000), 0);
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    assert_int_equal(
        list_run_log_lines_with(&relay, "database paused, not served", "database=db1"), 1);
    for (int i = 0; i < run.count; i++) {
        char database[32];

        snprintf(database, sizeof(database), "database=db%d", i);
        assert_int_equal(list_run_log_lines_with(&relay, "stream queues found", database), 1);
    }
    list_run_drop(&run);
}

/* outboxctl --databases FILE migrate and status: each database in turn, then the totals. */
static void
test_outboxctl_over_the_list(void **state)
{
    char *first = harness_database_new_empty(), *second = harness_database_new_empty();
    char path[256], output[16384];
    FILE *file;

    (void)state;
    snprintf(path, sizeof(path), "%s/databases-ctl-%d.list", harness_env("OUTBOX_TEST_STACK_DIR"),
             (int)getpid());
    file = fopen(path, "w");
    assert_non_null(file);
    fprintf(file, "first %s\nsecond %s\nunreachable postgresql://postgres@127.0.0.1:1/x\n",
            first, second);
    fclose(file);
    {
        const char *argv[] = {"--databases", path, "migrate", NULL};

        assert_int_equal(fixture_run_outboxctl(argv, output, sizeof(output)), 1);
        assert_non_null(strstr(output, "== database first"));
        assert_non_null(strstr(output, "== database unreachable"));
        assert_non_null(strstr(output, "databases: 3, ok: 2, failed: 1"));
    }
    {
        const char *argv[] = {"--databases", path, "status", NULL};

        assert_int_equal(fixture_run_outboxctl(argv, output, sizeof(output)), 1);
        assert_non_null(strstr(output, "== database second"));
        assert_non_null(strstr(output, "databases: 3, ok: 2, failed: 1"));
    }
    {
        const char *argv[] = {"--databases", path, "identity", "set", "--database-id", "x", NULL};

        assert_int_equal(fixture_run_outboxctl(argv, output, sizeof(output)), 2);
    }
    unlink(path);
    harness_database_drop(first);
    harness_database_drop(second);
}

/* OUTBOX_TEST_FILTER (a cmocka pattern, e.g. "test_watch*") runs only the tests that match. */
int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_configuration_mistakes),
        cmocka_unit_test(test_outboxctl_over_the_list),
        cmocka_unit_test(test_pause_a_whole_database),
        cmocka_unit_test(test_watch_keeps_leases),
        cmocka_unit_test(test_hot_database_keeps_to_its_share),
        cmocka_unit_test(test_many_databases_redis),
        cmocka_unit_test(test_many_databases_amqp),
        cmocka_unit_test(test_many_databases_kafka),
    };

    if (getenv("OUTBOX_TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("OUTBOX_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
