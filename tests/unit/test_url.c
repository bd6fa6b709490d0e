/*
 * test_url.c - broker URL parsing and password redaction.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "sink.h"
#include "url.h"
#include "sink_amqp.h"
#include "sink_redis.h"

static void
test_amqp_full(void **state)
{
    struct broker_url url;
    struct outbox_error err;

    (void)state;
    assert_int_equal(sink_url_parse("amqp://app:s%40cret@mq.local:5673/orders%2Fv1", &url, &err), 0);
    assert_string_equal(url.scheme->name, "amqp");
    assert_string_equal(url.user, "app");
    assert_string_equal(url.password, "s@cret");
    assert_string_equal(url.host, "mq.local");
    assert_int_equal(url.port, 5673);
    assert_string_equal(sink_amqp_url_vhost(&url), "orders/v1");
    url_clear(&url);
}

static void
test_amqp_defaults(void **state)
{
    struct broker_url url;
    struct outbox_error err;

    (void)state;
    assert_int_equal(sink_url_parse("amqp://localhost", &url, &err), 0);
    assert_string_equal(url.user, "guest");
    assert_string_equal(url.password, "guest");
    assert_int_equal(url.port, 5672);
    assert_string_equal(sink_amqp_url_vhost(&url), "/");
    url_clear(&url);
    assert_int_equal(sink_url_parse("amqps://h/%2f", &url, &err), 0);
    assert_string_equal(url.scheme->name, "amqps");
    assert_int_equal(url.port, 5671);
    assert_string_equal(sink_amqp_url_vhost(&url), "/");
    url_clear(&url);
}

static void
test_redis_forms(void **state)
{
    struct broker_url url;
    struct outbox_error err;

    (void)state;
    assert_int_equal(sink_url_parse("redis://:pw@127.0.0.1:6380/3", &url, &err), 0);
    assert_string_equal(url.scheme->name, "redis");
    assert_null(url.user);
    assert_string_equal(url.password, "pw");
    assert_int_equal(url.port, 6380);
    assert_int_equal(sink_redis_url_db(&url), 3);
    url_clear(&url);
    assert_int_equal(sink_url_parse("redis://relay:pw@[::1]", &url, &err), 0);
    assert_string_equal(url.user, "relay");
    assert_string_equal(url.host, "::1");
    assert_int_equal(url.port, 6379);
    assert_int_equal(sink_redis_url_db(&url), 0);
    url_clear(&url);
}

/* Parsing must fail with OUTBOX_ERR_CONFIG and a message containing expected. */
static void
assert_rejected(const char *text, const char *expected)
{
    struct broker_url url;
    struct outbox_error err;

    assert_int_equal(sink_url_parse(text, &url, &err), -1);
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
    assert_rejected("mqtt://h", "unknown broker URL scheme");
    assert_rejected("amqp://", "no host");
    assert_rejected("amqp://u:secret@h:99999/", "port");
    assert_rejected("amqp://u:secret@h:abc/", "port");
    assert_rejected("amqp://u:secret@h:/", "port");
    assert_rejected("redis://:secret@h/x", "database");
    assert_rejected("redis://h?db=1", "query");
    assert_rejected("amqp://u:se%zzcret@h/", "escape");
    assert_rejected("amqp://[::1/", "unclosed");
}

/* The endpoint list of url must read as expected, "host:port" joined by ','. */
static void
assert_endpoints(const struct broker_url *url, const char *expected)
{
    char joined[1024] = "", one[URL_ENDPOINT_TEXT_MAX];

    for (size_t i = 0; i < url->endpoint_count; i++) {
        if (i > 0)
            strcat(joined, ",");
        strcat(joined, url_endpoint_format(&url->endpoints[i], one, sizeof(one)));
    }
    if (strcmp(joined, expected) != 0)
        fail_msg("endpoints '%s', expected '%s'", joined, expected);
}

static void
test_amqp_endpoint_list(void **state)
{
    struct broker_url url;
    struct outbox_error err;

    (void)state;
    assert_int_equal(sink_url_parse("amqp://app:s%2Cc,ret@h1:5673,h2,[::1]:5674/orders", &url, &err), 0);
    assert_string_equal(url.scheme->name, "amqp");
    assert_int_equal(url.endpoint_count, 3);
    assert_endpoints(&url, "h1:5673,h2:5672,[::1]:5674");
    assert_string_equal(url.endpoints[2].host, "::1");
    /* the first endpoint stays readable as host and port */
    assert_string_equal(url.host, "h1");
    assert_int_equal(url.port, 5673);
    assert_string_equal(url.user, "app");
    assert_string_equal(url.password, "s,c,ret");
    assert_string_equal(sink_amqp_url_vhost(&url), "orders");
    url_clear(&url);

    assert_int_equal(sink_url_parse("amqps://[fe80::1],[fe80::2]:6000", &url, &err), 0);
    assert_string_equal(url.scheme->name, "amqps");
    assert_endpoints(&url, "[fe80::1]:5671,[fe80::2]:6000");
    assert_string_equal(sink_amqp_url_vhost(&url), "/");
    url_clear(&url);

    /* a lone endpoint is a list of one */
    assert_int_equal(sink_url_parse("amqp://mq", &url, &err), 0);
    assert_int_equal(url.endpoint_count, 1);
    assert_endpoints(&url, "mq:5672");
    url_clear(&url);
}

