/*
 * key_inversion.c - a stream key whose commit order is not its job id order
 * (see key_inversion.h).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "key_inversion.h"
#include "redis_consumer.h"
#include "relay_runner.h"

void
key_inversion_install(PGconn *conn)
{
    harness_exec(conn,
                 "CREATE FUNCTION public.hold_second() RETURNS trigger LANGUAGE plpgsql AS $$"
                 " BEGIN IF NEW.payload->>'n' = '2' THEN PERFORM pg_advisory_xact_lock(4747);"
                 " END IF; RETURN NEW; END $$;"
                 " CREATE TRIGGER a_hold_second BEFORE INSERT ON outbox.job"
                 " FOR EACH ROW EXECUTE FUNCTION public.hold_second()");
}

static void
enqueue_n(PGconn *conn, const char *key, int n)
{
    char sql[256];

    snprintf(sql, sizeof(sql),
             "SELECT outbox.enqueue('ev', '{\"k\": \"%s\", \"n\": %d}', ordering_key => '%s')", key,
             n, key);
    harness_exec(conn, sql);
}

/* Waits until the session of pid waits for a lock. */
static void
wait_until_blocked(PGconn *conn, int pid)
{
    char sql[160];

    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM pg_stat_activity WHERE pid = %d AND wait_event_type = 'Lock'",
             pid);
    assert_int_equal(wait_for_value(conn, sql, 1, 10000), 1);
}

void
key_inversion_make(PGconn *control, const char *url, const char *key)
{
    PGconn *third = harness_connect(url), *second = harness_connect(url);
    char sql[256];
    PGresult *r;

    enqueue_n(control, key, 1);
    harness_exec(third, "BEGIN");
    harness_query_ll(third, "SELECT pg_current_xact_id()::text::bigint");
    harness_exec(second, "BEGIN");
    harness_query_ll(second, "SELECT pg_current_xact_id()::text::bigint");
    harness_exec(control, "SELECT pg_advisory_lock(4747)");
    snprintf(sql, sizeof(sql),
             "SELECT outbox.enqueue('ev', '{\"k\": \"%s\", \"n\": 2}', ordering_key => '%s')", key,
             key);
    assert_int_equal(PQsendQuery(second, sql), 1);
    wait_until_blocked(control, PQbackendPID(second));
    enqueue_n(third, key, 3);
    harness_exec(third, "COMMIT");
    harness_exec(control, "SELECT pg_advisory_unlock(4747)");
    while ((r = PQgetResult(second)) != NULL) {
        assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
        PQclear(r);
    }
    harness_exec(second, "COMMIT");
    PQfinish(second);
    PQfinish(third);
}

/* The n of each entry of key in stream order, as digits into order (size bytes). */
static void
key_order(const struct stream_consumer_stream *s, const char *key, char *order, size_t size)
{
    char needle[64];
    size_t n = 0;

    snprintf(needle, sizeof(needle), "\"k\": \"%s\"", key);
    for (size_t i = 0; i < s->count && n + 1 < size; i++) {
        const char *p = s->entries[i].payload, *at;

        if (p != NULL && strstr(p, needle) != NULL && (at = strstr(p, "\"n\": ")) != NULL)
            order[n++] = at[5];
    }
    order[n] = '\0';
}

void
key_inversion_assert_kept(redisContext *redis, const char *stream, const char *const *keys,
                          size_t count, const char *want)
{
    struct stream_consumer_stream s = {0};
    int wrong = 0;

    assert_int_equal(stream_consumer_read_stream(redis, stream, &s), 0);
    for (size_t k = 0; k < count; k++) {
        char order[16];

        key_order(&s, keys[k], order, sizeof(order));
        if (strcmp(order, want) != 0) {
            print_error("key %s went out as %s, committed as %s\n", keys[k], order, want);
            wrong++;
        }
    }
    stream_consumer_stream_clear(&s);
    if (wrong > 0)
        fail_msg("%d of %zu keys lost their commit order across the rebase", wrong, count);
}
