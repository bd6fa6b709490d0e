/*
 * test_sink.c - the sink registry: every broker's schemes, kind and options
 * come from its row, and nothing else needs to name a broker.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "config.h"
#include "sink_amqp.h"
#include "sink_kafka.h"
#include "sink_nats.h"
#include "sink_redis.h"
#include "sink.h"
#include "url.h"

static void
test_kind_of_url(void **state)
{
    (void)state;
    assert_string_equal(sink_kind_of_url("amqp://h/"), "amqp");
    assert_string_equal(sink_kind_of_url("amqps://u:p@h1,h2/v"), "amqp");
    assert_string_equal(sink_kind_of_url("redis://h:6379/0"), "redis");
    assert_string_equal(sink_kind_of_url("redis+sentinel://s1,s2/m"), "redis");
    assert_string_equal(sink_kind_of_url("redis+cluster://n1,n2"), "redis");
    assert_string_equal(sink_kind_of_url("nats://h1:4222,h2:4222"), "nats");
    assert_string_equal(sink_kind_of_url("tls://t0ken@h"), "nats");
    assert_string_equal(sink_kind_of_url("kafka://k1:9092,k2"), "kafka");
    assert_string_equal(sink_kind_of_url("kafka+ssl://k1"), "kafka");
    assert_null(sink_kind_of_url("mqtt://h"));
    assert_null(sink_kind_of_url("redis"));
    assert_null(sink_kind_of_url(NULL));
}

/* The unknown-scheme error lists every scheme of the registry, from the rows. */
static void
test_unknown_scheme_lists_the_registry(void **state)
{
    struct broker_url url;
    struct outbox_error err;

    (void)state;
    assert_int_equal(sink_url_parse("mqtt://h:1883", &url, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_CONFIG);
    assert_non_null(strstr(err.message, "mqtt"));
    assert_non_null(strstr(err.message, "amqp://, amqps://, redis://, redis+sentinel://,"
                                        " redis+cluster://, nats://, tls://, kafka:// or kafka+ssl://"));
}

/* Option names are unique across the relay and every broker, and each row is complete. */
static void
test_option_groups(void **state)
{
    const char *names[64], *title;
    const struct option_spec *rows;
    size_t count, total = 0;
    bool saw_amqp = false, saw_redis = false, saw_nats = false, saw_kafka = false;

    (void)state;
    for (size_t g = 0; (rows = sink_option_group(g, &title, &count)) != NULL; g++) {
        saw_amqp |= strcmp(title, "amqp") == 0;
        saw_redis |= strcmp(title, "redis") == 0;
        saw_nats |= strcmp(title, "nats") == 0;
        saw_kafka |= strcmp(title, "kafka") == 0;
        for (size_t i = 0; i < count; i++) {
            assert_non_null(rows[i].help);
            if (g == 0) /* the shared rows; a broker's are into its own struct */
                assert_true(rows[i].offset + rows[i].size <= sizeof(struct sink_options));
            for (size_t j = 0; j < total; j++)
                assert_string_not_equal(names[j], rows[i].name);
            assert_true(total < 64);
            names[total++] = rows[i].name;
        }
    }
    assert_true(saw_amqp && saw_redis && saw_nats && saw_kafka);
    assert_string_equal(names[0], "broker");
}

/* A broker's option reaches its own configuration and is validated by its row. */
static void
test_broker_options_parse_into_the_sink_options(void **state)
{
    struct relay_config config;
    struct outbox_error err;
    char long_name[300];
    struct sink_amqp_config *amqp;
    struct sink_redis_config *redis;
    const char *argv[] = {"outbox-relay", "--database-url", "postgresql://h/db", "--broker",
                          "amqp://h/", "--exchange", "events", NULL};
    const char *redis_argv[] = {"outbox-relay", "--database-url", "postgresql://h/db", "--broker",
                                "redis://h/", "--redis-wait", "2", NULL};

    (void)state;
    assert_int_equal(config_parse(&config, 7, argv, &err), 0);
    assert_string_equal(config.broker.url, "amqp://h/");
    amqp = *sink_options_broker(&config.broker, "amqp");
    assert_string_equal(amqp->exchange, "events");
    assert_int_equal(config.broker.max_message_bytes, 134217728);
    assert_true(amqp->tls_verify);
    config_clear(&config);

    assert_int_equal(config_parse(&config, 7, redis_argv, &err), 0);
    redis = *sink_options_broker(&config.broker, "redis");
    assert_int_equal(redis->wait_replicas, 2);
    config_clear(&config);

    memset(long_name, 'x', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    argv[6] = long_name;
    assert_int_equal(config_parse(&config, 7, argv, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_CONFIG);
    assert_non_null(strstr(err.message, "--exchange: longer than 255 bytes"));
}

/*
 * Sentinel and Cluster fail over to a replica: by default a row is marked
 * only once one replica has its append; one server waits for none; an
 * explicit --redis-wait (0 too) wins; AMQP never waits.
 */
static void
test_redis_wait_default_follows_the_topology(void **state)
{
    static const struct {
        const char *url;
        const char *wait; /* NULL: not given */
        int expected;
    } cases[] = {
        {"redis+sentinel://s1:26379,s2:26379/main", NULL, 1},
        {"redis+cluster://n1:7000,n2:7001", NULL, 1},
        {"redis://h:6379/0", NULL, 0},
        {"redis+sentinel://s1:26379/main", "0", 0},
        {"redis+cluster://n1:7000", "0", 0},
        {"redis+cluster://n1:7000", "2", 2},
        {"redis://h:6379/0", "1", 1},
        {"amqp://h/", NULL, 0},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *argv[] = {"outbox-relay", "--database-url", "postgresql://h/db", "--broker",
                              cases[i].url, "--redis-wait", cases[i].wait, NULL};
        struct relay_config config;
        struct outbox_error err;
        struct sink_replication replication;
        sink *s;

        assert_int_equal(config_parse(&config, cases[i].wait != NULL ? 7 : 5, argv, &err), 0);
        s = sink_new(&config.broker, &err);
        assert_non_null(s);
        sink_replication(s, &replication);
        if (replication.wait != cases[i].expected)
            fail_msg("%s with --redis-wait %s waits for %d replicas, expected %d", cases[i].url,
                     cases[i].wait ? cases[i].wait : "(default)", replication.wait,
                     cases[i].expected);
        sink_free(s);
        config_clear(&config);
    }
}

/*
 * NATS: a server list with the default port, a token as the URL's user; a
 * prefix that can make no valid subject is a configuration error at
 * sink_new(), before anything connects.
 */
static void
test_nats_urls_and_subject_prefix(void **state)
{
    struct broker_url url;
    struct outbox_error err;
    struct sink_nats_config nats = {.subject_prefix = "events."};
    struct sink_options options = {.url = "nats://t0ken@h1,h2:4223"};
    const char *const bad[] = {"events.*.", "events..", ".events", "ev ents.", "events.>"};
    sink *s;

    (void)state;
    *sink_options_broker(&options, "nats") = &nats;
    assert_int_equal(sink_url_parse("nats://t0ken@h1,h2:4223", &url, &err), 0);
    assert_int_equal(url.endpoint_count, 2);
    assert_int_equal(url.endpoints[0].port, 4222);
    assert_int_equal(url.endpoints[1].port, 4223);
    assert_string_equal(url.user, "t0ken");
    assert_null(url.password);
    url_clear(&url);
    assert_int_equal(sink_url_parse("tls://u:p@h", &url, &err), 0);
    assert_true(url.scheme->tls);
    url_clear(&url);

    s = sink_new(&options, &err);
    assert_non_null(s);
    assert_string_equal(sink_kind(s), "nats");
    assert_string_equal(sink_display_url(s), "nats://***@h1,h2:4223");
    assert_int_equal(sink_endpoint_count(s), 2);
    sink_free(s);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        nats.subject_prefix = bad[i];
        assert_null(sink_new(&options, &err));
        assert_int_equal(err.code, OUTBOX_ERR_CONFIG);
        assert_non_null(strstr(err.message, "not a valid nats subject prefix"));
    }
}

/*
 * Kafka: bootstrap lists with default ports, TLS by scheme, a redacted
 * password; its options parse into the sink options; sink_new validates
 * without connecting.
 */
static void
test_kafka_url_and_options(void **state)
{
    struct broker_url url;
    struct outbox_error err;
    struct relay_config config;
    struct sink_kafka_config *kafka;
    char long_prefix[300];
    const char *argv[] = {"outbox-relay", "--database-url", "postgresql://h/db", "--broker",
                          "kafka://relay:secret@k1:9093,k2,[::1]:9094", "--topic-prefix",
                          "orders.", "--kafka-sasl-mechanism", "scram-sha-512", NULL};
    sink *s;

    (void)state;
    assert_int_equal(sink_url_parse(argv[4], &url, &err), 0);
    assert_string_equal(url.scheme->name, "kafka");
    assert_false(url.scheme->tls);
    assert_string_equal(url.user, "relay");
    assert_string_equal(url.password, "secret");
    assert_int_equal(url.endpoint_count, 3);
    assert_int_equal(url.endpoints[0].port, 9093);
    assert_string_equal(url.endpoints[1].host, "k2");
    assert_int_equal(url.endpoints[1].port, 9092);
    assert_string_equal(url.endpoints[2].host, "::1");
    url_clear(&url);
    assert_int_equal(sink_url_parse("kafka+ssl://k1", &url, &err), 0);
    assert_true(url.scheme->tls);
    assert_int_equal(url.port, 9093);
    url_clear(&url);
    assert_int_equal(sink_url_parse("kafka://k1/3", &url, &err), -1);

    assert_int_equal(config_parse(&config, 9, argv, &err), 0);
    kafka = *sink_options_broker(&config.broker, "kafka");
    assert_string_equal(kafka->topic_prefix, "orders.");
    assert_int_equal(kafka->sasl_mechanism, 2);
    s = sink_new(&config.broker, &err);
    assert_non_null(s);
    assert_string_equal(sink_kind(s), "kafka");
    assert_string_equal(sink_display_url(s), "kafka://relay:***@k1:9093,k2,[::1]:9094");
    assert_false(sink_is_connected(s));
    /* librdkafka uses the bootstrap servers together: no endpoint of the list is "the one" */
    assert_int_equal(sink_endpoint_count(s), 0);
    sink_free(s);
    config_clear(&config);

    memset(long_prefix, 'p', sizeof(long_prefix) - 1);
    long_prefix[sizeof(long_prefix) - 1] = '\0';
    argv[6] = long_prefix;
    assert_int_equal(config_parse(&config, 9, argv, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_CONFIG);
    assert_non_null(strstr(err.message, "--topic-prefix"));
    assert_null(strstr(err.message, "secret"));
    argv[6] = "orders.";
    argv[8] = "gssapi";
    assert_int_equal(config_parse(&config, 9, argv, &err), -1);
    assert_non_null(strstr(err.message, "--kafka-sasl-mechanism"));
}

/* A Kafka configuration built by hand is read at sink_new(): a mechanism past the list is refused. */
static void
test_kafka_config_by_hand(void **state)
{
    struct sink_kafka_config kafka = {.topic_prefix = "orders.", .sasl_mechanism = 3};
    struct sink_options options = {.url = "kafka://u:p@k1"};
    struct outbox_error err;
    sink *s;

    (void)state;
    *sink_options_broker(&options, "kafka") = &kafka;
    assert_null(sink_new(&options, &err));
    assert_int_equal(err.code, OUTBOX_ERR_CONFIG);
    assert_non_null(strstr(err.message, "kafka sasl mechanism 3 is unknown"));
    kafka.sasl_mechanism = 1;
    s = sink_new(&options, &err);
    assert_non_null(s);
    sink_free(s);
}

/*
 * A broker's configuration as sink_options_init() leaves it (what tests
 * and tools open sinks with) equals what parsing no option gives: the
 * module's defaults and its rows' fallbacks agree.
 */
static void
test_unparsed_defaults_match_the_rows(void **state)
{
    const char *argv[] = {"outbox-relay", "--database-url", "postgresql://h/db", "--broker",
                          "redis://h/", NULL};
    struct relay_config config;
    struct sink_options options = {.url = "redis://h/"};
    struct sink_amqp_config *amqp, *parsed_amqp;
    struct sink_redis_config *redis, *parsed_redis;
    struct outbox_error err;

    (void)state;
    assert_int_equal(config_parse(&config, 5, argv, &err), 0);
    assert_int_equal(sink_options_init(&options, &err), 0);
    amqp = *sink_options_broker(&options, "amqp");
    redis = *sink_options_broker(&options, "redis");
    parsed_amqp = *sink_options_broker(&config.broker, "amqp");
    parsed_redis = *sink_options_broker(&config.broker, "redis");
    assert_null(sink_options_broker(&options, "mqtt"));
    assert_true(amqp->exchange == NULL || strcmp(amqp->exchange, parsed_amqp->exchange) == 0);
    assert_int_equal(amqp->tls_verify, parsed_amqp->tls_verify);
    assert_true(redis->stream_prefix == NULL ||
                strcmp(redis->stream_prefix, parsed_redis->stream_prefix) == 0);
    assert_int_equal(redis->dedup_window_ms, parsed_redis->dedup_window_ms);
    assert_int_equal(redis->stream_maxlen, parsed_redis->stream_maxlen);
    assert_int_equal(redis->wait_replicas, parsed_redis->wait_replicas);
    sink_options_clear(&options);
    assert_null(options.broker_config[0]);
    config_clear(&config);
}

/* The same for NATS and Kafka: an unparsed configuration is what no option gives. */
static void
test_unparsed_nats_kafka_defaults_match_the_rows(void **state)
{
    const char *argv[] = {"outbox-relay", "--database-url", "postgresql://h/db", "--broker",
                          "nats://h", NULL};
    struct relay_config config;
    struct sink_options options = {.url = "nats://h"};
    struct sink_nats_config *nats, *parsed_nats;
    struct sink_kafka_config *kafka, *parsed_kafka;
    struct outbox_error err;

    (void)state;
    assert_int_equal(config_parse(&config, 5, argv, &err), 0);
    assert_int_equal(sink_options_init(&options, &err), 0);
    nats = *sink_options_broker(&options, "nats");
    kafka = *sink_options_broker(&options, "kafka");
    parsed_nats = *sink_options_broker(&config.broker, "nats");
    parsed_kafka = *sink_options_broker(&config.broker, "kafka");
    assert_true(nats->subject_prefix == NULL ||
                strcmp(nats->subject_prefix, parsed_nats->subject_prefix) == 0);
    assert_true(parsed_nats->subject_prefix == NULL || parsed_nats->subject_prefix[0] == '\0');
    assert_null(nats->nats_creds);
    assert_null(parsed_nats->nats_creds);
    assert_true(kafka->topic_prefix == NULL ||
                strcmp(kafka->topic_prefix, parsed_kafka->topic_prefix) == 0);
    assert_true(parsed_kafka->topic_prefix == NULL || parsed_kafka->topic_prefix[0] == '\0');
    assert_int_equal(kafka->sasl_mechanism, parsed_kafka->sasl_mechanism);
    sink_options_clear(&options);
    config_clear(&config);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kind_of_url),
        cmocka_unit_test(test_unknown_scheme_lists_the_registry),
        cmocka_unit_test(test_option_groups),
        cmocka_unit_test(test_broker_options_parse_into_the_sink_options),
        cmocka_unit_test(test_redis_wait_default_follows_the_topology),
        cmocka_unit_test(test_nats_urls_and_subject_prefix),
        cmocka_unit_test(test_kafka_url_and_options),
        cmocka_unit_test(test_kafka_config_by_hand),
        cmocka_unit_test(test_unparsed_defaults_match_the_rows),
        cmocka_unit_test(test_unparsed_nats_kafka_defaults_match_the_rows),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
