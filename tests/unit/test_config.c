/*
 * test_config.c - relay options: defaults, environment, precedence, errors.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "sink_amqp.h"
#include "sink_redis.h"

#define BASE "--database-url", "postgresql://db/app", "--broker", "amqp://u:secret@mq/"

static int
parse(struct relay_config *config, struct outbox_error *err, int argc, const char *const *argv)
{
    return config_parse(config, argc, argv, err);
}

#define PARSE(config, err, ...)                                                                    \
    parse(config, err, (int)(sizeof((const char *const[]){"relay", __VA_ARGS__}) / sizeof(char *)),      \
          (const char *const[]){"relay", __VA_ARGS__})

static int
clean_env(void **state)
{
    (void)state;
    unsetenv("OUTBOX_DATABASE_URL");
    unsetenv("OUTBOX_BROKER");
    unsetenv("OUTBOX_BATCH_SIZE");
    unsetenv("OUTBOX_ONCE");
    unsetenv("OUTBOX_QUEUES");
    unsetenv("OUTBOX_LEASE");
    unsetenv("OUTBOX_HELP");
    unsetenv("OUTBOX_CHECK");
    unsetenv("OUTBOX_VERSION");
    unsetenv("OUTBOX_HEALTHCHECK");
    unsetenv("OUTBOX_METRICS_ADDR");
    unsetenv("OUTBOX_BROKER_CONNECT_TIMEOUT");
    unsetenv("OUTBOX_BROKER_IO_TIMEOUT");
    return 0;
}

static void
test_defaults(void **state)
{
    struct relay_config c;
    struct outbox_error err;

    (void)state;
    assert_int_equal(PARSE(&c, &err, BASE), 0);
    assert_string_equal(c.database_url, "postgresql://db/app");
    assert_int_equal(c.batch_size, 500);
    assert_int_equal(c.lease_seconds, 60);
    assert_int_equal(c.concurrency, 2);
    assert_string_equal(c.metrics_addr, "127.0.0.1:9187");
    assert_string_equal(((struct sink_amqp_config *)*sink_options_broker(&c.broker, "amqp"))->exchange,
                        "");
    assert_null(c.queues);
    assert_false(c.once);
    assert_int_equal(c.poll_interval_ms, 100);
    assert_int_equal(
        ((struct sink_redis_config *)*sink_options_broker(&c.broker, "redis"))->dedup_window_ms,
        24LL * 3600 * 1000);
    assert_true(((struct sink_amqp_config *)*sink_options_broker(&c.broker, "amqp"))->tls_verify);
    assert_false(c.block_on_dead_head);
    assert_false(c.delete_on_success);
    assert_int_equal(c.log_level, CONFIG_LOG_INFO);
    config_clear(&c);
}

static void
test_environment_and_precedence(void **state)
{
    struct relay_config c;
    struct outbox_error err;

    (void)state;
    setenv("OUTBOX_DATABASE_URL", "postgresql://env/db", 1);
    setenv("OUTBOX_BROKER", "redis://localhost", 1);
    setenv("OUTBOX_BATCH_SIZE", "50", 1);
    setenv("OUTBOX_ONCE", "true", 1);
    setenv("OUTBOX_QUEUES", "a,b.c", 1);
    assert_int_equal(PARSE(&c, &err, "--batch-size", "70"), 0);
    assert_string_equal(c.database_url, "postgresql://env/db");
    assert_int_equal(c.batch_size, 70); /* the command line wins */
    assert_false(c.once);               /* flags come from the command line only */
    assert_int_equal(c.queue_count, 2);
    assert_string_equal(c.queues[0], "a");
    assert_string_equal(c.queues[1], "b.c");
    assert_null(c.queues[2]);
    config_clear(&c);
    clean_env(NULL);
}

static void
test_forms(void **state)
{
    struct relay_config c;
    struct outbox_error err;

    (void)state;
    assert_int_equal(PARSE(&c, &err, BASE, "--lease=30", "--retention", "7d", "--poll-interval",
                           "250ms", "--ordering-dead-policy", "block", "--log-format", "json",
                           "--on-success", "delete", "--check"),
                     0);
    assert_int_equal(c.lease_seconds, 30);
    assert_float_equal(c.retention_seconds, 7 * 86400.0, 0.001);
    assert_int_equal(c.poll_interval_ms, 250);
    assert_true(c.block_on_dead_head);
    assert_true(c.delete_on_success);
    assert_int_equal(c.log_format, CONFIG_LOG_JSON);
    assert_true(c.check);
    config_clear(&c);
}

