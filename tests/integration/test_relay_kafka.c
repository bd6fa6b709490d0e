/*
 * test_relay_kafka.c - outbox-relay publishing to a real Kafka broker.
 *
 * Each test has its own database and its own topic prefix; the topics it
 * needs are created here (the relay never creates one) and deleted after.
 * What every broker must do (kill -9, SIGTERM) is in test_relay_brokers.c.
 * The SASL and TLS tests publish through the stack broker's SASL_PLAINTEXT
 * and SSL listeners; topics are still created and read on its plaintext one.
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

#include <librdkafka/rdkafka.h>

#include "fixtures.h"
#include "harness.h"
#include "kafka_consumer.h"
#include "relay_runner.h"

#define TOPICS_MAX 4

struct fixture {
    char *url;
    PGconn *conn;
    const char *broker;
    char prefix[64];
    char topics[TOPICS_MAX][128]; /* created by the test, deleted at teardown */
    size_t topic_count;
};

static int test_counter;

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    f->url = harness_database_new();
    f->conn = harness_connect(f->url);
    f->broker = harness_env("OUTBOX_TEST_KAFKA_URL");
    snprintf(f->prefix, sizeof(f->prefix), "relay-test-%d-%d.", (int)getpid(), test_counter++);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    for (size_t i = 0; i < f->topic_count; i++)
        kafka_consumer_delete_topic(f->broker, f->topics[i]);
    PQfinish(f->conn);
    harness_database_drop(f->url);
    free(f);
    return 0;
}

/* Creates topic prefix + name (configs: name, value pairs, NULL-terminated, may be NULL). */
static const char *
create_topic(struct fixture *f, const char *name, int partitions, const char *const *configs)
{
    char why[512];
    char *topic;

    assert_true(f->topic_count < TOPICS_MAX);
    topic = f->topics[f->topic_count++];
    snprintf(topic, sizeof(f->topics[0]), "%s%s", f->prefix, name);
    if (kafka_consumer_create_topic(f->broker, topic, partitions, 1, configs, 30000, why,
                                    sizeof(why)) != 0)
        fail_msg("kafka: unable to create topic %s: %s", topic, why);
    return topic;
}

static void
read_topic(struct fixture *f, const char *topic, struct kafka_consumer_topic *out)
{
    char why[512];

    if (kafka_consumer_read_topic(f->broker, topic, 60000, out, why, sizeof(why)) != 0)
        fail_msg("kafka: unable to read topic %s: %s", topic, why);
}

/* Key, value, timestamp and headers of a record; a rolled-back row never reaches the topic. */
static void
test_record_fields_and_rollback(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--topic-prefix", f->prefix, NULL};
    const char *topic = create_topic(f, "orders", 1, NULL);
    struct kafka_consumer_topic read;
    const struct kafka_consumer_record *keyed, *other;
    long long id, created_ms, keyless;

    harness_exec(f->conn, "BEGIN");
    harness_exec(f->conn,
                 "SELECT outbox.enqueue('orders', '{\"order\": 1}', NULL,"
                 " '{\"trace-id\": \"t-1\","
                 " \"traceparent\": \"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\"}',"
                 " ordering_key => 'customer-7')");
    harness_exec(f->conn, "COMMIT");
    harness_exec(f->conn, "BEGIN");
    harness_exec(f->conn, "SELECT outbox.enqueue('orders', '{\"order\": 2}')");
    harness_exec(f->conn, "ROLLBACK");
    keyless = harness_query_ll(f->conn, "SELECT outbox.enqueue('orders', '{\"order\": 3}')");
    id = harness_query_ll(f->conn, "SELECT min(job_id) FROM outbox.job");
    created_ms = harness_query_ll(f->conn, "SELECT floor(extract(epoch FROM created_at) * 1000)"
                                           " FROM outbox.job ORDER BY job_id LIMIT 1");

    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);

    read_topic(f, topic, &read);
    assert_int_equal(read.count, 2);
    /* two pipelines may each claim one of the rows: their order in the partition is free */
    keyed = read.records[0].job_id == id ? &read.records[0] : &read.records[1];
    other = keyed == &read.records[0] ? &read.records[1] : &read.records[0];
    assert_int_equal(keyed->job_id, id);
    assert_string_equal(keyed->key, "customer-7");
    assert_string_equal(keyed->value, "{\"order\": 1}");
    assert_string_equal(keyed->queue, "orders");
    assert_int_equal(keyed->attempt, 1);
    assert_string_equal(keyed->trace_id, "t-1");
    assert_string_equal(keyed->traceparent,
                        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    assert_true(keyed->timestamp_ms >= created_ms - 1 && keyed->timestamp_ms <= created_ms + 1);
    /* trace-id, traceparent, message-id, outbox-job-id, outbox-queue, outbox-attempt */
    assert_int_equal(keyed->header_count, 6);
    {
        char expected[96];

        harness_message_id(f->conn, id, 0, expected, sizeof(expected));
        assert_string_equal(keyed->message_id, expected);
    }
    assert_int_equal(other->job_id, keyless);
    assert_null(other->key);
    kafka_consumer_topic_clear(&read);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded'"),
                     2);
}

