/*
 * test_roles.c - sql/roles/outbox_relay_role.sql on a fresh database.
 *
 * The script is applied (twice: it must be idempotent) to a database cloned
 * from the migrated template; then login roles in each group role do their
 * job and nothing more: the relay publishes, reaps and deletes old rows as
 * outbox_relay but cannot insert; a producer enqueues (with an idempotency
 * key too) but cannot update, delete or read payloads, and inserts only
 * ready rows; outboxctl status runs
 * as outbox_reader, which cannot write. Group roles are cluster-wide and
 * stay; the login roles made here are dropped on the way out.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixtures.h"
#include "harness.h"
#include "redis_consumer.h"
#include "relay_runner.h"

struct fixture {
    char *url;
    PGconn *admin;
    char relay_user[64];
    char producer_user[64];
    char reader_user[64];
    char prefix[64];
};

/* Runs sql on conn and returns its SQLSTATE ("" when it worked). */
static const char *
sqlstate_of(PGconn *conn, const char *sql)
{
    static char state[6];
    PGresult *result = PQexec(conn, sql);
    ExecStatusType status = PQresultStatus(result);

    if (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK) {
        state[0] = '\0';
    } else {
        const char *s = PQresultErrorField(result, PG_DIAG_SQLSTATE);

        snprintf(state, sizeof(state), "%s", s != NULL ? s : "?????");
    }
    PQclear(result);
    return state;
}

/* Reads a log file into a malloc'd string ("" when missing). */
static char *
read_log(const char *path)
{
    FILE *f = fopen(path, "r");
    char *text = calloc(1, 65536);
    size_t len;

    assert_non_null(text);
    if (f == NULL)
        return text;
    len = fread(text, 1, 65535, f);
    text[len] = '\0';
    fclose(f);
    return text;
}

static int
setup(void **state)
{
    static int counter;
    struct fixture *f = calloc(1, sizeof(*f));
    char sql[128];

    f->url = harness_database_new();
    f->admin = harness_connect(f->url);
    fixture_create_outbox_roles(f->admin);
    fixture_create_outbox_roles(f->admin); /* idempotent */

    snprintf(f->relay_user, sizeof(f->relay_user), "roles_test_relay_%d_%d", (int)getpid(),
             counter);
    snprintf(f->producer_user, sizeof(f->producer_user), "roles_test_producer_%d_%d",
             (int)getpid(), counter);
    snprintf(f->reader_user, sizeof(f->reader_user), "roles_test_reader_%d_%d", (int)getpid(),
             counter);
    snprintf(f->prefix, sizeof(f->prefix), "roles-test-%d-%d:", (int)getpid(), counter++);
    snprintf(sql, sizeof(sql), "GRANT outbox_relay TO %s", f->relay_user);
    fixture_create_login_role(f->admin, f->relay_user, sql);
    snprintf(sql, sizeof(sql), "GRANT outbox_producer TO %s", f->producer_user);
    fixture_create_login_role(f->admin, f->producer_user, sql);
    snprintf(sql, sizeof(sql), "GRANT outbox_reader TO %s", f->reader_user);
    fixture_create_login_role(f->admin, f->reader_user, sql);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;
    const char *broker = getenv("OUTBOX_TEST_REDIS_URL");

    fixture_drop_role(f->admin, f->relay_user);
    fixture_drop_role(f->admin, f->producer_user);
    fixture_drop_role(f->admin, f->reader_user);
    PQfinish(f->admin);
    harness_database_drop(f->url);
    if (broker != NULL) {
        redisContext *redis = stream_consumer_connect(broker);

        if (redis != NULL) {
            stream_consumer_delete_prefix(redis, f->prefix);
            redisFree(redis);
        }
    }
    free(f);
    return 0;
}