/* The parse must fail with a message that contains expected and no password. */
static void
assert_error(int rc, const struct outbox_error *err, const char *expected)
{
    assert_int_equal(rc, -1);
    assert_int_equal(err->code, OUTBOX_ERR_CONFIG);
    if (strstr(err->message, expected) == NULL)
        fail_msg("message '%s' lacks '%s'", err->message, expected);
    assert_null(strstr(err->message, "secret"));
    assert_null(strchr(err->message, '\n'));
}

static void
test_errors_name_the_option(void **state)
{
    struct relay_config c;
    struct outbox_error err;

    (void)state;
    assert_error(PARSE(&c, &err, "--broker", "amqp://h/"), &err, "--database-url is required");
    assert_error(PARSE(&c, &err, "--database-url", "x"), &err, "--broker is required");
    assert_error(PARSE(&c, &err, BASE, "--batch-size", "0"), &err, "--batch-size");
    assert_error(PARSE(&c, &err, BASE, "--batch-size", "12x"), &err, "--batch-size");
    assert_error(PARSE(&c, &err, BASE, "--lease"), &err, "--lease needs a value");
    assert_error(PARSE(&c, &err, BASE, "--bogus", "1"), &err, "unknown option '--bogus'");
    assert_error(PARSE(&c, &err, BASE, "stray"), &err, "unexpected argument 'stray'");
    assert_error(PARSE(&c, &err, BASE, "--queues", "a,,b"), &err, "--queues");
    assert_error(PARSE(&c, &err, BASE, "--queues", "with space"), &err, "invalid queue name");
    assert_error(PARSE(&c, &err, BASE, "--retention", "soon"), &err, "--retention");
    assert_error(PARSE(&c, &err, BASE, "--log-format", "xml"), &err, "text|json");
    assert_error(PARSE(&c, &err, "--database-url", "dbname=x", "--broker", "mqtt://u:secret@h"),
                 &err, "--broker: unknown broker URL scheme");
    assert_error(PARSE(&c, &err, "--database-url", "dbname=x", "--broker", "amqp://u:secret@h:0/"),
                 &err, "--broker");
    setenv("OUTBOX_BATCH_SIZE", "many", 1);
    assert_error(PARSE(&c, &err, BASE), &err, "OUTBOX_BATCH_SIZE");
    clean_env(NULL);
}

/*
 * Broker options that could never work are refused before any connection:
 * an option of another broker on the command line (from the environment it
 * is only ignored), a NATS prefix over the control line or in the server's
 * reserved spaces, a Kafka user without a password or a password alone.
 */
static void
test_broker_option_mistakes(void **state)
{
    struct relay_config c;
    struct outbox_error err;
    char prefix[4202];

    (void)state;
    assert_error(PARSE(&c, &err, "--database-url", "dbname=x", "--broker", "nats://h",
                       "--topic-prefix", "t."),
                 &err, "--topic-prefix is an option of kafka");
    assert_error(PARSE(&c, &err, "--database-url", "dbname=x", "--broker", "amqp://h/",
                       "--subject-prefix", "s."),
                 &err, "--subject-prefix is an option of nats");
    setenv("OUTBOX_TOPIC_PREFIX", "t.", 1);
    assert_int_equal(PARSE(&c, &err, "--database-url", "dbname=x", "--broker", "nats://h"), 0);
    assert_non_null(strstr(c.ignored_options, "--topic-prefix"));
    config_clear(&c);
    unsetenv("OUTBOX_TOPIC_PREFIX");

    memset(prefix, 'a', sizeof(prefix) - 1);
    prefix[sizeof(prefix) - 1] = '\0';
    assert_error(PARSE(&c, &err, "--database-url", "dbname=x", "--broker", "nats://h",
                       "--subject-prefix", prefix),
                 &err, "--subject-prefix");
    assert_true(strlen(err.message) < 400);
    assert_error(PARSE(&c, &err, "--database-url", "dbname=x", "--broker", "nats://h",
                       "--subject-prefix", "$JS.API."),
                 &err, "server's api");
    assert_error(PARSE(&c, &err, "--database-url", "dbname=x", "--broker", "nats://h",
                       "--subject-prefix", "_INBOX.x."),
                 &err, "_INBOX.");

    assert_error(PARSE(&c, &err, "--database-url", "dbname=x", "--broker", "kafka://:secret@h"),
                 &err, "--broker: a kafka password needs a user");
    assert_error(PARSE(&c, &err, "--database-url", "dbname=x", "--broker", "kafka://relay@h"),
                 &err, "--broker: kafka user 'relay' has no password");
}

