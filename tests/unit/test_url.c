/*
 * test_url.c - broker URL parsing and password redaction.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "url.h"

static void
test_amqp_full(void **state)
{
    struct broker_url url;
    struct outbox_error err;

    (void)state;
    assert_int_equal(url_parse("amqp://app:s%40cret@mq.local:5673/orders%2Fv1", &url, &err), 0);
    assert_int_equal(url.scheme, URL_AMQP);
    assert_string_equal(url.user, "app");
    assert_string_equal(url.password, "s@cret");
    assert_string_equal(url.host, "mq.local");
    assert_int_equal(url.port, 5673);
    assert_string_equal(url.vhost, "orders/v1");
    url_clear(&url);
}

static void
test_amqp_defaults(void **state)
{
    struct broker_url url;
    struct outbox_error err;

    (void)state;
    assert_int_equal(url_parse("amqp://localhost", &url, &err), 0);
    assert_string_equal(url.user, "guest");
    assert_string_equal(url.password, "guest");
    assert_int_equal(url.port, 5672);
    assert_string_equal(url.vhost, "/");
    url_clear(&url);
    assert_int_equal(url_parse("amqps://h/%2f", &url, &err), 0);
    assert_int_equal(url.scheme, URL_AMQPS);
    assert_int_equal(url.port, 5671);
    assert_string_equal(url.vhost, "/");
    url_clear(&url);
}

static void
test_redis_forms(void **state)
{
    struct broker_url url;
    struct outbox_error err;

    (void)state;
    assert_int_equal(url_parse("redis://:pw@127.0.0.1:6380/3", &url, &err), 0);
    assert_int_equal(url.scheme, URL_REDIS);
    assert_null(url.user);
    assert_string_equal(url.password, "pw");
    assert_int_equal(url.port, 6380);
    assert_int_equal(url.db, 3);
    url_clear(&url);
    assert_int_equal(url_parse("redis://relay:pw@[::1]", &url, &err), 0);
    assert_string_equal(url.user, "relay");
    assert_string_equal(url.host, "::1");
    assert_int_equal(url.port, 6379);
    assert_int_equal(url.db, 0);
    url_clear(&url);
}

/* Parsing must fail with OUTBOX_ERR_CONFIG and a message containing expected. */
static void
assert_rejected(const char *text, const char *expected)
{
    struct broker_url url;
    struct outbox_error err;

    assert_int_equal(url_parse(text, &url, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_CONFIG);
    if (strstr(err.message, expected) == NULL)
        fail_msg("'%s': message '%s' lacks '%s'", text, err.message, expected);
    assert_null(strstr(err.message, "secret"));
}

static void
test_bad_urls(void **state)
{
    (void)state;
    assert_rejected("", "empty");
    assert_rejected("localhost:5672", "no scheme");
    assert_rejected("kafka://h", "unknown broker URL scheme");
    assert_rejected("amqp://", "no host");
    assert_rejected("amqp://u:secret@h:99999/", "port");
    assert_rejected("amqp://u:secret@h:abc/", "port");
    assert_rejected("amqp://u:secret@h:/", "port");
    assert_rejected("redis://:secret@h/x", "database");
    assert_rejected("redis://h?db=1", "query");
    assert_rejected("amqp://u:se%zzcret@h/", "escape");
    assert_rejected("amqp://[::1/", "unclosed");
}

static void
test_redact(void **state)
{
    char *s;

    (void)state;
    s = url_redact("amqp://app:hunter2@mq:5672/v");
    assert_string_equal(s, "amqp://app:***@mq:5672/v");
    free(s);
    s = url_redact("redis://:p@h:1/0");
    assert_string_equal(s, "redis://:***@h:1/0");
    free(s);
    s = url_redact("postgresql://u:pw@db/app?sslmode=require&password=x2");
    assert_string_equal(s, "postgresql://u:***@db/app?sslmode=require&password=***");
    free(s);
    s = url_redact("host=db password='a b\\' c' user=u");
    assert_string_equal(s, "host=db password=*** user=u");
    free(s);
    s = url_redact("host=db user=u");
    assert_string_equal(s, "host=db user=u");
    free(s);
}

/* url_redact(text) must equal expected. */
static void
assert_redacted(const char *text, const char *expected)
{
    char *s = url_redact(text);

    assert_non_null(s);
    if (strcmp(s, expected) != 0)
        fail_msg("'%s' redacted as '%s', expected '%s'", text, s, expected);
    free(s);
}

/* Regressions found by tests/fuzz/fuzz_url.c. */
static void
test_redact_regressions(void **state)
{
    (void)state;
    /* "://" inside a conninfo value no longer makes the whole text a URI */
    assert_redacted("application_name=a://b password=secret1 host=h",
                    "application_name=a://b password=*** host=h");
    /* libpq ends the userinfo at the first '@' before '/', '?' included in the password */
    assert_redacted("postgresql://u:pass?word@db/app", "postgresql://u:***@db/app");
    assert_redacted("postgresql://u:a@b@host/db", "postgresql://u:***@b@host/db");
    /* url_parse still reads the last '@' of a broker URL */
    assert_redacted("amqp://u:p@ss@host/", "amqp://u:***@host/");
    /* a percent-encoded query key is the same key to libpq */
    assert_redacted("postgresql://db/app?%70assword=secret1", "postgresql://db/app?%70assword=***");
    /* only the query holds parameters */
    assert_redacted("postgresql://h&password=x2", "postgresql://h&password=x2");
    /* backslash escapes in unquoted conninfo values */
    assert_redacted("dbname=app password=pass\\ word host=h", "dbname=app password=*** host=h");
    /* a quoted value touching the next keyword */
    assert_redacted("host=db password='x y'user=u", "host=db password=*** user=u");
    /* "password" as a value or part of a quoted value is not a keyword */
    assert_redacted("application_name='a password=b' password=c", "application_name='a password=b' password=***");
}

/* Regressions found by tests/fuzz/fuzz_url.c: a bad scheme is not echoed. */
static void
test_scheme_message_regressions(void **state)
{
    struct broker_url url;
    struct outbox_error err;

    (void)state;
    assert_int_equal(url_parse("user:secret@kafka\n://h", &url, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_CONFIG);
    assert_null(strstr(err.message, "secret"));
    assert_null(strchr(err.message, '\n'));
    assert_non_null(strstr(err.message, "no valid scheme"));
    assert_rejected("kafka://h", "'kafka'");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_amqp_full),   cmocka_unit_test(test_amqp_defaults),
        cmocka_unit_test(test_redis_forms), cmocka_unit_test(test_bad_urls),
        cmocka_unit_test(test_redact),      cmocka_unit_test(test_redact_regressions),
        cmocka_unit_test(test_scheme_message_regressions),
    };

    return cmocka_run_group_tests_name("url", tests, NULL, NULL);
}
