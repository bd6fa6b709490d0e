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
    assert_null(sink_kind_of_url("kafka://h"));
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
    assert_int_equal(sink_url_parse("kafka://h:9092", &url, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_CONFIG);
    assert_non_null(strstr(err.message, "kafka"));
    assert_non_null(strstr(err.message, "amqp://, amqps://, redis://, redis+sentinel:// or"
                                        " redis+cluster://"));
}

/* Option names are unique across the relay and every broker, and each row is complete. */
static void
test_option_groups(void **state)
{
    const char *names[64], *title;
    const struct option_spec *rows;
    size_t count, total = 0;
    bool saw_amqp = false, saw_redis = false;

    (void)state;
    for (size_t g = 0; (rows = sink_option_group(g, &title, &count)) != NULL; g++) {
        saw_amqp |= strcmp(title, "amqp") == 0;
        saw_redis |= strcmp(title, "redis") == 0;
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
    assert_true(saw_amqp && saw_redis);
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
                          "amqp://h/", "--exchange", "events", "--redis-wait", "2", NULL};

    (void)state;
    assert_int_equal(config_parse(&config, 9, argv, &err), 0);
    assert_string_equal(config.broker.url, "amqp://h/");
    amqp = *sink_options_broker(&config.broker, "amqp");
    redis = *sink_options_broker(&config.broker, "redis");
    assert_string_equal(amqp->exchange, "events");
    assert_int_equal(redis->wait_replicas, 2);
    assert_int_equal(config.broker.max_message_bytes, 134217728);
    assert_true(amqp->tls_verify);
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
        sink *s;

        assert_int_equal(config_parse(&config, cases[i].wait != NULL ? 7 : 5, argv, &err), 0);
        s = sink_new(&config.broker, &err);
        assert_non_null(s);
        if (sink_replicas_to_wait(s) != cases[i].expected)
            fail_msg("%s with --redis-wait %s waits for %d replicas, expected %d", cases[i].url,
                     cases[i].wait ? cases[i].wait : "(default)", sink_replicas_to_wait(s),
                     cases[i].expected);
        sink_free(s);
        config_clear(&config);
    }
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
    assert_null(sink_options_broker(&options, "kafka"));
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

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kind_of_url),
        cmocka_unit_test(test_unknown_scheme_lists_the_registry),
        cmocka_unit_test(test_option_groups),
        cmocka_unit_test(test_broker_options_parse_into_the_sink_options),
        cmocka_unit_test(test_redis_wait_default_follows_the_topology),
        cmocka_unit_test(test_unparsed_defaults_match_the_rows),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