/* The rows of one ordering key land in one partition, in job order; routing keys pick the topic. */
/*
 * A replay is a message of its own, on Kafka as on every broker: its
 * message-id is the row's with ".r1" after it, so a consumer deduplicating
 * on message-id (or outbox.inbox_accept) applies it once more.
 */
static void
test_replay_has_a_message_id_of_its_own(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--topic-prefix", f->prefix, NULL};
    const char *topic = create_topic(f, "orders", 1, NULL);
    struct kafka_consumer_topic read;
    char first[96], replay[96];
    long long id;

    id = harness_query_ll(f->conn, "SELECT outbox.enqueue('orders', '{\"order\": 1}')");
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    harness_exec(f->conn, "UPDATE outbox.job SET state = 'ready', finished_at = NULL,"
                          " replays = replays + 1");
    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);
    read_topic(f, topic, &read);
    assert_int_equal(read.count, 2);
    harness_message_id(f->conn, id, 0, first, sizeof(first));
    harness_message_id(f->conn, id, 1, replay, sizeof(replay));
    assert_string_equal(read.records[0].message_id, first);
    assert_string_equal(read.records[1].message_id, replay);
    assert_int_equal(read.records[1].job_id, id);
    kafka_consumer_topic_clear(&read);
}

static void
test_per_key_order_and_routing(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--topic-prefix", f->prefix, "--batch-size", "50", NULL};
    const char *topic = create_topic(f, "events", 4, NULL);
    struct kafka_consumer_topic read;
    struct relay_process relay;
    int64_t last[5] = {0};
    int partition[5] = {-1, -1, -1, -1, -1};

    /* queue "orders", routed by routing key to topic prefix + "events" */
    harness_query_ll(f->conn,
                     "SELECT count(outbox.enqueue('orders', jsonb_build_object('n', g),"
                     " ordering_key => 'key-' || (g % 5), routing_key => 'events'))"
                     " FROM generate_series(1, 1000) AS g");
    relay_start_process(&relay, f->url, f->broker, extra);
    assert_int_equal(wait_for_value(f->conn, "SELECT count(*) FROM outbox.job"
                                             " WHERE state = 'succeeded'",
                                    1000, 120000),
                     1000);
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 15000), 0);
    unlink(relay.log_path);

    read_topic(f, topic, &read);
    assert_int_equal(read.count, 1000);
    for (size_t i = 0; i < read.count; i++) {
        const struct kafka_consumer_record *r = &read.records[i];
        int k;

        assert_non_null(r->key);
        k = atoi(r->key + strlen("key-"));
        assert_true(k >= 0 && k < 5);
        if (partition[k] < 0)
            partition[k] = r->partition;
        assert_int_equal(r->partition, partition[k]);
        assert_true(r->job_id > last[k]); /* records are in offset order per partition */
        last[k] = r->job_id;
    }
    kafka_consumer_topic_clear(&read);
}

