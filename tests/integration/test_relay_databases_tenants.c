/*
 * test_relay_databases_tenants.c - a relay of a list of tenant databases
 * (--databases FILE) against what its tenants' sessions do: a pooled
 * session that wrote a business row a moment before it enqueues has its
 * row woken at the commit, not when its backend next reports statistics.
 * Every wait is bounded; the relay started is killed on every exit path.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "database_list_run.h"
#include "fixtures.h"
#include "harness.h"
#include "http_client.h"
#include "proxy.h"
#include "redis_consumer.h"
#include "relay_runner.h"
#include "scheduler_watch.h"

struct fixture {
    struct broker_case bc;
    struct run run;
    struct relay_process relay;
    bool running;
    int port;
    PGconn *producer; /* a tenant's pooled application session */
};

static int
setup(void **state)
{
    static int tests;
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    f->bc = (struct broker_case){"redis", "OUTBOX_TEST_REDIS_URL", 3, 0, 0, 4, NULL,
                                 "--stream-prefix", ":"};
    f->run.bc = &f->bc;
    f->run.admin = harness_connect(harness_env("OUTBOX_TEST_PG_URL"));
    snprintf(f->run.list_path, sizeof(f->run.list_path), "%s/databases-tenants-%d.list",
             harness_env("OUTBOX_TEST_STACK_DIR"), (int)getpid());
    snprintf(f->run.prefix, sizeof(f->run.prefix), "mdb-tenants-%d-%d:", (int)getpid(), tests++);
    f->port = harness_free_port();
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;
    redisContext *redis = stream_consumer_connect(harness_env("OUTBOX_TEST_REDIS_URL"));

    if (f->running) {
        relay_signal(&f->relay, SIGKILL);
        harness_wait_exit(f->relay.pid, 5000);
    }
    if (redis != NULL) {
        stream_consumer_delete_test_keys(redis, f->run.prefix);
        redisFree(redis);
    }
    PQfinish(f->producer);
    list_run_drop(&f->run);
    free(f);
    return 0;
}

/* Makes the list's databases and writes the list; starts the relay. */
static void
start(struct fixture *f)
{
    f->run.count = f->bc.databases;
    for (int i = 0; i < f->run.count; i++)
        list_run_make_database(&f->run, i);
    list_run_write_list(&f->run, f->run.count, false);
    list_run_start_relay(&f->run, &f->relay, "mdb-tenants", f->port);
    f->running = true;
}

/* Rows of database i not yet succeeded. */
static long long
left_in(const struct fixture *f, int i)
{
    return harness_query_ll(f->run.conns[i],
                            "SELECT count(*) FROM outbox.job WHERE state <> 'succeeded'");
}

/* Waits up to seconds for database i to have no row left; the seconds it took, -1 when not. */
static double
drain_one(const struct fixture *f, int i, double seconds)
{
    double from = wall_clock_seconds();

    while (left_in(f, i) > 0) {
        if (wall_clock_seconds() - from > seconds)
            return -1;
        usleep(5 * 1000);
    }
    return wall_clock_seconds() - from;
}

/* Row n of database i (the payload list_run_check_redis() reads), enqueued on conn. */
static void
enqueue_on(PGconn *conn, const struct fixture *f, int i, int n)
{
    char sql[256];

    snprintf(sql, sizeof(sql),
             "SELECT outbox.enqueue('" LIST_RUN_QUEUE "', jsonb_build_object('db', '%s', 'n', %d))",
             f->run.ids[i], n);
    harness_exec(conn, sql);
}

static int
compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

#define BUSY_ROUNDS 5

/*
 * A pooled session that updates a business row and 0.3 s later enqueues,
 * as an application connection does: its backend reported the update's
 * statistics at that commit, and PostgreSQL holds its next report back for
 * a second, up to 10 s while the session idles; and the business row's own
 * wake began the database's rest. The row is published within 0.5 s of its
 * commit each round (10.1 s before migration 023; 0.16-0.57 s with it but
 * the woken database resting its idle wait).
 */
