/*
 * test_store_plans.c - the store's statements reach the rows they name
 * through the primary key, whatever the table's size.
 *
 * A claim or a mark of 500 rows against a table of 20 000 (a small
 * database's queue, its succeeded rows kept for retention) was planned as a
 * hash join over a sequential scan of the whole table, on every call: by
 * the planner's page costs 500 index probes cost about as much, and on
 * cached pages they cost a tenth. One relay serving many small databases
 * spent most of PostgreSQL's CPU on those scans. Each statement here is
 * planned as the store runs it, with its parameters bound (the plan of the
 * first calls of a prepared statement), and its plan must not scan
 * outbox.job whole.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "outbox.h"
#include "store_statements.h"

#define BATCH 500
#define PARAMS_MAX 8

struct fixture {
    char *url;
    PGconn *conn;
    char *ids;         /* an array literal of BATCH job ids of the table */
    char *generations; /* and as many generations */
    char *errors;      /* the arguments of a fail */
    char *retries;
    char *permanents;
};

/* An array literal of count copies of element, or of first, first + 1 ... when element is NULL. */
static char *
array_literal(size_t count, const char *element, long long first)
{
    size_t size = count * 24 + 3, used = 0;
    char *text = malloc(size);

    assert_non_null(text);
    text[used++] = '{';
    for (size_t i = 0; i < count; i++) {
        int n = element ? snprintf(text + used, size - used, "%s%s", i ? "," : "", element)
                        : snprintf(text + used, size - used, "%s%lld", i ? "," : "",
                                   first + (long long)i);
        used += (size_t)n;
    }
    text[used++] = '}';
    text[used] = '\0';
    return text;
}

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    long long first;

    assert_non_null(f);
    f->url = harness_database_new();
    f->conn = harness_connect(f->url);
    /* a quarter of the rows waiting, the rest succeeded and kept, as autovacuum would find them */
    harness_exec(f->conn, "SELECT count(outbox.enqueue('plans', '{}'))"
                          " FROM generate_series(1, 20000)");
    harness_exec(f->conn, "UPDATE outbox.job SET state = 'succeeded', finished_at = now()"
                          " WHERE job_id % 4 <> 0");
    harness_exec(f->conn, "VACUUM ANALYZE outbox.job");
    first = harness_query_ll(f->conn, "SELECT min(job_id) FROM outbox.job");
    f->ids = array_literal(BATCH, NULL, first);
    f->generations = array_literal(BATCH, "1", 0);
    f->errors = array_literal(BATCH, "\"broker refused\"", 0);
    f->retries = array_literal(BATCH, "5", 0);
    f->permanents = array_literal(BATCH, "false", 0);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    free(f->ids);
    free(f->generations);
    free(f->errors);
    free(f->retries);
    free(f->permanents);
    PQfinish(f->conn);
    harness_database_drop(f->url);
    free(f);
    return 0;
}

/* The highest $N of sql: the statement's parameter count. */
static int
parameter_count(const char *sql)
{
    int highest = 0;

    for (const char *at = strchr(sql, '$'); at != NULL; at = strchr(at + 1, '$')) {
        int n = atoi(at + 1);

        if (n > highest)
            highest = n;
    }
    return highest;
}

/* Plans statement with values bound and fails, showing the plan, when it reads outbox.job whole. */
static void
assert_uses_the_key(PGconn *conn, enum statement statement, const char *const *values)
{
    const struct store_statement *s = &store_statements[statement];
    int count = parameter_count(s->sql);
    size_t size = strlen(s->sql) + 32;
    char *explain = malloc(size);
    char plan[16384];
    size_t used = 0;
    PGresult *result;

    assert_non_null(explain);
    assert_true(count <= PARAMS_MAX);
    snprintf(explain, size, "EXPLAIN %s", s->sql);
    result = PQexecParams(conn, explain, count, NULL, values, NULL, NULL, 0);
    free(explain);
    if (PQresultStatus(result) != PGRES_TUPLES_OK)
        fail_msg("%s: %s", s->name, PQresultErrorMessage(result));
    plan[0] = '\0';
    for (int row = 0; row < PQntuples(result) && used < sizeof(plan) - 1; row++)
        used += (size_t)snprintf(plan + used, sizeof(plan) - used, "%s\n",
                                 PQgetvalue(result, row, 0));
    PQclear(result);
    if (strstr(plan, "Seq Scan on job ") != NULL)
        fail_msg("%s reads outbox.job whole:\n%s", s->name, plan);
}

static void
test_claims_use_the_key(void **state)
{
    struct fixture *f = *state;
    const char *all[] = {"relay-a", "500", "60", "false"};
    const char *queues[] = {"relay-a", "500", "60", "false", "{plans}"};
    const char *paused[] = {"relay-a", "500", "60", "false", "{other}", "{plans}", "{k}"};
    const char *queues_paused[] = {"relay-a", "500", "60", "false", "{plans}", "{other}",
                                   "{plans}", "{k}"};

    assert_uses_the_key(f->conn, STMT_CLAIM_ALL, all);
    assert_uses_the_key(f->conn, STMT_CLAIM_QUEUES, queues);
    assert_uses_the_key(f->conn, STMT_CLAIM_ALL_PAUSED, paused);
    assert_uses_the_key(f->conn, STMT_CLAIM_QUEUES_PAUSED, queues_paused);
}

static void
test_marks_use_the_key(void **state)
{
    struct fixture *f = *state;
    const char *lease[] = {"relay-a", f->ids, f->generations, "60"};
    const char *fail[] = {"relay-a", f->ids, f->generations, f->errors, f->retries,
                          f->permanents, "false"};

    assert_uses_the_key(f->conn, STMT_COMPLETE, lease);
    assert_uses_the_key(f->conn, STMT_COMPLETE_DELETE, lease);
    assert_uses_the_key(f->conn, STMT_RELEASE, lease);
    assert_uses_the_key(f->conn, STMT_EXTEND, lease);
    assert_uses_the_key(f->conn, STMT_FAIL, fail);
}

static void
test_maintenance_uses_the_key(void **state)
{
    struct fixture *f = *state;
    const char *reap[] = {"500", "5"};
    const char *cleanup[] = {"2100-01-01T00:00:00+00:00", "500"};
    const char *sweep[] = {"500", "", "", "false"};

    assert_uses_the_key(f->conn, STMT_REAP, reap);
    assert_uses_the_key(f->conn, STMT_CLEANUP_BATCH, cleanup);
    assert_uses_the_key(f->conn, STMT_SWEEP_HELD, sweep);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_claims_use_the_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_marks_use_the_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_maintenance_uses_the_key, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