/* A row whose topic does not exist fails alone, with the broker's error; the rest go on. */
static void
test_missing_topic_fails_only_its_rows(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--topic-prefix", f->prefix, NULL};
    const char *topic = create_topic(f, "orders", 1, NULL);
    struct kafka_consumer_topic read;
    PGresult *missing;

    harness_query_ll(f->conn, "SELECT count(outbox.enqueue('orders', jsonb_build_object('n', g)))"
                              " FROM generate_series(1, 20) AS g");
    harness_query_ll(f->conn, "SELECT outbox.enqueue('nowhere', '{\"lost\": false}')");
    harness_query_ll(f->conn, "SELECT count(outbox.enqueue('orders', jsonb_build_object('n', g)))"
                              " FROM generate_series(21, 40) AS g");

    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);

    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE queue = 'orders' AND state = 'succeeded'"),
                     40);
    missing = PQexec(f->conn, "SELECT state, attempts, coalesce(last_error, '') FROM outbox.job"
                              " WHERE queue = 'nowhere'");
    assert_int_equal(PQntuples(missing), 1);
    /* failed: back to ready for a later retry, one attempt spent, the broker's reason kept */
    assert_string_equal(PQgetvalue(missing, 0, 0), "ready");
    assert_string_equal(PQgetvalue(missing, 0, 1), "1");
    if (strstr(PQgetvalue(missing, 0, 2), "nknown topic") == NULL)
        fail_msg("last_error of the missing topic's row: '%s'", PQgetvalue(missing, 0, 2));
    PQclear(missing);
    read_topic(f, topic, &read);
    assert_int_equal(read.count, 40);
    kafka_consumer_topic_clear(&read);
}

/*
 * A record over the topic's max.message.bytes is dead at once, and the 200
 * rows around it (one attempt each, so any failure would kill them too)
 * all succeed, though the broker refuses a whole record batch over the
 * limit; one over the producer's own limit (1 MB) is dead too.
 */
static void
test_oversized_row_dead_among_200(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--topic-prefix", f->prefix, "--batch-size", "500", NULL};
    const char *const configs[] = {"max.message.bytes", "200000", NULL};
    const char *topic = create_topic(f, "orders", 1, configs);
    struct kafka_consumer_topic read;
    PGresult *dead;

    harness_query_ll(f->conn, "SELECT count(outbox.enqueue('orders', jsonb_build_object('n', g),"
                              " max_attempts => 1)) FROM generate_series(1, 100) AS g");
    harness_query_ll(f->conn, "SELECT outbox.enqueue('orders', jsonb_build_object('pad',"
                              " repeat('x', 300000)), max_attempts => 1)");
    harness_query_ll(f->conn, "SELECT count(outbox.enqueue('orders', jsonb_build_object('n', g),"
                              " max_attempts => 1)) FROM generate_series(101, 200) AS g");
    harness_query_ll(f->conn, "SELECT outbox.enqueue('orders', jsonb_build_object('pad',"
                              " repeat('y', 1500000)), max_attempts => 1)");

    assert_int_equal(relay_run_once(f->url, f->broker, extra), 0);

    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded'"),
                     200);
    dead = PQexec(f->conn, "SELECT length(payload::text), coalesce(last_error, '') FROM outbox.job"
                           " WHERE state = 'dead' ORDER BY job_id");
    assert_int_equal(PQntuples(dead), 2);
    assert_true(atoi(PQgetvalue(dead, 0, 0)) > 300000);
    assert_true(atoi(PQgetvalue(dead, 1, 0)) > 1500000);
    for (int i = 0; i < 2; i++)
        if (strstr(PQgetvalue(dead, i, 1), "too large") == NULL)
            fail_msg("last_error of oversized row %d: '%s'", i, PQgetvalue(dead, i, 1));
    PQclear(dead);
    read_topic(f, topic, &read);
    assert_int_equal(read.count, 200);
    kafka_consumer_topic_clear(&read);
}