/* A 256-byte exchange is an --exchange error, not a --broker one. */
static void
test_exchange_longer_than_amqp_allows(void **state)
{
    struct relay_config c;
    struct outbox_error err;
    char name[257];

    (void)state;
    memset(name, 'e', 255);
    name[255] = '\0';
    assert_int_equal(PARSE(&c, &err, BASE, "--exchange", name), 0);
    config_clear(&c);
    name[255] = 'e';
    name[256] = '\0';
    assert_error(PARSE(&c, &err, BASE, "--exchange", name), &err, "--exchange: longer than 255");
    assert_null(strstr(err.message, "--broker"));
}

/* libpq cannot read it: a configuration error naming --database-url, no password. */
static void
test_malformed_database_url(void **state)
{
    static const char *const urls[] = {
        "postgresql://u:secret%zz@db/app",
        "postgresql://u:secret%00@db/app",
        "postgresql://u@db/app?password=secret%zz",
        "postgresql://u:secret@[db/app",
        "host=db password=secret bogus=1",
        "host=db password='secret",
        "dbname=postgresql://u:secret%zz@db/app",
    };

    (void)state;
    for (size_t i = 0; i < sizeof(urls) / sizeof(urls[0]); i++) {
        struct relay_config c;
        struct outbox_error err;

        assert_error(PARSE(&c, &err, "--database-url", urls[i], "--broker", "redis://h"), &err,
                     "--database-url: ");
    }
}

/*
 * The command line wins, so the variable it overrides is not even read (a
 * bad one is no error); the action flags are never read from the
 * environment.
 */
static void
test_environment_rules(void **state)
{
    struct relay_config c;
    struct outbox_error err;

    (void)state;
    setenv("OUTBOX_BATCH_SIZE", "many", 1);
    setenv("OUTBOX_LEASE", "-1", 1);
    setenv("OUTBOX_DATABASE_URL", "postgresql://u:secret%zz@db/app", 1);
    assert_int_equal(PARSE(&c, &err, BASE, "--batch-size", "20", "--lease=10"), 0);
    assert_int_equal(c.batch_size, 20);
    assert_int_equal(c.lease_seconds, 10);
    config_clear(&c);
    assert_error(PARSE(&c, &err, BASE, "--lease=10"), &err, "OUTBOX_BATCH_SIZE");
    clean_env(NULL);

    setenv("OUTBOX_HELP", "1", 1);
    setenv("OUTBOX_ONCE", "yes", 1);
    setenv("OUTBOX_CHECK", "true", 1);
    setenv("OUTBOX_VERSION", "on", 1);
    setenv("OUTBOX_HEALTHCHECK", "yes", 1);
    assert_int_equal(PARSE(&c, &err, BASE), 0);
    assert_false(c.healthcheck);
    assert_false(c.help);
    assert_false(c.once);
    assert_false(c.check);
    assert_false(c.version);
    config_clear(&c);
    assert_int_equal(PARSE(&c, &err, BASE, "--once"), 0);
    assert_true(c.once);
    config_clear(&c);
    clean_env(NULL);

    /* a health check asks a running relay: it needs neither a database nor a broker URL */
    setenv("OUTBOX_METRICS_ADDR", "0.0.0.0:9187", 1);
    assert_int_equal(PARSE(&c, &err, "--healthcheck"), 0);
    assert_true(c.healthcheck);
    assert_string_equal(c.metrics_addr, "0.0.0.0:9187");
    config_clear(&c);
    clean_env(NULL);
}

/*
 * --broker-connect-timeout and --broker-io-timeout: the defaults of
 * timeouts.h, the units of every duration, the environment, a range with
 * a one-line error naming the option.
 */