static void
test_producer_enqueues_but_cannot_change_rows(void **state)
{
    struct fixture *f = *state;
    char *url = fixture_url_as(f->url, f->producer_user);
    PGconn *producer = harness_connect(url);

    harness_exec(producer, "BEGIN");
    assert_int_equal(harness_query_ll(producer, "SELECT outbox.enqueue('orders', '{\"n\": 1}',"
                                                " idempotency_key => 'order:1')"),
                     harness_query_ll(producer, "SELECT outbox.enqueue('orders', '{\"n\": 1}',"
                                                " idempotency_key => 'order:1')"));
    harness_exec(producer, "SELECT outbox.enqueue('orders', '{\"n\": 2}', headers => '{\"a\": \"b\"}',"
                           " ordering_key => 'order:2')");
    harness_exec(producer, "COMMIT");
    /* the key is still known after commit */
    assert_int_equal(harness_query_ll(producer, "SELECT outbox.enqueue('orders', '{\"n\": 1}',"
                                                " idempotency_key => 'order:1')"),
                     harness_query_ll(f->admin, "SELECT job_id FROM outbox.job"
                                                " WHERE idempotency_key = 'order:1'"));
    assert_int_equal(harness_query_ll(f->admin, "SELECT count(*) FROM outbox.job"), 2);
    /* in bulk too: a known key, a new key, an ordering key behind an unfinished row */
    assert_int_equal(harness_query_ll(producer,
                                      "SELECT cardinality(outbox.enqueue_batch('orders',"
                                      " '{3,4}', '{order:1,order:3}', '{NULL,order:2}'))"),
                     2);
    assert_int_equal(harness_query_ll(f->admin, "SELECT count(*) FROM outbox.job"
                                                " WHERE held AND idempotency_key = 'order:3'"),
                     1);
    assert_int_equal(harness_query_ll(f->admin, "SELECT count(*) FROM outbox.job"), 3);
    /* a row held behind an earlier row of the same call passes the insert guard */
    assert_int_equal(harness_query_ll(producer, "SELECT cardinality(outbox.enqueue_batch('orders',"
                                                " '{5,6}', NULL, '{order:5,order:5}'))"),
                     2);
    assert_int_equal(harness_query_ll(f->admin, "SELECT count(*) FROM outbox.job"
                                                " WHERE ordering_key = 'order:5' AND held"),
                     1);

    assert_string_equal(sqlstate_of(producer, "UPDATE outbox.job SET state = 'dead'"), "42501");
    assert_string_equal(sqlstate_of(producer, "DELETE FROM outbox.job"), "42501");
    assert_string_equal(sqlstate_of(producer, "SELECT payload FROM outbox.job"), "42501");
    assert_string_equal(sqlstate_of(producer, "TRUNCATE outbox.job"), "42501");
    /* the lease of the database is the relays' (a producer would stop its own delivery) */
    assert_string_equal(
        sqlstate_of(producer, "SELECT * FROM outbox.database_lease_take('fake', 60, NULL)"),
        "42501");
    assert_string_equal(sqlstate_of(producer, "SELECT outbox.database_lease_release('fake')"),
                        "42501");
    assert_int_equal(harness_query_ll(f->admin, "SELECT count(*) FROM outbox.job"
                                                " WHERE state = 'ready'"),
                     5);

    PQfinish(producer);
    free(url);
}

/*
 * A producer creates only what enqueue() creates: ready rows without an
 * owner, a lease, attempts or a stream place. Any other shape, which could block an
 * ordering key for every producer, is refused by the database; a row that
 * legitimately waits behind its key (enqueue() sets held) still goes in, and
 * a hold with no unfinished row before it goes in not held.
 */
