/*
 * fuzz_url.c - url_parse and url_redact on arbitrary text, taken both as a
 * broker URL and as a libpq connection string.
 *
 * Invariants: url_parse returns 0 or -1; -1 comes with OUTBOX_ERR_CONFIG,
 * a one-line message and a cleared url. url_redact never returns a text
 * from which the password can be read back: a broker URL that parsed
 * parses again after redaction to the same scheme, user, host, port and db
 * with the password "***", and the literal password is gone; a conninfo or
 * postgresql:// URI that libpq accepts is accepted again after redaction
 * with every option equal except the password, which is "***".
 */
#include <stdbool.h>

#include <libpq-fe.h>

#include "fuzz_common.h"
#include "sink.h"
#include "sink_amqp.h"
#include "sink_redis.h"
#include "url.h"

static bool
same_string(const char *a, const char *b)
{
    if (a == NULL || b == NULL)
        return a == b;
    return strcmp(a, b) == 0;
}

/*
 * True when the password url_parse extracted is written literally in the
 * userinfo of text (no percent escapes) and nowhere else in text: then a
 * redacted text must not contain it at all.
 */
static bool
password_literal_once(const char *text, const char *password)
{
    const char *auth = strstr(text, "://"), *end, *at = NULL, *sep;

    if (auth == NULL || strlen(password) < 4)
        return false;
    auth += 3;
    end = auth + strcspn(auth, "/?#");
    for (const char *p = auth; p < end; p++)
        if (*p == '@')
            at = p;
    if (at == NULL)
        return false;
    sep = memchr(auth, ':', (size_t)(at - auth));
    if (sep == NULL || (size_t)(at - sep - 1) != strlen(password) ||
        memcmp(sep + 1, password, strlen(password)) != 0)
        return false;
    return fuzz_count(text, password) == 1;
}

static void
check_broker_url(const char *text, const char *redacted)
{
    struct broker_url url, again;
    struct outbox_error err;
    int rc;

    memset(&err, 0, sizeof(err));
    rc = sink_url_parse(text, &url, &err);
    FUZZ_CHECK(rc == 0 || rc == -1, "url_parse returned %d", rc);
    if (rc != 0) {
        FUZZ_CHECK(err.code == OUTBOX_ERR_CONFIG, "code %d", (int)err.code);
        fuzz_check_message(&err, text);
        FUZZ_CHECK(url.user == NULL && url.password == NULL && url.host == NULL &&
                       url.path == NULL,
                   "url not cleared after a failure");
        return;
    }
    FUZZ_CHECK(url.host != NULL && url.host[0] != '\0', "no host");
    FUZZ_CHECK(url.port >= 1 && url.port <= 65535, "port %d", url.port);
    FUZZ_CHECK(url.endpoint_count >= 1 && url.endpoint_count <= URL_MAX_ENDPOINTS,
               "%zu endpoints", url.endpoint_count);
    for (size_t i = 0; i < url.endpoint_count; i++)
        FUZZ_CHECK(url.endpoints[i].host != NULL && url.endpoints[i].host[0] != '\0' &&
                       url.endpoints[i].port >= 1 && url.endpoints[i].port <= 65535,
                   "endpoint %zu lacks a host or port", i + 1);
    if (strcmp(url.scheme->name, "redis+sentinel") == 0)
        FUZZ_CHECK(sink_redis_url_master(&url) != NULL && sink_redis_url_master(&url)[0] != '\0',
                   "no master name");
    if (sink_amqp_url_vhost(&url) != NULL)
        FUZZ_CHECK(url.user != NULL && url.password != NULL && sink_amqp_url_vhost(&url) != NULL,
                   "amqp url lacks user, password or vhost");

    if (url.password != NULL && password_literal_once(text, url.password))
        FUZZ_CHECK(strstr(redacted, url.password) == NULL, "'%s' redacted as '%s' keeps the password",
                   text, redacted);

    rc = sink_url_parse(redacted, &again, &err);
    FUZZ_CHECK(rc == 0, "'%s' redacted as '%s' no longer parses: %s", text, redacted, err.message);
    FUZZ_CHECK(again.scheme == url.scheme && again.port == url.port &&
                   sink_redis_url_db(&again) == sink_redis_url_db(&url) &&
                   same_string(again.host, url.host) && same_string(again.user, url.user),
               "'%s' redacted as '%s' changes more than the password", text, redacted);
    FUZZ_CHECK(again.endpoint_count == url.endpoint_count &&
                   same_string(sink_redis_url_master(&again), sink_redis_url_master(&url)),
               "'%s' redacted as '%s' changes the endpoints", text, redacted);
    for (size_t i = 0; i < url.endpoint_count && i < again.endpoint_count; i++)
        FUZZ_CHECK(same_string(again.endpoints[i].host, url.endpoints[i].host) &&
                       again.endpoints[i].port == url.endpoints[i].port,
                   "'%s' redacted as '%s' changes endpoint %zu", text, redacted, i + 1);
    if (url.password != NULL && !(sink_amqp_url_vhost(&url) != NULL &&
                                  strcmp(url.password, "guest") == 0 &&
                                  strcmp(again.password, "guest") == 0))
        FUZZ_CHECK(same_string(again.password, "***"), "'%s' redacted as '%s' keeps a password",
                   text, redacted);
    url_clear(&again);
    url_clear(&url);
}