static void
test_broker_timeouts(void **state)
{
    struct relay_config c;
    struct outbox_error err;
    sink *s;

    (void)state;
    assert_int_equal(PARSE(&c, &err, BASE), 0);
    assert_int_equal(c.broker_connect_timeout_ms, 5000);
    assert_int_equal(c.broker_io_timeout_ms, 10000);
    config_clear(&c);

    assert_int_equal(PARSE(&c, &err, BASE, "--broker-connect-timeout", "1500ms",
                           "--broker-io-timeout=2m"),
                     0);
    assert_int_equal(c.broker_connect_timeout_ms, 1500);
    assert_int_equal(c.broker_io_timeout_ms, 120000);
    s = config_sink_new(&c, &err); /* the sink the relay makes from them: no I/O */
    assert_non_null(s);
    sink_free(s);
    config_clear(&c);

    setenv("OUTBOX_BROKER_IO_TIMEOUT", "30s", 1);
    setenv("OUTBOX_BROKER_CONNECT_TIMEOUT", "3s", 1);
    assert_int_equal(PARSE(&c, &err, BASE, "--broker-connect-timeout", "1s"), 0);
    assert_int_equal(c.broker_io_timeout_ms, 30000);
    assert_int_equal(c.broker_connect_timeout_ms, 1000); /* the command line wins */
    config_clear(&c);
    setenv("OUTBOX_BROKER_IO_TIMEOUT", "forever", 1);
    assert_error(PARSE(&c, &err, BASE), &err, "OUTBOX_BROKER_IO_TIMEOUT");
    clean_env(NULL);

    assert_error(PARSE(&c, &err, BASE, "--broker-io-timeout", "0"), &err, "--broker-io-timeout");
    assert_error(PARSE(&c, &err, BASE, "--broker-io-timeout", "999ms"), &err,
                 "--broker-io-timeout");
    assert_error(PARSE(&c, &err, BASE, "--broker-io-timeout", "6m"), &err, "--broker-io-timeout");
    assert_error(PARSE(&c, &err, BASE, "--broker-connect-timeout", "-1s"), &err,
                 "--broker-connect-timeout");
    assert_error(PARSE(&c, &err, BASE, "--broker-connect-timeout", "soon"), &err,
                 "--broker-connect-timeout");
    assert_error(PARSE(&c, &err, BASE, "--broker-connect-timeout"), &err,
                 "--broker-connect-timeout needs a value");
}

static void
test_help_lists_every_option(void **state)
{
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);

    (void)state;
    config_usage(out);
    fclose(out);
    assert_non_null(strstr(text, "--database-url URL"));
    assert_non_null(strstr(text, "--metrics-addr HOST:PORT"));
    assert_non_null(strstr(text, "OUTBOX_<NAME>"));
    assert_non_null(strstr(text, "[500]"));
    /* a name longer than the column: its text on the next line, where mkman.sh looks for it */
    assert_non_null(strstr(text, "\n  --broker-connect-timeout DURATION\n"
                                 "                                 longest connect"));
    assert_non_null(strstr(text, "--broker-io-timeout DURATION   longest wait for the broker"));
    assert_non_null(strstr(text, "keep it well under --lease [10s]\n"));
    assert_non_null(strstr(text, "--once, --check, --healthcheck, --help and --version are read\n"
                                 "from the command line only"));
    free(text);
}

/* Regressions found by tests/fuzz/fuzz_config.c: no password, no line break in messages. */
static void
test_message_regressions(void **state)
{
    struct relay_config c;
    struct outbox_error err;

    (void)state;
    /* a forgotten value takes the next argument, which may hold a password */
    assert_error(PARSE(&c, &err, "--batch-size", "--database-url=postgres://u:secret@db/app"), &err,
                 "--batch-size");
    assert_error(PARSE(&c, &err, "--lease", "password=secret host=db"), &err, "--lease");
    assert_error(PARSE(&c, &err, "amqp://u:secret@h/"), &err, "unexpected argument");
    assert_error(PARSE(&c, &err, "--redis://:secret@h"), &err, "unknown option");
    assert_error(PARSE(&c, &err, BASE, "--lease=1\n0"), &err, "'1?0'");
    assert_error(PARSE(&c, &err, BASE, "--queues=a,b\nc"), &err, "invalid queue name 'b?c'");
    assert_error(PARSE(&c, &err, "--broker=user:secret@kafka\n://h", "--database-url=dbname=x"), &err,
                 "--broker");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_defaults, clean_env),
        cmocka_unit_test_setup(test_environment_and_precedence, clean_env),
        cmocka_unit_test_setup(test_forms, clean_env),
        cmocka_unit_test_setup(test_errors_name_the_option, clean_env),
        cmocka_unit_test_setup(test_broker_option_mistakes, clean_env),
        cmocka_unit_test_setup(test_exchange_longer_than_amqp_allows, clean_env),
        cmocka_unit_test_setup(test_malformed_database_url, clean_env),
        cmocka_unit_test_setup(test_environment_rules, clean_env),
        cmocka_unit_test_setup(test_broker_timeouts, clean_env),
        cmocka_unit_test(test_help_lists_every_option),
        cmocka_unit_test_setup(test_message_regressions, clean_env),
    };

    return cmocka_run_group_tests_name("config", tests, NULL, NULL);
}