static void
test_busy_session_woken_at_commit(void **state)
{
    struct fixture *f = *state;
    double took[BUSY_ROUNDS];
    int busy;

    start(f);
    busy = f->run.count - 1; /* the last: list_run_check_redis() counts its rows apart */
    f->producer = harness_connect(f->run.urls[busy]);
    harness_exec(f->producer, "CREATE TABLE public.account (id int PRIMARY KEY, balance int);"
                              "INSERT INTO public.account VALUES (1, 0)");
    assert_int_equal(wait_for_value(f->run.admin,
                                    "SELECT count(*) FROM pg_stat_activity"
                                    " WHERE application_name LIKE 'outbox-relay watch %'",
                                    1, 10000),
                     1);
    usleep(1500 * 1000); /* the databases visited once, idle, each resting until woken */
    for (int r = 0; r < BUSY_ROUNDS; r++) {
        usleep(1200 * 1000); /* the backend's last report more than a second old */
        harness_exec(f->producer, "UPDATE public.account SET balance = balance + 1");
        usleep(300 * 1000);
        enqueue_on(f->producer, f, busy, r + 1);
        took[r] = drain_one(f, busy, 15);
        print_message("busy session: round %d published %.3f s after its commit\n", r + 1,
                      took[r]);
        assert_true(took[r] >= 0);
    }
    qsort(took, BUSY_ROUNDS, sizeof(*took), compare_doubles);
    print_message("busy session: commit -> publish median %.3f s, max %.3f s\n",
                  took[BUSY_ROUNDS / 2], took[BUSY_ROUNDS - 1]);
    if (took[BUSY_ROUNDS - 1] > 0.5) {
        relay_dump_log(&f->relay);
        fail_msg("a busy session's row waited %.1f s for its statistics report",
                 took[BUSY_ROUNDS - 1]);
    }
    relay_signal(&f->relay, SIGTERM);
    f->running = false;
    assert_int_equal(relay_wait(&f->relay, 15000), 0);
    list_run_check_redis(&f->run, 0, BUSY_ROUNDS);
}

#define EDIT_ROUNDS 6
#define EDIT_DATABASES 8 /* and one more, listed and removed in turns */

/*
 * Single rows into idle watched databases while the list file is edited
 * (a database added and removed in turns, the others kept): each round's
 * rows are all published within 5 s. A list change gave the watch a fresh
 * count of every database, so a commit after its last look before the
 * change was taken for where the count starts, and its row waited for the
 * next one (or the 15-minute look).
 */
static void
test_rows_woken_while_list_edited(void **state)
{
    struct fixture *f = *state;

    f->bc.databases = EDIT_DATABASES + 1;
    start(f);
    usleep(3000 * 1000); /* every database visited once, idle, resting until woken */
    for (int r = 0; r < EDIT_ROUNDS; r++) {
        double from;

        list_run_write_list(&f->run, r % 2 == 0 ? EDIT_DATABASES : EDIT_DATABASES + 1, false);
        for (int i = 0; i < EDIT_DATABASES; i++) {
            enqueue_on(f->run.conns[i], f, i, r + 1);
            usleep(150 * 1000); /* spread over the relay's next look at the file */
        }
        from = wall_clock_seconds();
        while (list_run_rows_left(&f->run) > 0 && wall_clock_seconds() - from < 5)
            usleep(20 * 1000);
        if (list_run_rows_left(&f->run) > 0) {
            relay_dump_log(&f->relay);
            fail_msg("round %d: %lld rows not published 5 s after the last commit", r + 1,
                     list_run_rows_left(&f->run));
        }
    }
    relay_signal(&f->relay, SIGTERM);
    f->running = false;
    assert_int_equal(relay_wait(&f->relay, 15000), 0);
}

/*
 * A tenant's session naming itself like a relay's watch, in turns with
 * another name, while the databases idle: the watch counted it as a relay
 * joining and leaving, and each look woke every database of the server
 * for its lease (a wake storm). Now only sessions of the watch's login
 * role (or of outbox_relay's members) count: the relay opens next to no
 * session meanwhile.
 */
static void
test_watch_name_storm(void **state)
{
    struct fixture *f = *state;
    char user[48], *url;
    PGconn *tenant;
    long long before, opened;
    double from;
    int turns = 0;

    f->bc.databases = 8; /* budget 4: visits need connects */
    start(f);
    usleep(3000 * 1000); /* every database visited once, idle */
    snprintf(user, sizeof(user), "storm_%d", (int)getpid());
    fixture_create_login_role(f->run.admin, user, "");
    url = fixture_url_as(f->run.urls[0], user);
    tenant = harness_connect(url);
    free(url);
    before = list_run_sessions_opened(&f->run);
    from = wall_clock_seconds();
    while (wall_clock_seconds() - from < 4) {
        PQclear(PQexec(tenant, turns++ % 2 == 0
                                   ? "SET application_name = '" WATCH_NAME_PREFIX
                                     "00000000-0000-0000-0000-000000000000'; SELECT 1"
                                   : "SET application_name = 'tenant app'; SELECT 1"));
        usleep(60 * 1000);
    }
    opened = list_run_sessions_opened(&f->run) - before;
    PQfinish(tenant);
    fixture_drop_role(f->run.admin, user);
    print_message("storm: %d name changes in 4 s, the relay opened %lld sessions\n", turns,
                  opened);
    assert_true(opened <= 8);
    relay_signal(&f->relay, SIGTERM);
    f->running = false;
    assert_int_equal(relay_wait(&f->relay, 15000), 0);
}

