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

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_amqp_full),   cmocka_unit_test(test_amqp_defaults),
        cmocka_unit_test(test_redis_forms), cmocka_unit_test(test_bad_urls),
        cmocka_unit_test(test_redact),
    };

    return cmocka_run_group_tests_name("url", tests, NULL, NULL);
}