/* The value of keyword in a PQconninfoParse result, or NULL. */
static const char *
conninfo_value(const PQconninfoOption *options, const char *keyword)
{
    for (const PQconninfoOption *o = options; o->keyword != NULL; o++)
        if (strcmp(o->keyword, keyword) == 0)
            return o->val;
    return NULL;
}

static void
check_conninfo(const char *text, const char *redacted)
{
    PQconninfoOption *options, *again;
    const char *password;
    char *message = NULL;

    options = PQconninfoParse(text, &message);
    PQfreemem(message);
    if (options == NULL)
        return;
    password = conninfo_value(options, "password");
    if (password != NULL && password[0] != '\0' && strcmp(password, "***") != 0) {
        message = NULL;
        again = PQconninfoParse(redacted, &message);
        FUZZ_CHECK(again != NULL, "conninfo '%s' redacted as '%s' no longer parses: %s", text,
                   redacted, message ? message : "");
        FUZZ_CHECK(same_string(conninfo_value(again, "password"), "***"),
                   "conninfo '%s' redacted as '%s' keeps a password", text, redacted);
        for (const PQconninfoOption *o = options; o->keyword != NULL; o++)
            if (strcmp(o->keyword, "password") != 0)
                FUZZ_CHECK(same_string(o->val, conninfo_value(again, o->keyword)),
                           "conninfo '%s' redacted as '%s' changes %s", text, redacted,
                           o->keyword);
        PQconninfoFree(again);
    }
    PQconninfoFree(options);
}

/*
 * url_redact_message: whatever libpq quotes of text (its parse error, the
 * whole text, the password alone) comes out without the password libpq
 * reads from text, and the output is always a string.
 */
static void
check_message(const char *text)
{
    PQconninfoOption *options;
    const char *password;
    char *message = NULL, *quoted, out[512];
    size_t len = strlen(text);

    options = PQconninfoParse(text, &message);
    url_redact_message(message != NULL ? message : "", text, NULL, out, sizeof(out));
    FUZZ_CHECK(memchr(out, '\0', sizeof(out)) != NULL, "url_redact_message left no NUL");
    PQfreemem(message);
    if (options == NULL)
        return;
    password = conninfo_value(options, "password");
    quoted = malloc(2 * len + 64);
    FUZZ_CHECK(quoted != NULL, "out of memory");
    if (password != NULL && strlen(password) >= 4 && strstr(password, "***") == NULL &&
        strlen(password) < 200) {
        snprintf(quoted, 2 * len + 64, "bad \"%s\" and \"%s\"", text, password);
        url_redact_message(quoted, text, NULL, out, sizeof(out));
        FUZZ_CHECK(strstr(out, password) == NULL,
                   "'%s' quoted in a message keeps its password '%s': %s", text, password, out);
    }
    free(quoted);
    PQconninfoFree(options);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_string(data, size);
    char *redacted = url_redact(text);

    FUZZ_CHECK(redacted != NULL, "url_redact returned NULL");
    check_broker_url(text, redacted);
    check_conninfo(text, redacted);
    check_message(text);
    free(redacted);
    free(text);
    return 0;
}