#define ROLE_DATABASES 3

/* Writes the list with database i under login role users[i]. */
static void
write_list_as(const struct fixture *f, char users[][48])
{
    FILE *file = fopen(f->run.list_path, "w");

    assert_non_null(file);
    for (int i = 0; i < f->run.count; i++) {
        char *url = fixture_url_as(f->run.urls[i], users[i]);

        fprintf(file, "db%d %s\n", i, url);
        free(url);
    }
    assert_int_equal(fclose(file), 0);
}

/* Databases whose lease this relay's watch keeps (sql/019's watched member). */
static int
watched_members(const struct fixture *f)
{
    int count = 0;

    for (int i = 0; i < f->run.count; i++)
        count += harness_query_ll(f->run.conns[i],
                                  "SELECT count(*) FROM outbox.relay_members('60 s') WHERE watched")
                 == 1;
    return count;
}

/*
 * A login role per tenant database: the watch's one session on the server
 * is of the first database's role, and each other database recorded the
 * relay's member under its own, so no watch kept those leases and each was
 * visited, a connect each, four times a lease. Now the member is recorded
 * under the watch session's role (sql/024): every database's lease is kept
 * by the watch, and an idle minute costs no connect.
 */
static void
test_tenant_roles_keep_the_watch(void **state)
{
    struct fixture *f = *state;
    char users[ROLE_DATABASES][48];
    double from;
    int watched = 0;

    f->run.count = ROLE_DATABASES;
    for (int i = 0; i < f->run.count; i++) {
        char grant[192];

        list_run_make_database(&f->run, i);
        fixture_create_outbox_roles(f->run.conns[i]);
        snprintf(users[i], sizeof(users[i]), "tenant%d_%d", i, (int)getpid());
        snprintf(grant, sizeof(grant), "GRANT outbox_relay TO %s", users[i]);
        fixture_create_login_role(f->run.conns[i], users[i], grant);
    }
    write_list_as(f, users);
    list_run_start_relay(&f->run, &f->relay, "mdb-tenants", f->port);
    f->running = true;
    from = wall_clock_seconds();
    while (wall_clock_seconds() - from < 10 && (watched = watched_members(f)) < f->run.count)
        usleep(200 * 1000);
    print_message("tenant roles: %d of %d databases' leases kept by the watch\n", watched,
                  f->run.count);
    for (int i = 0; watched < f->run.count && i < f->run.count; i++) {
        PGresult *result = PQexec(f->run.conns[i], "SELECT watch, watch_role,"
                                                   " (SELECT string_agg(usesysid || ' ' || pid, ',')"
                                                   "    FROM pg_stat_activity"
                                                   "   WHERE application_name = m.watch)"
                                                   " FROM outbox.relay_member AS m");

        for (int r = 0; PQresultStatus(result) == PGRES_TUPLES_OK && r < PQntuples(result); r++)
            print_message("db%d: member watch %s role %s; sessions %s\n", i,
                          PQgetvalue(result, r, 0), PQgetvalue(result, r, 1),
                          PQgetvalue(result, r, 2));
        PQclear(result);
    }
    relay_signal(&f->relay, SIGTERM);
    f->running = false;
    assert_int_equal(relay_wait(&f->relay, 15000), 0);
    for (int i = 0; i < f->run.count; i++)
        fixture_drop_role(f->run.conns[i], users[i]);
    assert_int_equal(watched, f->run.count);
}

/*
 * Two databases of the list under one identity (a TEMPLATE copy beside its
 * original, a dump restored under another name): their message ids collide
 * and a deduplicating destination drops one's rows. The relay says so at
 * its first connects, naming both, within 10 s of its start.
 */
