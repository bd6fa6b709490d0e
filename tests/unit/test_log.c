/*
 * test_log.c - log lines as an operator or a log shipper sees them: text
 * shape, JSON that parses, level filter, rate limiting, and whole lines
 * under concurrent writers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"

/* 2026-11-30T03:41:13.123Z */
#define FIXED_MS (INT64_C(1796010073) * 1000 + 123)

static int64_t fake_now;

static int64_t
fake_clock(void)
{
    return fake_now;
}

static FILE *capture;

static int
setup(void **state)
{
    (void)state;
    capture = tmpfile();
    assert_non_null(capture);
    fake_now = FIXED_MS;
    log_set_clock(fake_clock);
    log_set_rate_limit(0);
    return 0;
}

static int
teardown(void **state)
{
    (void)state;
    log_configure(OUTBOX_LOG_INFO, OUTBOX_LOG_TEXT, NULL);
    log_set_clock(NULL);
    fclose(capture);
    return 0;
}

/* Everything written to the capture stream so far (malloc'd). */
static char *
captured(void)
{
    long size;
    char *text;

    fflush(capture);
    size = ftell(capture);
    assert_true(size >= 0);
    text = calloc(1, (size_t)size + 1);
    assert_non_null(text);
    rewind(capture);
    assert_int_equal(fread(text, 1, (size_t)size, capture), (size_t)size);
    return text;
}

static size_t
count_lines(const char *text)
{
    size_t n = 0;

    for (; *text; text++)
        n += *text == '\n';
    return n;
}

/* ---- a strict parser for the flat JSON objects the log writes ---------- */

static const char *
json_skip_string(const char *p)
{
    if (*p++ != '"')
        return NULL;
    while (*p != '"') {
        unsigned char c = (unsigned char)*p;

        if (c == '\0' || c < 0x20)
            return NULL;
        if (c == '\\') {
            p++;
            if (*p == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (strchr("0123456789abcdefABCDEF", p[i]) == NULL || p[i] == '\0')
                        return NULL;
                p += 5;
                continue;
            }
            if (*p == '\0' || strchr("\"\\/bfnrt", *p) == NULL)
                return NULL;
        }
        p++;
    }
    return p + 1;
}

static const char *
json_skip_value(const char *p)
{
    if (*p == '"')
        return json_skip_string(p);
    if (strncmp(p, "true", 4) == 0)
        return p + 4;
    if (strncmp(p, "false", 5) == 0)
        return p + 5;
    if (*p == '-' || (*p >= '0' && *p <= '9')) {
        char *end;

        strtod(p, &end);
        return end > p ? end : NULL;
    }
    return NULL;
}

/* True when line is exactly one flat JSON object followed by a newline. */
static bool
json_line_valid(const char *line)
{
    const char *p = line;

    if (*p++ != '{')
        return false;
    for (;;) {
        p = json_skip_string(p);
        if (p == NULL || *p++ != ':')
            return false;
        p = json_skip_value(p);
        if (p == NULL)
            return false;
        if (*p == ',') {
            p++;
            continue;
        }
        break;
    }
    return p[0] == '}' && p[1] == '\n' && p[2] == '\0';
}

/* ---- tests ------------------------------------------------------------- */

static void
test_text_shape(void **state)
{
    char *text;

    (void)state;
    log_configure(OUTBOX_LOG_DEBUG, OUTBOX_LOG_TEXT, capture);
    log_event(OUTBOX_LOG_WARN, "publish failed", "job_id=%d queue=%s reason=\"%s\"", 12, "orders",
              "server said \"no\" twice");
    log_event(OUTBOX_LOG_INFO, "started", NULL);
    log_event(OUTBOX_LOG_ERROR, "bad\nmessage", "detail=\"line1\nline2\" empty=\"\"");
    text = captured();
    assert_string_equal(text, "2026-11-30T03:41:13.123Z warn  publish failed job_id=12 "
                              "queue=orders reason=\"server said \\\"no\\\" twice\"\n"
                              "2026-11-30T03:41:13.123Z info  started\n"
                              "2026-11-30T03:41:13.123Z error bad\\nmessage "
                              "detail=\"line1\\nline2\" empty=\"\"\n");
    free(text);
}