static void
test_producer_inserts_only_ready_rows(void **state)
{
    struct fixture *f = *state;
    char *url = fixture_url_as(f->url, f->producer_user);
    PGconn *producer = harness_connect(url);
    static const char *const refused[] = {
        "INSERT INTO outbox.job (queue, payload, ordering_key, state, attempts, worker_id,"
        " lease_until) VALUES ('orders', '{}', 'k', 'running', 1, 'squatter',"
        " now() + interval '100 years')",
        "INSERT INTO outbox.job (queue, payload, ordering_key, state, finished_at)"
        " VALUES ('orders', '{}', 'k', 'succeeded', now())",
        "INSERT INTO outbox.job (queue, payload, ordering_key, state, attempts, finished_at)"
        " VALUES ('orders', '{}', 'k', 'dead', 1, now())",
        "INSERT INTO outbox.job (queue, payload, attempts) VALUES ('orders', '{}', 3)",
        /* a place of its own would pass for a row a stream had published already */
        "INSERT INTO outbox.job (queue, payload, stream_partition, stream_epoch)"
        " VALUES ('orders', '{}', 0, 1)",
    };

    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        const char *got = sqlstate_of(producer, refused[i]);

        if (strcmp(got, "42501") != 0)
            fail_msg("a producer's insert gave SQLSTATE '%s', expected 42501: %s", got,
                     refused[i]);
    }
    assert_int_equal(harness_query_ll(f->admin, "SELECT count(*) FROM outbox.job"), 0);
    /* a hold with nothing to wait behind goes in ready: it cannot stop its key */
    harness_exec(producer, "INSERT INTO outbox.job (queue, payload, ordering_key, held)"
                           " VALUES ('orders', '{}', 'z', true)");
    assert_int_equal(harness_query_ll(f->admin, "SELECT count(*) FROM outbox.job"
                                                " WHERE ordering_key = 'z' AND NOT held"),
                     1);

    /* the plain shape goes in directly, and enqueue() still holds a key's second row */
    assert_string_equal(sqlstate_of(producer, "INSERT INTO outbox.job (queue, payload, ordering_key)"
                                              " VALUES ('orders', '{\"n\": 1}', 'k')"),
                        "");
    harness_exec(producer, "SELECT outbox.enqueue('orders', '{\"n\": 2}', ordering_key => 'k')");
    assert_int_equal(harness_query_ll(f->admin, "SELECT count(*) FROM outbox.job"
                                                " WHERE ordering_key = 'k' AND held"),
                     1);
    /* enqueue_batch() holds a key's repeats behind its first row, as a producer too */
    harness_exec(producer, "SELECT outbox.enqueue_batch('orders', ARRAY['{}', '{}']::jsonb[],"
                           " ordering_keys => ARRAY['b', 'b'])");
    assert_int_equal(harness_query_ll(f->admin, "SELECT count(*) FROM outbox.job"
                                                " WHERE ordering_key = 'b' AND held"),
                     1);
    /* behind an unfinished row a held row is what enqueue() would write: accepted */
    assert_string_equal(sqlstate_of(producer, "INSERT INTO outbox.job (queue, payload, ordering_key,"
                                              " held) VALUES ('orders', '{\"n\": 3}', 'k', true)"),
                        "");
    assert_int_equal(harness_query_ll(f->admin, "SELECT count(*) FROM outbox.job"
                                                " WHERE state = 'ready' AND attempts = 0"
                                                "   AND worker_id IS NULL"),
                     6);
    PQfinish(producer);
    free(url);
}