static void
test_duplicate_identity_said_at_once(void **state)
{
    struct fixture *f = *state;
    const char *argv[] = {"--database-url", NULL, "identity", "set", "--database-id", NULL,
                          NULL};
    char output[2048];
    double from;
    int lines = 0;

    f->run.count = f->bc.databases;
    for (int i = 0; i < f->run.count; i++)
        list_run_make_database(&f->run, i);
    argv[1] = f->run.urls[2];
    argv[5] = f->run.ids[0];
    if (fixture_run_outboxctl(argv, output, sizeof(output)) != 0)
        fail_msg("outboxctl identity set: %s", output);
    list_run_write_list(&f->run, f->run.count, false);
    list_run_start_relay(&f->run, &f->relay, "mdb-tenants", f->port);
    f->running = true;
    from = wall_clock_seconds();
    while (wall_clock_seconds() - from < 10 &&
           (lines = list_run_log_lines_with(&f->relay, "have one identity", "database_id=")) == 0)
        usleep(200 * 1000);
    print_message("one identity: said %.1f s after the start\n", wall_clock_seconds() - from);
    assert_int_equal(lines, 1);
    assert_int_equal(list_run_log_lines_with(&f->relay, "have one identity", "db0"), 1);
    assert_int_equal(list_run_log_lines_with(&f->relay, "have one identity", "db2"), 1);
    relay_signal(&f->relay, SIGTERM);
    f->running = false;
    assert_int_equal(relay_wait(&f->relay, 15000), 0);
}

/*
 * The value of family's series for database name in the relay's /metrics;
 * -1 when the relay does not answer or has no such series.
 */
static double
metric_of(const struct fixture *f, const char *family, const char *name)
{
    struct http_reply reply = http_get(f->port, "/metrics");
    char series[160];
    const char *at;
    double value = -1;

    snprintf(series, sizeof(series), "\n%s{broker=\"redis\",database=\"%s\"} ", family, name);
    if (reply.status == 200 && (at = strstr(reply.body, series)) != NULL)
        value = atof(at + strlen(series));
    http_reply_free(&reply);
    return value;
}

/*
 * Another session holds database db1's ready rows locked (FOR UPDATE) past
 * their due time: the relay's claims skip them, and a watched database
 * rested after its empty visit as if it had none, until its next wake (up
 * to 15 minutes), with outbox_database_up 1 all along. Now /metrics shows
 * each listed database's ready rows and oldest ready age, past
 * --metrics-max-queues too (1 here: db1 and db2 have no series of their
 * own in the counters, nor had in outbox_database_up), and db1 stranded
 * after 30 s without a claim; once
 * the lock ends its rows are published within 5 s, polled while a claim
 * would take them.
 */
static void
test_backlog_and_stranded_database_shown(void **state)
{
    struct fixture *f = *state;
    PGconn *locker;
    double from, stranded = 0, age;

    setenv("OUTBOX_METRICS_MAX_QUEUES", "1", 1);
    start(f);
    unsetenv("OUTBOX_METRICS_MAX_QUEUES");
    usleep(2000 * 1000); /* every database visited once, idle, resting until woken */
    locker = harness_connect(f->run.urls[1]);
    harness_exec(locker, "INSERT INTO outbox.job (queue, payload, run_at)"
                         " SELECT '" LIST_RUN_QUEUE "', jsonb_build_object('n', n),"
                         "        now() + interval '2 seconds'"
                         "   FROM generate_series(1, 3) AS n");
    harness_exec(locker, "BEGIN");
    harness_exec(locker, "SELECT count(*) FROM (SELECT 1 FROM outbox.job"
                         " WHERE state = 'ready' FOR UPDATE) AS locked");
    from = wall_clock_seconds();
    while (wall_clock_seconds() - from < 45 &&
           (stranded = metric_of(f, "outbox_database_stranded", "db1")) != 1)
        usleep(500 * 1000);
    age = metric_of(f, "outbox_database_oldest_ready_age_seconds", "db1");
    print_message("locked rows: stranded shown %.1f s after the lock, oldest ready %.1f s old\n",
                  wall_clock_seconds() - from, age);
    if (stranded != 1) {
        relay_dump_log(&f->relay);
        fail_msg("db1 not shown stranded 45 s into a lock on its ready rows");
    }
    assert_true(metric_of(f, "outbox_database_ready_rows", "db1") == 3);
    assert_true(age >= 28 && age < 60);
    assert_true(metric_of(f, "outbox_database_stranded", "db0") == 0);
    assert_true(metric_of(f, "outbox_database_stranded", "db2") == 0);
    assert_true(metric_of(f, "outbox_database_ready_rows", "db2") == 0);
    assert_true(metric_of(f, "outbox_database_up", "db2") == 1);
    harness_exec(locker, "COMMIT");
    PQfinish(locker);
    age = drain_one(f, 1, 5);
    print_message("locked rows: published %.3f s after the lock ended\n", age);
    assert_true(age >= 0);
    from = wall_clock_seconds();
    while (wall_clock_seconds() - from < 5 &&
           (metric_of(f, "outbox_database_stranded", "db1") != 0 ||
            metric_of(f, "outbox_database_ready_rows", "db1") != 0))
        usleep(200 * 1000);
    print_message("locked rows: the gauges back to 0 %.1f s after\n", wall_clock_seconds() - from);
    assert_true(metric_of(f, "outbox_database_stranded", "db1") == 0);
    assert_true(metric_of(f, "outbox_database_ready_rows", "db1") == 0);
    relay_signal(&f->relay, SIGTERM);
    f->running = false;
    assert_int_equal(relay_wait(&f->relay, 15000), 0);
}