/* --check reads the metadata: the prefix's topics are found, none is a configuration error. */
static void
test_check_names_the_topics(void **state)
{
    struct fixture *f = *state;
    char output[8192], other[96];
    const char *argv[] = {"--check", "--database-url", f->url, "--broker", f->broker,
                          "--topic-prefix", f->prefix, NULL};

    create_topic(f, "orders", 1, NULL);
    assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 0);
    if (strstr(output, "kafka topics") == NULL || strstr(output, "orders") == NULL)
        fail_msg("--check said: %s", output);
    snprintf(other, sizeof(other), "%sunused.", f->prefix);
    argv[6] = other;
    assert_int_not_equal(relay_run_capture(argv, output, sizeof(output)), 0);
    if (strstr(output, "never creates topics") == NULL)
        fail_msg("--check without topics said: %s", output);
}

/* ---- SASL and TLS --------------------------------------------------------------- */

/* The first librdkafka whose SCRAM Kafka 4 brokers accept (librdkafka issue 4895). */
#define SCRAM_FIXED_VERSION 0x020601ff
#define WRONG_PASSWORD "not-the-kafka-password-7"

/* kafka://[user[:password]@]127.0.0.1:port of the stack broker's SASL listener. */
static void
sasl_url(char *url, size_t size, const char *password)
{
    snprintf(url, size, "kafka://%s%s%s@127.0.0.1:%s", harness_env("OUTBOX_TEST_KAFKA_SASL_USER"),
             password != NULL ? ":" : "", password != NULL ? password : "",
             harness_env("OUTBOX_TEST_KAFKA_SASL_PORT"));
}

/* A file under /tmp holding password and a newline, as an operator writes one; its path. */
static void
password_file(char *path, size_t size, const char *password)
{
    FILE *file;
    int fd;

    snprintf(path, size, "/tmp/outbox-kafka-password-XXXXXX");
    fd = mkstemp(path);
    assert_true(fd >= 0);
    file = fdopen(fd, "w");
    assert_non_null(file);
    fprintf(file, "%s\n", password);
    fclose(file);
}

/* Every committed row is in topic exactly once, by message-id, and every row succeeded. */
static void
assert_topic_holds_every_row_once(struct fixture *f, const char *topic, long long rows)
{
    struct kafka_consumer_topic read;
    PGresult *ids;
    char *seen;

    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded'"),
                     rows);
    read_topic(f, topic, &read);
    assert_int_equal(read.count, rows);
    ids = PQexec(f->conn, "SELECT job_id FROM outbox.job ORDER BY job_id");
    assert_int_equal(PQntuples(ids), rows);
    seen = calloc((size_t)rows, 1);
    assert_non_null(seen);
    for (size_t i = 0; i < read.count; i++) {
        long long id = read.records[i].job_id;
        int row = -1;

        for (int r = 0; r < PQntuples(ids); r++)
            if (atoll(PQgetvalue(ids, r, 0)) == id)
                row = r;
        if (row < 0 || seen[row])
            fail_msg("record %zu: message-id %lld is %s", i, id, row < 0 ? "no row's" : "twice");
        seen[row] = 1;
    }
    free(seen);
    PQclear(ids);
    kafka_consumer_topic_clear(&read);
}

/*
 * SCRAM-SHA-256 with the user and password in the URL: every row relayed
 * once. librdkafka before 2.6.1 sends a SCRAM proof Kafka 4 refuses (the
 * Java client logs in with the same password): with such a librdkafka the
 * relay must say so in its error, and publish nothing.
 */