static void
test_redis_sentinel_and_cluster(void **state)
{
    struct broker_url url;
    struct outbox_error err;

    (void)state;
    assert_int_equal(sink_url_parse("redis+sentinel://relay:pw@s1:26380,s2,[::1]/my%2Dmaster/2", &url,
                               &err),
                     0);
    assert_string_equal(url.scheme->name, "redis+sentinel");
    assert_endpoints(&url, "s1:26380,s2:26379,[::1]:26379");
    assert_string_equal(sink_redis_url_master(&url), "my-master");
    assert_int_equal(sink_redis_url_db(&url), 2);
    assert_string_equal(url.user, "relay");
    assert_string_equal(url.password, "pw");
    assert_null(sink_amqp_url_vhost(&url));
    url_clear(&url);

    assert_int_equal(sink_url_parse("redis+sentinel://s1/mymaster", &url, &err), 0);
    assert_string_equal(sink_redis_url_master(&url), "mymaster");
    assert_int_equal(sink_redis_url_db(&url), 0);
    assert_null(url.user);
    assert_null(url.password);
    url_clear(&url);

    assert_int_equal(sink_url_parse("redis+cluster://:pw@n1:7000,n2:7001,n3", &url, &err), 0);
    assert_string_equal(url.scheme->name, "redis+cluster");
    assert_endpoints(&url, "n1:7000,n2:7001,n3:6379");
    assert_null(sink_redis_url_master(&url));
    assert_string_equal(url.password, "pw");
    url_clear(&url);

    assert_int_equal(sink_url_parse("redis+cluster://n1/", &url, &err), 0);
    assert_int_equal(url.endpoint_count, 1);
    url_clear(&url);
}

static void
test_bad_endpoint_lists(void **state)
{
    char many[512] = "amqp://u:secret@";

    (void)state;
    assert_rejected("amqp://u:secret@h1,,h3/", "empty endpoint (endpoint 2)");
    assert_rejected("amqp://u:secret@h1,/", "empty endpoint (endpoint 2)");
    assert_rejected("amqp://u:secret@,h2/", "empty endpoint (endpoint 1)");
    assert_rejected("amqp://u:secret@h1:5672,h2:0/", "port must be a number from 1 to 65535 (endpoint 2)");
    assert_rejected("amqp://u:secret@h1,h2:x/", "(endpoint 2)");
    assert_rejected("amqp://u:secret@h1,[::1/", "unclosed '[' (endpoint 2)");
    assert_rejected("amqp://u:secret@h1,[::1]x/", "junk after the host (endpoint 2)");
    assert_rejected("amqp://u:secret@h1,:5672/", "no host (endpoint 2)");
    assert_rejected("amqp://u:secret@h1,h%zz/", "bad escape in a host (endpoint 2)");
    assert_rejected("redis://:secret@r1,r2/0", "redis:// takes one endpoint");
    assert_rejected("redis+sentinel://:secret@s1,s2", "needs the master name");
    assert_rejected("redis+sentinel://:secret@s1,s2/", "needs the master name");
    assert_rejected("redis+sentinel://:secret@s1/m/x", "database must be a number");
    assert_rejected("redis+sentinel://:secret@s1/m%zz", "bad escape in the master name");
    assert_rejected("redis+cluster://:secret@n1,n2/3", "takes no database");
    assert_rejected("rediss+cluster://:secret@n1", "unknown broker URL scheme");

    for (int i = 0; i < URL_MAX_ENDPOINTS + 1; i++)
        strcat(many, i == 0 ? "h" : ",h");
    assert_rejected(many, "lists 17 endpoints: at most 16");
    /* the most the list may hold */
    many[strlen(many) - 2] = '\0';
    {
        struct broker_url url;
        struct outbox_error err;

        assert_int_equal(sink_url_parse(many, &url, &err), 0);
        assert_int_equal(url.endpoint_count, URL_MAX_ENDPOINTS);
        url_clear(&url);
    }
}