/* The message id of database i's row n in the run's stream, into id ("" when not there). */
static void
message_id_of(const struct fixture *f, int i, int n, char *id, size_t size)
{
    redisContext *redis = stream_consumer_connect(harness_env("OUTBOX_TEST_REDIS_URL"));
    struct stream_consumer_stream stream = {0};
    char stream_name[96], payload[96];

    id[0] = '\0';
    assert_non_null(redis);
    snprintf(stream_name, sizeof(stream_name), "%s" LIST_RUN_QUEUE, f->run.prefix);
    snprintf(payload, sizeof(payload), "\"n\": %d", n);
    if (stream_consumer_read_stream(redis, stream_name, &stream) == 0)
        for (size_t e = 0; e < stream.count; e++)
            if (stream.entries[e].payload != NULL &&
                strstr(stream.entries[e].payload, f->run.ids[i]) != NULL &&
                strstr(stream.entries[e].payload, payload) != NULL &&
                stream.entries[e].message_id != NULL)
                snprintf(id, size, "%s", stream.entries[e].message_id);
    stream_consumer_stream_clear(&stream);
    redisFree(redis);
}

/*
 * `outboxctl identity set --database-id` on a listed database while the
 * relay runs (the fix for a TEMPLATE copy beside its original): the relay
 * kept the identity its idle connection read at the connect, and its rows
 * went on under the old id until a restart. Now a row enqueued a few
 * seconds later carries the new one, and an id that another database of
 * the list has is said at once.
 */
static void
test_identity_set_taken_without_restart(void **state)
{
    struct fixture *f = *state;
    const char *argv[] = {"--database-url", NULL, "identity", "set", "--database-id", NULL, NULL};
    char output[2048], id[128], fresh[48], expected[64];
    double from, took = -1;

    start(f);
    enqueue_on(f->run.conns[0], f, 0, 1);
    assert_true(drain_one(f, 0, 10) >= 0);
    message_id_of(f, 0, 1, id, sizeof(id));
    assert_true(strncmp(id, f->run.ids[0], strlen(f->run.ids[0])) == 0);
    snprintf(fresh, sizeof(fresh), "fresh%d", (int)getpid());
    argv[1] = f->run.urls[0];
    argv[5] = fresh;
    if (fixture_run_outboxctl(argv, output, sizeof(output)) != 0)
        fail_msg("outboxctl identity set: %s", output);
    from = wall_clock_seconds();
    snprintf(expected, sizeof(expected), "%s:", fresh);
    for (int n = 2; n < 40 && took < 0; n++) {
        usleep(500 * 1000);
        enqueue_on(f->run.conns[0], f, 0, n);
        assert_true(drain_one(f, 0, 10) >= 0);
        message_id_of(f, 0, n, id, sizeof(id));
        if (strncmp(id, expected, strlen(expected)) == 0)
            took = wall_clock_seconds() - from;
    }
    print_message("identity set: rows carry the new id %.1f s after it (last id %s)\n", took, id);
    if (took < 0 || took > 20) {
        relay_dump_log(&f->relay);
        fail_msg("the relay kept the old identity 20 s after identity set");
    }
    assert_int_equal(list_run_log_lines_with(&f->relay, "identity changed", fresh), 1);
    /* given db1's identity by mistake: said as two databases of one identity */
    argv[5] = f->run.ids[1];
    if (fixture_run_outboxctl(argv, output, sizeof(output)) != 0)
        fail_msg("outboxctl identity set: %s", output);
    from = wall_clock_seconds();
    while (wall_clock_seconds() - from < 10 &&
           list_run_log_lines_with(&f->relay, "have one identity", f->run.ids[1]) == 0) {
        enqueue_on(f->run.conns[0], f, 0, 100);
        usleep(500 * 1000);
    }
    assert_int_equal(list_run_log_lines_with(&f->relay, "have one identity", f->run.ids[1]), 1);
    relay_signal(&f->relay, SIGTERM);
    f->running = false;
    assert_int_equal(relay_wait(&f->relay, 15000), 0);
}