static void
test_sasl_scram_password_in_url(void **state)
{
    struct fixture *f = *state;
    const char *password = harness_env("OUTBOX_TEST_KAFKA_SASL_PASSWORD");
    const char *extra[] = {"--topic-prefix", f->prefix, "--kafka-sasl-mechanism", "scram-sha-256",
                           NULL};
    const char *topic = create_topic(f, "orders", 2, NULL);
    char broker[256], output[8192];
    const char *argv[] = {"--check", "--database-url", f->url, "--broker", broker,
                          "--topic-prefix", f->prefix, "--kafka-sasl-mechanism", "scram-sha-256",
                          NULL};
    struct kafka_consumer_topic read;

    sasl_url(broker, sizeof(broker), password);
    harness_query_ll(f->conn, "SELECT count(outbox.enqueue('orders', jsonb_build_object('n', g),"
                              " ordering_key => 'key-' || (g % 3))) FROM generate_series(1, 60) AS g");
    if (rd_kafka_version() >= SCRAM_FIXED_VERSION) {
        assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 0);
        assert_int_equal(relay_run_once(f->url, broker, extra), 0);
        assert_topic_holds_every_row_once(f, topic, 60);
        return;
    }
    assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 1);
    if (strstr(output, "refused the login") == NULL || strstr(output, "2.6.1") == NULL ||
        strstr(output, password) != NULL)
        fail_msg("--check with SCRAM on librdkafka %s said: %s", rd_kafka_version_str(), output);
    assert_int_equal(relay_run_once(f->url, broker, extra), 1);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'ready' AND attempts = 0"),
                     60);
    read_topic(f, topic, &read);
    assert_int_equal(read.count, 0);
    kafka_consumer_topic_clear(&read);
}

/* PLAIN with the URL naming the user only and the password in --broker-password-file. */
static void
test_sasl_plain_password_file(void **state)
{
    struct fixture *f = *state;
    const char *password = harness_env("OUTBOX_TEST_KAFKA_SASL_PASSWORD");
    char broker[256], path[64], output[8192];
    const char *extra[] = {"--topic-prefix", f->prefix, "--kafka-sasl-mechanism", "plain",
                           "--broker-password-file", path, NULL};
    const char *argv[] = {"--check", "--database-url", f->url, "--broker", broker,
                          "--topic-prefix", f->prefix, "--broker-password-file", path, NULL};
    const char *topic = create_topic(f, "orders", 3, NULL);

    sasl_url(broker, sizeof(broker), NULL);
    password_file(path, sizeof(path), password);
    harness_query_ll(f->conn, "SELECT count(outbox.enqueue('orders', jsonb_build_object('n', g),"
                              " ordering_key => 'key-' || (g % 7))) FROM generate_series(1, 200) AS g");

    /* plain is the default mechanism */
    assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 0);
    if (strstr(output, "kafka topics") == NULL || strstr(output, password) != NULL)
        fail_msg("--check with PLAIN said: %s", output);
    assert_int_equal(relay_run_once(f->url, broker, extra), 0);
    unlink(path);
    assert_topic_holds_every_row_once(f, topic, 200);
}

/*
 * A wrong password: --check fails with one line naming the refused login,
 * a relay (--once, then a daemon) stops at start without marking a row or
 * spending an attempt, and the password is in no output.
 */