static void
test_json_shape_parses(void **state)
{
    char *text, *line, *save = NULL;
    size_t lines = 0;

    (void)state;
    log_configure(OUTBOX_LOG_INFO, OUTBOX_LOG_JSON, capture);
    log_event(OUTBOX_LOG_WARN, "publish failed", "job_id=%d queue=%s ok=true ratio=0.5 code=007",
              12, "orders");
    log_event(OUTBOX_LOG_ERROR, "quote \" and \\ in msg",
              "reason=\"a \"quoted\" word, tab\tctl\x01 nl\n end\" bad=\"\xff\xfe\"");
    log_event(OUTBOX_LOG_INFO, "no fields", NULL);
    log_event(OUTBOX_LOG_INFO, "stray", "words without keys");
    text = captured();

    assert_non_null(strstr(text, "{\"ts\":\"2026-11-30T03:41:13.123Z\",\"level\":\"warn\","
                                 "\"msg\":\"publish failed\",\"job_id\":12,\"queue\":\"orders\","
                                 "\"ok\":true,\"ratio\":0.5,\"code\":\"007\"}\n"));
    assert_non_null(strstr(text, "\"reason\":\"a \\\"quoted\\\" word, tab\\tctl\\u0001 nl\\n "
                                 "end\",\"bad\":\"\\ufffd\\ufffd\"}"));
    assert_non_null(strstr(text, "\"msg\":\"quote \\\" and \\\\ in msg\""));
    assert_non_null(strstr(text, "\"extra\":\"words without keys\""));

    for (line = strtok_r(text, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        char *with_newline;

        assert_true(asprintf(&with_newline, "%s\n", line) > 0);
        if (!json_line_valid(with_newline))
            fail_msg("not a JSON object: %s", line);
        free(with_newline);
        lines++;
    }
    assert_int_equal(lines, 4);
    free(text);
}

static void
test_level_filter(void **state)
{
    char *text;

    (void)state;
    log_configure(OUTBOX_LOG_WARN, OUTBOX_LOG_TEXT, capture);
    assert_false(log_enabled(OUTBOX_LOG_INFO));
    assert_true(log_enabled(OUTBOX_LOG_ERROR));
    log_event(OUTBOX_LOG_DEBUG, "hidden debug", NULL);
    log_event(OUTBOX_LOG_INFO, "hidden info", NULL);
    log_event(OUTBOX_LOG_WARN, "shown warn", NULL);
    log_event(OUTBOX_LOG_ERROR, "shown error", NULL);
    text = captured();
    assert_null(strstr(text, "hidden"));
    assert_non_null(strstr(text, "shown warn"));
    assert_non_null(strstr(text, "shown error"));
    assert_int_equal(count_lines(text), 2);
    free(text);
}

static void
test_rate_limit(void **state)
{
    char *text;

    (void)state;
    log_configure(OUTBOX_LOG_INFO, OUTBOX_LOG_TEXT, capture);
    log_set_rate_limit(10000);

    /* A broker down for a while: 1000 failures in 5 s, one line. */
    for (int i = 0; i < 1000; i++) {
        fake_now = FIXED_MS + i * 5;
        log_event_limited("broker-down", OUTBOX_LOG_WARN, "broker unreachable", "attempt=%d", i);
    }
    /* Another key is limited on its own. */
    log_event_limited("database-down", OUTBOX_LOG_WARN, "database unreachable", NULL);
    text = captured();
    assert_int_equal(count_lines(text), 2);
    assert_non_null(strstr(text, "broker unreachable attempt=0\n"));
    free(text);

    /* After the interval the next event is logged with the drop count. */
    fake_now = FIXED_MS + 10000;
    log_event_limited("broker-down", OUTBOX_LOG_WARN, "broker unreachable", "attempt=%d", 1000);
    log_event_limited("broker-down", OUTBOX_LOG_WARN, "broker unreachable", "attempt=%d", 1001);
    text = captured();
    assert_int_equal(count_lines(text), 3);
    assert_non_null(strstr(text, "broker unreachable attempt=1000 suppressed=999\n"));
    free(text);

    /* Filtered-out levels are not counted as suppressed. */
    fake_now = FIXED_MS + 30000;
    log_event_limited("quiet", OUTBOX_LOG_DEBUG, "debug only", NULL);
    log_event_limited("quiet", OUTBOX_LOG_WARN, "now shown", NULL);
    text = captured();
    assert_non_null(strstr(text, "now shown\n"));
    free(text);
}

static void
test_json_suppressed_field(void **state)
{
    char *text;

    (void)state;
    log_configure(OUTBOX_LOG_INFO, OUTBOX_LOG_JSON, capture);
    log_set_rate_limit(1000);
    fake_now = FIXED_MS;
    log_event_limited("k", OUTBOX_LOG_WARN, "again", NULL);
    log_event_limited("k", OUTBOX_LOG_WARN, "again", NULL);
    fake_now = FIXED_MS + 1000;
    log_event_limited("k", OUTBOX_LOG_WARN, "again", NULL);
    text = captured();
    assert_non_null(strstr(text, "\"msg\":\"again\",\"suppressed\":1}\n"));
    free(text);
}

static void *
writer_thread(void *arg)
{
    int id = (int)(intptr_t)arg;

    for (int i = 0; i < 200; i++)
        log_event(OUTBOX_LOG_INFO, "tick", "thread=%d i=%d pad=\"%s\"", id, i,
                  "0123456789012345678901234567890123456789012345678901234567890123456789");
    return NULL;
}

static void
test_concurrent_lines_whole(void **state)
{
    pthread_t threads[4];
    char *text, *line, *save = NULL;
    size_t lines = 0;

    (void)state;
    log_configure(OUTBOX_LOG_INFO, OUTBOX_LOG_JSON, capture);
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, writer_thread, (void *)(intptr_t)i), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(threads[i], NULL);
    text = captured();
    for (line = strtok_r(text, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        char *with_newline;

        assert_true(asprintf(&with_newline, "%s\n", line) > 0);
        if (!json_line_valid(with_newline))
            fail_msg("broken line: %s", line);
        free(with_newline);
        lines++;
    }
    assert_int_equal(lines, 800);
    free(text);
}

static void
test_parse_options(void **state)
{
    struct outbox_error err;
    enum log_level level = OUTBOX_LOG_INFO;
    enum log_format format = OUTBOX_LOG_TEXT;

    (void)state;
    assert_int_equal(log_level_parse("debug", &level, &err), 0);
    assert_int_equal(level, OUTBOX_LOG_DEBUG);
    assert_int_equal(log_format_parse("json", &format, &err), 0);
    assert_int_equal(format, OUTBOX_LOG_JSON);
    assert_int_equal(log_level_parse("verbose", &level, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_CONFIG);
    assert_non_null(strstr(err.message, "'verbose'"));
    assert_int_equal(log_format_parse("xml", &format, &err), -1);
    assert_int_equal(err.code, OUTBOX_ERR_CONFIG);
    assert_non_null(strstr(err.message, "'xml'"));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_text_shape, setup, teardown),
        cmocka_unit_test_setup_teardown(test_json_shape_parses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_level_filter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rate_limit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_json_suppressed_field, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_lines_whole, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parse_options, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