#define SLOW_DATABASES 8
#define SLOW_ROWS 20

/* Writes the list with every database reached through port (a proxy) instead of PostgreSQL's. */
static void
write_list_through(const struct fixture *f, int port)
{
    FILE *file = fopen(f->run.list_path, "w");
    char direct[16];

    assert_non_null(file);
    snprintf(direct, sizeof(direct), ":%s/", harness_env("OUTBOX_TEST_PG_PORT"));
    for (int i = 0; i < f->run.count; i++) {
        const char *at = strstr(f->run.urls[i], direct);

        assert_non_null(at);
        fprintf(file, "db%d %.*s:%d/%s\n", i, (int)(at - f->run.urls[i]), f->run.urls[i], port,
                at + strlen(direct));
    }
    assert_int_equal(fclose(file), 0);
}

/*
 * Every database behind a proxy whose connects take 300 ms (a distant
 * server, a pooler, TLS), 8 databases on a budget of 4: most visits
 * connect. A slot's slice was timed from before the connect, the lease
 * call and the maintenance, so a visit that connected had no time left to
 * claim and its database rested as if empty until the next wake: 3-9 of 20
 * rows of a database were never published in the run. Now db0's 20 rows,
 * one every 100 ms beside single rows into the others, and those, are all
 * published within 10 s of the last.
 */
static void
test_slow_connect_publishes_every_row(void **state)
{
    struct fixture *f = *state;
    chaos_proxy *proxy;
    int next[SLOW_DATABASES];
    long long left = -1;
    double from;

    f->bc.rows = 1;
    f->run.count = SLOW_DATABASES;
    for (int i = 0; i < f->run.count; i++) {
        list_run_make_database(&f->run, i);
        next[i] = 2;
    }
    proxy = chaos_proxy_start(atoi(harness_env("OUTBOX_TEST_PG_PORT")), 0);
    assert_non_null(proxy);
    chaos_proxy_slow_connect(proxy, 300);
    write_list_through(f, chaos_proxy_port(proxy));
    list_run_start_relay(&f->run, &f->relay, "mdb-tenants", f->port);
    f->running = true;
    usleep(3000 * 1000); /* each database's first row out, the databases resting */
    for (int n = 0; n < SLOW_ROWS; n++) {
        int other = 1 + n % (SLOW_DATABASES - 1);

        enqueue_on(f->run.conns[0], f, 0, next[0]++);
        enqueue_on(f->run.conns[other], f, other, next[other]++);
        usleep(100 * 1000);
    }
    from = wall_clock_seconds();
    while (wall_clock_seconds() - from < 10 && (left = list_run_rows_left(&f->run)) > 0)
        usleep(50 * 1000);
    print_message("slow connects: %.1f s after the last row, %lld rows left (db0: %lld of %d);"
                  " %llu connects through the proxy\n",
                  wall_clock_seconds() - from, left, left_in(f, 0), SLOW_ROWS + 1,
                  (unsigned long long)chaos_proxy_accepted(proxy));
    if (left != 0)
        relay_dump_log(&f->relay);
    relay_signal(&f->relay, SIGTERM);
    f->running = false;
    assert_int_equal(relay_wait(&f->relay, 15000), 0);
    chaos_proxy_free(proxy);
    assert_int_equal(left, 0);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_busy_session_woken_at_commit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rows_woken_while_list_edited, setup, teardown),
        cmocka_unit_test_setup_teardown(test_watch_name_storm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tenant_roles_keep_the_watch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_duplicate_identity_said_at_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_backlog_and_stranded_database_shown, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_identity_set_taken_without_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slow_connect_publishes_every_row, setup, teardown),
    };

    /* OUTBOX_TEST_FILTER=test_identity* runs only the matching tests */
    if (getenv("OUTBOX_TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("OUTBOX_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