static void
test_sasl_wrong_password_marks_nothing(void **state)
{
    struct fixture *f = *state;
    char broker[256], user_only[256], path[64], output[8192], line[1024] = "";
    const char *argv[] = {"--check", "--database-url", f->url, "--broker", broker,
                          "--topic-prefix", f->prefix, NULL};
    const char *extra[] = {"--once", "--topic-prefix", f->prefix, "--broker-password-file", path,
                           NULL};
    const char *const *daemon = extra + 1;
    const char *topic = create_topic(f, "orders", 1, NULL);
    struct kafka_consumer_topic read;
    struct relay_process relay;
    const char *last;
    char *log;

    sasl_url(broker, sizeof(broker), WRONG_PASSWORD);
    sasl_url(user_only, sizeof(user_only), NULL);
    password_file(path, sizeof(path), WRONG_PASSWORD);
    harness_query_ll(f->conn, "SELECT count(outbox.enqueue('orders', jsonb_build_object('n', g)))"
                              " FROM generate_series(1, 20) AS g");

    assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 1);
    /* the relay's own error is the last line */
    last = strstr(output, "outbox-relay: ");
    if (last != NULL)
        sscanf(last, "%1023[^\n]", line);
    if (strstr(line, "refused the login") == NULL || strstr(line, "uthentication") == NULL ||
        strstr(last, "\noutbox-relay: ") != NULL || strstr(output, WRONG_PASSWORD) != NULL)
        fail_msg("--check with a wrong password said: %s", output);

    for (int run = 0; run < 2; run++) {
        relay_start_process(&relay, f->url, user_only, run == 0 ? extra : daemon);
        assert_int_equal(relay_wait(&relay, 60000), 1);
        log = fixture_read_file(relay.log_path);
        if (strstr(log, "refused the login") == NULL || strstr(log, WRONG_PASSWORD) != NULL) {
            relay_dump_log(&relay);
            fail_msg("the log of a relay with a wrong password names no refused login, or it");
        }
        free(log);
        unlink(relay.log_path);
    }
    unlink(path);
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'ready' AND attempts = 0"),
                     20);
    read_topic(f, topic, &read);
    assert_int_equal(read.count, 0);
    kafka_consumer_topic_clear(&read);
}

/*
 * kafka+ssl:// to the stack broker's TLS listener: with its CA trusted
 * (SSL_CERT_FILE) every row goes through; without it, the certificate is
 * not trusted (verification is on by default) and --check says so.
 */
static void
test_tls_verified_against_the_ca(void **state)
{
    struct fixture *f = *state;
    char broker[256], output[8192];
    const char *extra[] = {"--topic-prefix", f->prefix, NULL};
    const char *argv[] = {"--check", "--database-url", f->url, "--broker", broker,
                          "--topic-prefix", f->prefix, NULL};
    const char *topic = create_topic(f, "orders", 2, NULL);
    const char *saved = getenv("SSL_CERT_FILE");
    char *previous = saved != NULL ? strdup(saved) : NULL;
    int check_without_ca;

    snprintf(broker, sizeof(broker), "kafka+ssl://127.0.0.1:%s",
             harness_env("OUTBOX_TEST_KAFKA_SSL_PORT"));
    harness_query_ll(f->conn, "SELECT count(outbox.enqueue('orders', jsonb_build_object('n', g)))"
                              " FROM generate_series(1, 50) AS g");

    unsetenv("SSL_CERT_FILE");
    check_without_ca = relay_run_capture(argv, output, sizeof(output));
    setenv("SSL_CERT_FILE", harness_env("OUTBOX_TEST_KAFKA_SSL_CA_FILE"), 1);
    assert_int_equal(check_without_ca, 1);
    if (strstr(output, "tls") == NULL || strstr(output, "certificate verify failed") == NULL)
        fail_msg("--check without the broker's CA said: %s", output);
    assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 0);
    assert_int_equal(relay_run_once(f->url, broker, extra), 0);
    if (previous != NULL)
        setenv("SSL_CERT_FILE", previous, 1);
    else
        unsetenv("SSL_CERT_FILE");
    free(previous);
    assert_topic_holds_every_row_once(f, topic, 50);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_record_fields_and_rollback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_has_a_message_id_of_its_own, setup, teardown),
        cmocka_unit_test_setup_teardown(test_per_key_order_and_routing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_topic_fails_only_its_rows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_oversized_row_dead_among_200, setup, teardown),
        cmocka_unit_test_setup_teardown(test_check_names_the_topics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sasl_scram_password_in_url, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sasl_plain_password_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sasl_wrong_password_marks_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tls_verified_against_the_ca, setup, teardown),
    };

    return cmocka_run_group_tests_name("relay_kafka", tests, NULL, NULL);
}