/* A password typed with an unescaped '/' ends the authority early: nothing of it is shown. */
static void
test_endpoint_errors_hide_the_authority(void **state)
{
    (void)state;
    assert_rejected("amqp://u:secret/x@h1,h2/", "port");
    assert_rejected("amqp://h1,u:secret/x@h2/", "(endpoint 2)");
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
    /* NATS: a userinfo without ':' is a token, the whole of it secret */
    assert_redacted("nats://s3cr3t-token@h1:4222,h2:4222", "nats://***@h1:4222,h2:4222");
    assert_redacted("tls://s3cr3t-token@h", "tls://***@h");
    assert_redacted("nats://u:pw@h", "nats://u:***@h");
    assert_redacted("nats://h1,h2", "nats://h1,h2");
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
    assert_int_equal(sink_url_parse("user:secret@kafka\n://h", &url, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_CONFIG);
    assert_null(strstr(err.message, "secret"));
    assert_null(strchr(err.message, '\n'));
    assert_non_null(strstr(err.message, "no valid scheme"));
    assert_rejected("mqtt://h", "'mqtt'");
}

/* url_redact_message(message, source, password) must equal expected. */
static void
assert_message(const char *message, const char *source, const char *password,
               const char *expected)
{
    char out[512];

    url_redact_message(message, source, password, out, sizeof(out));
    if (strcmp(out, expected) != 0)
        fail_msg("'%s' (source '%s') redacted as '%s', expected '%s'", message,
                 source ? source : "(none)", out, expected);
}

/* What libpq says about each URL or conninfo form that can carry a password. */
static void
test_redact_libpq_messages(void **state)
{
    (void)state;
    unsetenv("PGPASSWORD");
    /* the token libpq could not decode: the password itself */
    assert_message("invalid percent-encoded token: \"Top%zzSecret\"",
                   "postgresql://u:Top%zzSecret@h:5432/app", NULL,
                   "invalid percent-encoded token: \"***\"");
    assert_message("forbidden value %00 in percent-encoded value: \"Top%00Secret\"",
                   "postgresql://u:Top%00Secret@h/app", NULL,
                   "forbidden value %00 in percent-encoded value: \"***\"");
    /* the query's password, under a percent-encoded key too */
    assert_message("invalid percent-encoded token: \"Top%zz\"",
                   "postgresql://h/app?pass%77ord=Top%zz", NULL,
                   "invalid percent-encoded token: \"***\"");
    /* the whole URI quoted (an unclosed '[') */
    assert_message("end of string reached when looking for matching \"]\" in IPv6 host address"
                   " in URI: \"postgresql://u:TopSecret@[h:5432/app\"",
                   "postgresql://u:TopSecret@[h:5432/app", NULL,
                   "end of string reached when looking for matching \"]\" in IPv6 host address"
                   " in URI: \"postgresql://u:***@[h:5432/app\"");
    /* a password holding '@' or '/': libpq reads a piece of it as the host */
    assert_message("could not translate host name \"Secret@127.0.0.1\" to address",
                   "postgresql://u:Top@Secret@127.0.0.1:1/app", NULL,
                   "could not translate host name \"***@127.0.0.1\" to address");
    assert_message("invalid integer value \"Top\" for connection option \"port\"",
                   "postgresql://u:Top/Secret@127.0.0.1/app", NULL,
                   "invalid integer value \"***\" for connection option \"port\"");
    /* conninfo, quoted with an escape, and a dbname that is a URI of its own */
    assert_message("bad value \"Top 'Secret\"", "host=h password='Top \\'Secret'", NULL,
                   "bad value \"***\"");
    assert_message("invalid percent-encoded token: \"Top%zz\"",
                   "port=1 dbname=postgresql://u:Top%zz@h/app", NULL,
                   "invalid percent-encoded token: \"***\"");
    /* the connection's own password (PQpass), and $PGPASSWORD */
    assert_message("password TopSecret rejected", "host=h", "TopSecret", "password *** rejected");
    setenv("PGPASSWORD", "EnvSecret", 1);
    assert_message("was EnvSecret", NULL, NULL, "was ***");
    unsetenv("PGPASSWORD");
    /* password-shaped text in any message, source unknown */
    assert_message("cannot use postgresql://u:TopSecret@h/app?password=Other&x=1 or"
                   " host=h password='a b' user=u",
                   NULL, NULL,
                   "cannot use postgresql://u:***@h/app?password=***&x=1 or"
                   " host=h password=*** user=u");
    /* nothing to hide: the message is kept */
    assert_message("connection to server at \"127.0.0.1\", port 1 failed: Connection refused",
                   "postgresql://u:TopSecret@127.0.0.1:1/app", NULL,
                   "connection to server at \"127.0.0.1\", port 1 failed: Connection refused");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_amqp_full),   cmocka_unit_test(test_amqp_defaults),
        cmocka_unit_test(test_redis_forms), cmocka_unit_test(test_bad_urls),
        cmocka_unit_test(test_redact),      cmocka_unit_test(test_redact_regressions),
        cmocka_unit_test(test_scheme_message_regressions),
        cmocka_unit_test(test_amqp_endpoint_list),
        cmocka_unit_test(test_redis_sentinel_and_cluster),
        cmocka_unit_test(test_bad_endpoint_lists),
        cmocka_unit_test(test_endpoint_errors_hide_the_authority),
        cmocka_unit_test(test_redact_libpq_messages),
    };

    return cmocka_run_group_tests_name("url", tests, NULL, NULL);
}