static void
test_relay_runs_as_relay_role(void **state)
{
    struct fixture *f = *state;
    char *url = fixture_url_as(f->url, f->relay_user);
    const char *broker = harness_env("OUTBOX_TEST_REDIS_URL");
    const char *check[] = {"--database-url", url, "--broker", broker, "--check", NULL};
    const char *extra[] = {"--once", "--stream-prefix", f->prefix, "--retention", "24h", NULL};
    struct relay_process relay;
    char output[4096];
    char *log;
    PGconn *as_relay;

    assert_int_equal(relay_run_capture(check, output, sizeof(output)), 0);
    assert_non_null(strstr(output, "configuration OK"));

    enqueue_rows(f->admin, "orders", 20);
    /* a row of a relay that died (to reap), and one succeeded long ago (to delete) */
    harness_exec(f->admin,
                 "INSERT INTO outbox.job (queue, payload, state, attempts, worker_id, lease_until)"
                 " VALUES ('orders', '{}', 'running', 1, 'gone', now() - interval '1 minute');"
                 "INSERT INTO outbox.job (queue, payload, state, attempts, finished_at)"
                 " VALUES ('orders', '{}', 'succeeded', 1, now() - interval '2 days')");
    /* a stream queue of keyed rows: the upkeep deletes the keys' places below the horizon */
    harness_exec(f->admin, "SELECT outbox.stream_enable('events', 2)");
    harness_exec(f->admin, "SELECT outbox.enqueue('events', '{}', ordering_key => 'k' || g)"
                           " FROM generate_series(1, 5) AS g");

    relay_start_process(&relay, url, broker, extra);
    assert_int_equal(relay_wait(&relay, 60000), 0);
    log = read_log(relay.log_path);
    if (strstr(log, "permission denied") != NULL)
        fail_msg("the relay hit a missing privilege:\n%s", log);
    free(log);
    unlink(relay.log_path);
    assert_int_equal(harness_query_ll(f->admin, "SELECT count(*) FROM outbox.job"
                                                " WHERE state = 'succeeded'"
                                                "   AND finished_at > now() - interval '1 hour'"),
                     20);
    /* reaped: ready again for a later retry */
    assert_int_equal(harness_query_ll(f->admin, "SELECT count(*) FROM outbox.job"
                                                " WHERE state = 'ready' AND worker_id IS NULL"
                                                "   AND last_error LIKE 'lease expired%'"),
                     1);
    assert_int_equal(harness_query_ll(f->admin, "SELECT count(*) FROM outbox.job"
                                                " WHERE queue = 'orders'"),
                     21);
    assert_int_equal(harness_query_ll(f->admin, "SELECT count(*) FROM outbox.job AS j"
                                                " JOIN outbox.stream_cursor AS c"
                                                "   ON c.queue = j.queue"
                                                "  AND c.partition = j.stream_partition"
                                                " WHERE (j.xid, j.job_id) > (c.cursor_xid, c.cursor_job_id)"),
                     0);
    assert_int_equal(harness_query_ll(f->admin, "SELECT count(*) FROM outbox.stream_key"), 0);

    /* and it cannot do what it does not need */
    as_relay = harness_connect(url);
    assert_string_equal(sqlstate_of(as_relay, "INSERT INTO outbox.job (queue, payload)"
                                              " VALUES ('orders', '{}')"),
                        "42501");
    assert_string_equal(sqlstate_of(as_relay, "SELECT outbox.enqueue('orders', '{}')"), "42501");
    assert_string_equal(
        sqlstate_of(as_relay, "SELECT * FROM outbox.database_lease_take('r', 60, NULL)"), "");
    assert_string_equal(sqlstate_of(as_relay, "SELECT outbox.enqueue_batch('orders', '{1}')"),
                        "42501");
    assert_string_equal(sqlstate_of(as_relay, "TRUNCATE outbox.job"), "42501");
    PQfinish(as_relay);
    free(url);
}

static void
test_reader_runs_status_and_cannot_write(void **state)
{
    struct fixture *f = *state;
    char *url = fixture_url_as(f->url, f->reader_user);
    const char *argv[] = {"--database-url", url, "status", "--json", NULL};
    char output[8192];
    PGconn *reader;

    enqueue_rows(f->admin, "orders", 3);
    assert_int_equal(fixture_run_outboxctl(argv, output, sizeof(output)), 0);
    assert_non_null(strstr(output, "\"queue\":\"orders\",\"ready\":3"));

    reader = harness_connect(url);
    assert_string_equal(sqlstate_of(reader, "UPDATE outbox.job SET state = 'dead'"), "42501");
    assert_string_equal(sqlstate_of(reader, "DELETE FROM outbox.job"), "42501");
    assert_string_equal(sqlstate_of(reader, "SELECT outbox.enqueue('orders', '{}')"), "42501");
    assert_string_equal(sqlstate_of(reader, "SELECT outbox.enqueue_batch('orders', '{1}')"),
                        "42501");
    PQfinish(reader);
    free(url);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_producer_enqueues_but_cannot_change_rows, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_producer_inserts_only_ready_rows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_relay_runs_as_relay_role, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reader_runs_status_and_cannot_write, setup,
                                        teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
