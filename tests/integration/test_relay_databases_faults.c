/*
 * test_relay_databases_faults.c - relays of one list of databases
 * (--databases FILE) under an operator's faults: a relay stopped with
 * SIGSTOP past its lease and let go again, PostgreSQL crashed and started
 * again under the relays, a relay joining while rows flow, a relay's
 * statistics watch session ended while it lives, another role's session
 * named after a killed relay's watch, the watch's session on one of two
 * servers stalled, a whole database paused while its owner holds it. Each
 * time no row is lost and no Redis entry is appended twice; where relays
 * share the list, the leases settle with each database held by the relay
 * that wins its rendezvous, which alone says so in its /metrics. Every wait
 * is bounded; every relay started is killed, every backend stopped let go
 * and PostgreSQL started again on every exit path (teardown).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "database_list_run.h"
#include "fixtures.h"
#include "harness.h"
#include "redis_consumer.h"
#include "relay_runner.h"
#include "timeouts.h"

#define RELAYS 3
#define LEASE_SECONDS 10

struct fixture {
    struct broker_case bc;
    struct run run;
    struct relay_process relays[RELAYS];
    bool running[RELAYS];
    int ports[RELAYS];
    bool postgres_down;
    int stopped[8]; /* PostgreSQL backends stopped with SIGSTOP, let go by teardown */
    int stopped_count;
};

static int
setup(void **state)
{
    static int tests;
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    f->bc = (struct broker_case){"redis", "OUTBOX_TEST_REDIS_URL", 8, 40, 0, 4, "10",
                                 "--stream-prefix", ":"};
    f->run.bc = &f->bc;
    f->run.admin = harness_connect(harness_env("OUTBOX_TEST_PG_URL"));
    snprintf(f->run.list_path, sizeof(f->run.list_path), "%s/databases-faults-%d.list",
             harness_env("OUTBOX_TEST_STACK_DIR"), (int)getpid());
    snprintf(f->run.prefix, sizeof(f->run.prefix), "mdb-faults-%d-%d:", (int)getpid(), tests++);
    for (int k = 0; k < RELAYS; k++)
        f->ports[k] = harness_free_port();
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;
    redisContext *redis = stream_consumer_connect(harness_env("OUTBOX_TEST_REDIS_URL"));

    for (int i = 0; i < f->stopped_count; i++)
        kill(f->stopped[i], SIGCONT);
    for (int k = 0; k < RELAYS; k++)
        if (f->running[k]) { /* a stopped process is killed too: SIGKILL needs no SIGCONT */
            relay_signal(&f->relays[k], SIGKILL);
            harness_wait_exit(f->relays[k].pid, 5000);
        }
    if (f->postgres_down)
        harness_stack("start-service", "postgres");
    if (redis != NULL) {
        stream_consumer_delete_test_keys(redis, f->run.prefix);
        redisFree(redis);
    }
    if (f->postgres_down) { /* the connections died with the server */
        for (int i = 0; i < f->run.count; i++)
            PQreset(f->run.conns[i]);
        PQreset(f->run.admin);
    }
    list_run_drop(&f->run);
    free(f);
    return 0;
}

/* Makes the list's databases, each with bc.rows rows, and writes the list. */
static void
make_list(struct fixture *f)
{
    f->run.count = f->bc.databases;
    for (int i = 0; i < f->run.count; i++)
        list_run_make_database(&f->run, i);
    list_run_write_list(&f->run, f->run.count, false);
}

static void
start(struct fixture *f, int k)
{
    char name[32];

    snprintf(name, sizeof(name), "mdb-faults-%c", 'a' + k);
    list_run_start_relay(&f->run, &f->relays[k], name, f->ports[k]);
    f->running[k] = true;
}

/* SIGTERM: the relay gives its leases up and exits 0. */
static void
stop(struct fixture *f, int k)
{
    relay_signal(&f->relays[k], SIGTERM);
    f->running[k] = false;
    assert_int_equal(relay_wait(&f->relays[k], 15000), 0);
}

/* Waits up to seconds for every row to be published; the seconds it took, -1 when not. */
static double
drain(struct fixture *f, double seconds)
{
    double from = wall_clock_seconds();

    while (list_run_rows_left(&f->run) > 0) {
        if (wall_clock_seconds() - from > seconds)
            return -1;
        usleep(100 * 1000);
    }
    return wall_clock_seconds() - from;
}

/* The running relay that owner (a worker prefix or a name made from one) names; -1: none. */
static int
relay_of(const struct fixture *f, const char *owner)
{
    return list_run_relay_of(f->relays, f->running, RELAYS, owner);
}

/* The relay holding database i's lease, -1 for none (or one not running). */
static int
owner_of(const struct fixture *f, int i)
{
    PGresult *result = PQexec(f->run.conns[i], "SELECT owner FROM outbox.database_lease");
    int k = -1;

    if (PQresultStatus(result) == PGRES_TUPLES_OK && PQntuples(result) == 1 &&
        !PQgetisnull(result, 0, 0))
        k = relay_of(f, PQgetvalue(result, 0, 0));
    PQclear(result);
    return k;
}

/*
 * The running relay that should hold database i: the live member of its
 * rendezvous with the highest hash (sql/019); -1 for none.
 */
static int
winner_of(const struct fixture *f, int i)
{
    char sql[256];
    PGresult *result;
    int k = -1;

    snprintf(sql, sizeof(sql),
             "SELECT relay_id FROM outbox.relay_members(make_interval(secs => %d)) WHERE live"
             " ORDER BY md5(relay_id || ':' || current_database()) DESC, relay_id LIMIT 1",
             LEASE_SECONDS);
    result = PQexec(f->run.conns[i], sql);
    if (PQresultStatus(result) == PGRES_TUPLES_OK && PQntuples(result) == 1)
        k = relay_of(f, PQgetvalue(result, 0, 0));
    PQclear(result);
    return k;
}

/* Whether metrics says its relay serves database dbI. */
static bool
serves(const char *metrics, int i)
{
    char needle[64];

    snprintf(needle, sizeof(needle), "database=\"db%d\"} 1", i);
    for (const char *p = metrics; (p = strstr(p, "outbox_database_served{")) != NULL; p++) {
        const char *end = strchr(p, '\n');
        const char *found = strstr(p, needle);

        if (found != NULL && (end == NULL || found < end))
            return true;
    }
    return false;
}

/*
 * Whether the leases are settled: each database's lease held by the running
 * relay that wins its rendezvous, and that relay alone says it serves it.
 * owners[i] gets the owner.
 */
static bool
settled(const struct fixture *f, int *owners)
{
    char *metrics[RELAYS] = {NULL};
    bool ok = true;

    for (int k = 0; k < RELAYS; k++)
        if (f->running[k] && (metrics[k] = relay_scrape_metrics(f->ports[k])) == NULL)
            ok = false;
    for (int i = 0; ok && i < f->run.count; i++) {
        owners[i] = owner_of(f, i);
        ok = owners[i] >= 0 && owners[i] == winner_of(f, i);
        for (int k = 0; ok && k < RELAYS; k++)
            ok = metrics[k] == NULL || serves(metrics[k], i) == (owners[i] == k);
    }
    for (int k = 0; k < RELAYS; k++)
        free(metrics[k]);
    return ok;
}

/* How many of database i's members its relays' watches keep alive (sql/020), -1 on error. */
static int
watched_members(const struct fixture *f, int i)
{
    char sql[160];

    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM outbox.relay_members(make_interval(secs => %d)) WHERE watched",
             LEASE_SECONDS);
    return (int)harness_query_ll(f->run.conns[i], sql);
}

/* Prints, after when, each database's lease owner, rendezvous winner and watched members. */
static void
print_leases(const struct fixture *f, const char *when)
{
    for (int i = 0; i < f->run.count; i++)
        print_message("%s: db%d owned by relay %d, won by relay %d, %d members kept by their watch\n",
                      when, i, owner_of(f, i), winner_of(f, i), watched_members(f, i));
}

/*
 * Waits up to seconds (times harness_time_scale()) for the leases to settle
 * and stay so for a second; fails the test naming the last look when they
 * do not.
 */
static void
wait_settled(const struct fixture *f, int *owners, double seconds, const char *when)
{
    double from = wall_clock_seconds();
    int again[LIST_RUN_MAX_DATABASES];

    seconds *= harness_time_scale();

    for (;;) {
        if (settled(f, owners)) {
            usleep(1000 * 1000);
            if (settled(f, again) && memcmp(owners, again, sizeof(*owners) * f->run.count) == 0)
                break;
        }
        if (wall_clock_seconds() - from > seconds) {
            print_leases(f, when);
            for (int k = 0; k < RELAYS; k++)
                if (f->running[k])
                    relay_dump_log(&f->relays[k]);
            fail_msg("%s: the leases did not settle within %.0f s", when, seconds);
        }
        usleep(200 * 1000);
    }
    print_message("%s: leases settled in %.1f s (and kept a second)\n", when,
                  wall_clock_seconds() - from);
}

/*
 * Waits up to seconds (times harness_time_scale()) until in every database
 * both running relays are members kept alive by their watch sessions: what
 * lets one relay take a killed one's databases at once rather than when
 * their leases run out.
 */
static void
wait_watched(const struct fixture *f, double seconds)
{
    double from = wall_clock_seconds();
    int running = 0, i = 0;

    seconds *= harness_time_scale();

    for (int k = 0; k < RELAYS; k++)
        running += f->running[k];
    while (i < f->run.count) {
        if (watched_members(f, i) == running) {
            i++;
            continue;
        }
        if (wall_clock_seconds() - from > seconds)
            fail_msg("db%d: %d of %d relays kept alive by their watch after %.0f s", i,
                     watched_members(f, i), running, seconds);
        usleep(100 * 1000);
    }
}

/* How many of the databases relay k owns. */
static int
owned_by(const struct fixture *f, const int *owners, int k)
{
    int count = 0;

    for (int i = 0; i < f->run.count; i++)
        count += owners[i] == k;
    return count;
}

/*
 * A relay stopped (SIGSTOP, not killed) mid-burst while holding databases:
 * its watch session stays but queries nothing, so after a lease the other
 * relay counts it gone and takes its databases, publishing the rows that
 * came after the stop and, once their row lease ends, the ones it had
 * claimed. Let go again (SIGCONT) it finishes its slices: no row lost,
 * none appended twice, and the leases settle again between the two.
 */
static void
test_stopped_relay_loses_nothing(void **state)
{
    struct fixture *f = *state;
    int owners[LIST_RUN_MAX_DATABASES], victim, other, rows = f->bc.rows;
    double took, stopped_at;

    make_list(f);
    start(f, 0);
    start(f, 1);
    assert_true(drain(f, 30) >= 0);
    wait_settled(f, owners, 20, "before the stop");
    victim = owned_by(f, owners, 0) >= owned_by(f, owners, 1) ? 0 : 1;
    other = 1 - victim;
    /* mid-burst: the victim's slots hold claimed rows when it stops */
    list_run_enqueue(&f->run, f->run.count, rows + 1, rows + 200);
    usleep(100 * 1000);
    relay_signal(&f->relays[victim], SIGSTOP);
    stopped_at = wall_clock_seconds();
    list_run_enqueue(&f->run, f->run.count, rows + 201, rows + 220);
    took = drain(f, LEASE_SECONDS + 10);
    print_message("stopped: relay %c held %d of %d databases; every row published %.1f s after"
                  " the stop (lease %d s)\n",
                  'a' + victim, owned_by(f, owners, victim), f->run.count,
                  wall_clock_seconds() - stopped_at, LEASE_SECONDS);
    if (took < 0)
        relay_dump_log(&f->relays[other]);
    assert_true(took >= 0);
    relay_signal(&f->relays[victim], SIGCONT);
    usleep(1000 * 1000);
    wait_settled(f, owners, 10, "after SIGCONT");
    assert_true(owned_by(f, owners, victim) > 0); /* it wins its databases back */
    assert_int_equal(list_run_rows_left(&f->run), 0);
    stop(f, victim);
    stop(f, other);
    list_run_check_redis(&f->run, rows + 220, rows + 220);
}

/* The test's own connections again, after a restart of PostgreSQL. */
static void
reconnect(struct fixture *f)
{
    for (int i = 0; i < f->run.count; i++) {
        PQreset(f->run.conns[i]);
        assert_int_equal(PQstatus(f->run.conns[i]), CONNECTION_OK);
    }
    PQreset(f->run.admin);
    assert_int_equal(PQstatus(f->run.admin), CONNECTION_OK);
}

/*
 * Whether the relays leave the idle databases alone: at most 2 sessions
 * opened to them in 8 s, after the statistics of their last writes had
 * 10 s to show (a backend's report is held back up to 10 s).
 */
static void
assert_quiet(const struct fixture *f, const char *when)
{
    long long before;

    usleep(10000 * 1000);
    before = list_run_sessions_opened(&f->run);
    usleep(8000 * 1000);
    print_message("%s: %lld sessions opened to %d idle databases in 8 s\n", when,
                  list_run_sessions_opened(&f->run) - before, f->run.count);
    assert_true(list_run_sessions_opened(&f->run) - before <= 2);
}

/*
 * PostgreSQL crashed (stopped -m immediate: its statistics are reset too)
 * and started again under two relays: every row enqueued after the restart
 * is published, the leases settle, and once they have the idle databases
 * are left alone again (the watches back, keeping the leases).
 */
static void
test_postgres_restart(void **state)
{
    struct fixture *f = *state;
    int owners[LIST_RUN_MAX_DATABASES], rows = f->bc.rows;
    double took, restarted_at;

    make_list(f);
    start(f, 0);
    start(f, 1);
    assert_true(drain(f, 30) >= 0);
    wait_settled(f, owners, 20, "before the restart");
    f->postgres_down = true;
    assert_int_equal(harness_stack("kill-service", "postgres"), 0);
    usleep(1000 * 1000);
    assert_int_equal(harness_stack("start-service", "postgres"), 0);
    f->postgres_down = false;
    restarted_at = wall_clock_seconds();
    reconnect(f);
    list_run_enqueue(&f->run, f->run.count, rows + 1, rows + 20);
    took = drain(f, 15); /* within the databases' retry (1, 2, 4... s) once it is back */
    print_message("restart: every row published %.1f s after PostgreSQL was back\n",
                  wall_clock_seconds() - restarted_at);
    assert_true(took >= 0);
    /* the watches come back (their retry is 5 s) and keep the leases again */
    assert_int_equal(wait_for_value(f->run.admin,
                                    "SELECT count(*) FROM pg_stat_activity"
                                    " WHERE application_name LIKE 'outbox-relay watch %'",
                                    2, 10000),
                     2);
    wait_settled(f, owners, 20, "after the restart");
    assert_quiet(f, "after the restart");
    stop(f, 0);
    stop(f, 1);
    list_run_check_redis(&f->run, rows + 20, rows + 20);
}

/*
 * A third relay joining two while rows flow: it takes the databases it
 * wins from their owners, with no row lost or appended twice, and the
 * leases settle among the three.
 */
static void
test_relay_joining(void **state)
{
    struct fixture *f = *state;
    int owners[LIST_RUN_MAX_DATABASES], rows = f->bc.rows;

    make_list(f);
    start(f, 0);
    start(f, 1);
    assert_true(drain(f, 30) >= 0);
    wait_settled(f, owners, 10, "two relays");
    list_run_enqueue(&f->run, f->run.count, rows + 1, rows + 100);
    start(f, 2);
    for (int burst = 0; burst < 5; burst++) {
        usleep(300 * 1000);
        list_run_enqueue(&f->run, f->run.count, rows + 101 + burst * 20, rows + 120 + burst * 20);
    }
    assert_true(drain(f, 20) >= 0);
    wait_settled(f, owners, 15, "three relays");
    print_message("joining: the relays hold %d, %d and %d of %d databases\n",
                  owned_by(f, owners, 0), owned_by(f, owners, 1), owned_by(f, owners, 2),
                  f->run.count);
    for (int k = 0; k < RELAYS; k++)
        stop(f, k);
    list_run_check_redis(&f->run, rows + 200, rows + 200);
}

/* Relay k's statistics watch session name, as its membership of database 0 records it. */
static void
watch_name_of(const struct fixture *f, int k, char *name, size_t size)
{
    char sql[160];
    PGresult *result;

    snprintf(sql, sizeof(sql),
             "SELECT watch FROM outbox.relay_member WHERE split_part(relay_id, ':', 2) = '%d'",
             (int)f->relays[k].pid);
    result = PQexec(f->run.conns[0], sql);
    assert_int_equal(PQresultStatus(result), PGRES_TUPLES_OK);
    assert_int_equal(PQntuples(result), 1);
    snprintf(name, size, "%s", PQgetvalue(result, 0, 0));
    PQclear(result);
}

/* Ends relay k's statistics watch session (pg_terminate_backend); false when none was. */
static bool
end_watch_session(const struct fixture *f, int k)
{
    char name[64], sql[256];

    watch_name_of(f, k, name, sizeof(name));
    snprintf(sql, sizeof(sql),
             "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
             " WHERE application_name = '%s'",
             name);
    return harness_query_ll(f->run.admin, sql) == 1;
}

/*
 * A relay whose watch session ends while it lives (terminated, a network
 * fault) is taken for gone by the other, which takes its databases; it
 * polls its databases meanwhile, as a member again, and once its watch is
 * back (5 s) the leases settle on the rendezvous winners: churn, no row
 * lost or appended twice.
 */
static void
test_watch_session_ended(void **state)
{
    struct fixture *f = *state;
    int owners[LIST_RUN_MAX_DATABASES], rows = f->bc.rows;

    make_list(f);
    start(f, 0);
    start(f, 1);
    assert_true(drain(f, 30) >= 0);
    wait_settled(f, owners, 20, "before the watch ends");
    list_run_enqueue(&f->run, f->run.count, rows + 1, rows + 100);
    assert_true(end_watch_session(f, 0));
    for (int burst = 0; burst < 5; burst++) {
        usleep(300 * 1000);
        list_run_enqueue(&f->run, f->run.count, rows + 101 + burst * 20, rows + 120 + burst * 20);
    }
    assert_true(drain(f, 15) >= 0);
    assert_int_equal(wait_for_value(f->run.admin,
                                    "SELECT count(*) FROM pg_stat_activity"
                                    " WHERE application_name LIKE 'outbox-relay watch %'",
                                    2, 10000),
                     2);
    wait_settled(f, owners, 15, "after the watch is back");
    stop(f, 0);
    stop(f, 1);
    list_run_check_redis(&f->run, rows + 200, rows + 200);
}

/*
 * A tenant's application, a login of its own with no privilege, names its
 * session after a relay's watch (every role sees every session's
 * application_name) and runs a query now and then: that relay killed with
 * -9 is still gone for the other relay, which takes its databases at once
 * (sql/020: a watch session counts under its relay's login role only).
 */
static void
test_watch_name_taken_by_another_role(void **state)
{
    struct fixture *f = *state;
    int owners[LIST_RUN_MAX_DATABASES], rows = f->bc.rows, victim;
    char name[64], user[48], *url;
    PGconn *tenant;
    double killed_at, took = -1;

    make_list(f);
    start(f, 0);
    start(f, 1);
    assert_true(drain(f, 30) >= 0);
    wait_settled(f, owners, 20, "before the kill");
    wait_watched(f, 10);
    victim = owned_by(f, owners, 0) >= owned_by(f, owners, 1) ? 0 : 1;
    watch_name_of(f, victim, name, sizeof(name));
    snprintf(user, sizeof(user), "tenant_%d", (int)getpid());
    fixture_create_login_role(f->run.admin, user, "");
    url = fixture_url_as(harness_env("OUTBOX_TEST_PG_URL"), user);
    setenv("PGAPPNAME", name, 1);
    tenant = harness_connect(url);
    unsetenv("PGAPPNAME");
    free(url);
    relay_signal(&f->relays[victim], SIGKILL);
    f->running[victim] = false;
    assert_int_equal(harness_wait_exit(f->relays[victim].pid, 5000), 128 + SIGKILL);
    killed_at = wall_clock_seconds();
    list_run_enqueue(&f->run, f->run.count, rows + 1, rows + 20);
    while (wall_clock_seconds() - killed_at < LEASE_SECONDS) {
        PQclear(PQexec(tenant, "SELECT 1")); /* its query_start stays fresh */
        if (list_run_rows_left(&f->run) == 0) {
            took = wall_clock_seconds() - killed_at;
            break;
        }
        usleep(100 * 1000);
    }
    PQfinish(tenant);
    fixture_drop_role(f->run.admin, user);
    print_message("spoofed: relay %c held %d databases; drained %.1f s after its kill\n",
                  'a' + victim, owned_by(f, owners, victim), took);
    if (took < 0) {
        print_leases(f, "spoofed");
        relay_dump_log(&f->relays[1 - victim]);
    }
    assert_true(took >= 0 && took < 5);
    stop(f, 1 - victim);
    list_run_check_redis(&f->run, rows + 20, rows + 20);
}

/*
 * Writes the list with the databases from half on under URLs of other
 * connection options (connect_timeout=9): another PostgreSQL server to the
 * statistics watch, which keeps a connection per server, on the same one.
 */
static void
write_two_servers(const struct fixture *f)
{
    FILE *file = fopen(f->run.list_path, "w");

    assert_non_null(file);
    for (int i = 0; i < f->run.count; i++)
        fprintf(file, "db%d %s%s\n", i, f->run.urls[i],
                i < f->run.count / 2 ? "" : "?connect_timeout=9");
    assert_int_equal(fclose(file), 0);
}

/*
 * Stops (SIGSTOP) the backends in database i of the watch's sessions
 * (watch) or of the relay's other connections, never the test's own; how
 * many.
 */
static int
stop_backends(struct fixture *f, int i, bool watch)
{
    char sql[384];
    PGresult *result;
    int count;

    snprintf(sql, sizeof(sql),
             "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'"
             " AND (application_name LIKE 'outbox-relay watch %%') = %s AND datname = '%s'"
             " AND pid <> %d",
             watch ? "true" : "false", PQdb(f->run.conns[i]), PQbackendPID(f->run.conns[i]));
    result = PQexec(f->run.admin, sql);
    assert_int_equal(PQresultStatus(result), PGRES_TUPLES_OK);
    count = PQntuples(result);
    for (int r = 0; r < count && f->stopped_count < 8; r++) {
        f->stopped[f->stopped_count] = atoi(PQgetvalue(result, r, 0));
        kill(f->stopped[f->stopped_count++], SIGSTOP);
    }
    PQclear(result);
    return count;
}

/*
 * A list on two servers (to the watch: see write_two_servers) and the
 * watch's session on the second stalled (its backend stopped: the server
 * accepts, the kernel acknowledges, nothing answers): rows in the first
 * server's idle databases are published as promptly as before, and the
 * second server's databases, no longer watched, are polled.
 */
static void
test_watch_of_one_server_stalled(void **state)
{
    struct fixture *f = *state;
    int rows = f->bc.rows, half;
    double stalled_at, took;

    f->bc.budget = 8; /* a watch connection per server */
    f->run.count = f->bc.databases;
    half = f->run.count / 2;
    for (int i = 0; i < f->run.count; i++)
        list_run_make_database(&f->run, i);
    write_two_servers(f);
    start(f, 0);
    assert_true(drain(f, 30) >= 0);
    assert_int_equal(wait_for_value(f->run.admin,
                                    "SELECT count(*) FROM pg_stat_activity"
                                    " WHERE application_name LIKE 'outbox-relay watch %'",
                                    2, 10000),
                     2);
    usleep(2000 * 1000); /* the databases idle, each resting until the watch wakes it */
    assert_int_equal(stop_backends(f, half, true), 1);
    stalled_at = wall_clock_seconds();
    usleep(500 * 1000); /* the watch's next look is sent to the stalled backend */
    list_run_enqueue(&f->run, half, rows + 1, rows + 20);
    took = drain(f, 10);
    print_message("stalled: the first server's rows published %.1f s after their commit\n", took);
    /* held up once by the stalled server's look, for its deadline */
    assert_true(took >= 0 && took < SCHEDULER_WATCH_DEADLINE_SECONDS + 1.5);
    for (int i = half; i < f->run.count; i++)
        list_run_enqueue_into(&f->run, i, rows + 1, rows + 20);
    took = drain(f, 30);
    print_message("stalled: the second server's rows published %.1f s after their commit (%.1f s"
                  " into the stall)\n",
                  took, wall_clock_seconds() - stalled_at);
    assert_true(took >= 0 && took < 20);
    stop(f, 0);
    list_run_check_redis(&f->run, rows + 20, rows + 20);
}

/* Whether database i is paused, with no owner, and relay k's /metrics says it is not served. */
static bool
pause_seen(const struct fixture *f, int i, int k)
{
    char *metrics = relay_scrape_metrics(f->ports[k]);
    bool seen = metrics != NULL && !serves(metrics, i) &&
                harness_query_ll(f->run.conns[i], "SELECT count(*) FROM outbox.database_lease"
                                                  " WHERE owner IS NULL") == 1;

    free(metrics);
    return seen;
}

/* Runs outboxctl pause --database (pause) or resume --database on database i. */
static void
pause_database(struct fixture *f, int i, bool pause)
{
    const char *argv[] = {"--database-url", f->run.urls[i], pause ? "pause" : "resume",
                          "--database", NULL};
    char output[2048];

    if (fixture_run_outboxctl(argv, output, sizeof(output)) != 0)
        fail_msg("outboxctl %s --database: %s", argv[2], output);
}

/*
 * outboxctl pause --database on a database its owner just visited (its
 * lease taken a moment before, so the owner's watch-kept lease would not be
 * looked at again before a quarter of a lease): the owner gives the lease
 * up within a quarter of a lease, rows that come after stay ready, and
 * resume --database has them published within a quarter of a lease too.
 */
static void
test_pause_held_database(void **state)
{
    struct fixture *f = *state;
    int owners[LIST_RUN_MAX_DATABASES], rows = f->bc.rows, k, last;
    char name[32];
    double quarter = LEASE_SECONDS / 4.0, paused_at, took;

    f->bc.databases = 4;
    make_list(f);
    last = f->run.count - 1;
    start(f, 0);
    start(f, 1);
    assert_true(drain(f, 30) >= 0);
    wait_settled(f, owners, 20, "before the pause");
    k = owners[last];
    usleep((unsigned int)(quarter * 1e6)); /* the next row's visit calls the lease function */
    list_run_enqueue_into(&f->run, last, rows + 1, rows + 1);
    assert_true(drain(f, 5) >= 0);
    pause_database(f, last, true);
    paused_at = wall_clock_seconds();
    while (!pause_seen(f, last, k) && wall_clock_seconds() - paused_at < quarter + 5)
        usleep(100 * 1000);
    took = wall_clock_seconds() - paused_at;
    print_message("pause: seen by the owner %.1f s after (a quarter of the lease: %.1f s)\n", took,
                  quarter);
    assert_true(took <= quarter + 1);
    list_run_enqueue_into(&f->run, last, rows + 2, rows + 21);
    usleep(2000 * 1000);
    assert_int_equal(list_run_rows_left(&f->run), 20);
    pause_database(f, last, false);
    took = drain(f, quarter + 5);
    print_message("pause: rows published %.1f s after the resume\n", took);
    assert_true(took >= 0 && took <= quarter + 1);
    snprintf(name, sizeof(name), "database=db%d", last);
    assert_int_equal(list_run_log_lines_with(&f->relays[k], "database paused, not served", name),
                     1);
    stop(f, 0);
    stop(f, 1);
    list_run_check_redis(&f->run, rows, rows + 21);
}

/*
 * A row that waits behind its key though the key's head has finished (the
 * head's mark committed while the row's insert was not yet committed, so
 * the mark could not free it) is freed by the sweep of held rows, which
 * runs with the reap, every few seconds, in a visit. In a quiet database
 * the commit that woke the visit came before that sweep was due, and the
 * row waited for the next change of the database: up to the watched
 * database's 15-minute visit. It goes out within a sweep's period.
 */
static void
test_row_held_after_its_head_finished(void **state)
{
    struct fixture *f = *state;
    int rows = f->bc.rows;
    char sql[512];
    double took;

    f->bc.databases = 1;
    make_list(f);
    start(f, 0);
    assert_true(drain(f, 30) >= 0);
    usleep(1000 * 1000); /* the last visit reaped and swept a moment ago */
    snprintf(sql, sizeof(sql),
             "BEGIN;"
             " SELECT outbox.enqueue('" LIST_RUN_QUEUE "', jsonb_build_object('db', '%s', 'n', %d),"
             "                       ordering_key => 'k');"
             " UPDATE outbox.job SET held = true WHERE job_id = (SELECT max(job_id) FROM outbox.job);"
             " COMMIT",
             f->run.ids[0], rows + 1);
    harness_exec(f->run.conns[0], sql);
    took = drain(f, MAINTENANCE_REAP_EVERY_SECONDS + 15);
    print_message("held row: published %.1f s after its commit\n", took);
    assert_true(took >= 0 && took <= MAINTENANCE_REAP_EVERY_SECONDS + 4);
    stop(f, 0);
    list_run_check_redis(&f->run, rows, rows + 1);
}

/*
 * A database taken out of the list while its server does not answer (the
 * backend of the relay's idle connection stopped): the relay gives its
 * lease up over that connection, which waits out the statement deadline,
 * and the other databases' rows go out meanwhile as promptly as before.
 * The release waited under the scheduler's lock: every slot stood still
 * for the deadline (12 s).
 */
static void
test_removed_database_not_answering(void **state)
{
    struct fixture *f = *state;
    int rows = f->bc.rows;
    double took;

    f->bc.databases = 3;
    make_list(f);
    start(f, 0);
    assert_true(drain(f, 30) >= 0);
    /* every database idle, its connection kept, past the visit a quarter of a lease after the
     * lease was taken */
    usleep((unsigned int)(LEASE_SECONDS / 4.0 * 1e6) + 2000 * 1000);
    assert_true(stop_backends(f, 2, false) >= 1);
    list_run_write_list(&f->run, 2, false);
    usleep(1500 * 1000); /* the relay reads the list again within a second */
    list_run_enqueue(&f->run, 2, rows + 1, rows + 20);
    took = drain(f, 20);
    print_message("removed, not answering: the others' rows published %.1f s after their"
                  " commit\n", took);
    assert_true(took >= 0 && took < 2);
    for (int i = 0; i < f->stopped_count; i++)
        kill(f->stopped[i], SIGCONT);
    f->stopped_count = 0;
    for (int tries = 0; tries < 150 &&
                        list_run_log_lines_with(&f->relays[0], "database released", "database=db2") == 0;
         tries++)
        usleep(100 * 1000);
    assert_int_equal(list_run_log_lines_with(&f->relays[0], "database released", "database=db2"), 1);
    stop(f, 0);
    list_run_check_redis(&f->run, rows + 20, rows);
}

/*
 * Two relays, each with a list file of its own naming the same databases;
 * one relay's list then loses the databases that relay holds. It lets them
 * go at once (its lease and its membership: it no longer wins them), and
 * the other relay, whose list keeps them, takes them: the rows committed
 * after the edit are published within seconds (the other relay looks at a
 * database it does not hold whose rows changed at most every
 * SCHEDULER_NOT_HELD_WAKE_SECONDS), not at its next look at a database
 * whose owner's watch keeps its lease (15 minutes).
 */
static void
test_database_left_to_another_list(void **state)
{
    struct fixture *f = *state;
    int owners[LIST_RUN_MAX_DATABASES], rows = f->bc.rows, victim;
    char shared[sizeof(f->run.list_path)], own[sizeof(f->run.list_path)];
    FILE *file;
    double took;

    make_list(f);
    start(f, 1);
    memcpy(shared, f->run.list_path, sizeof(shared));
    assert_true(snprintf(own, sizeof(own), "%.250s.a", shared) < (int)sizeof(own));
    memcpy(f->run.list_path, own, sizeof(own));
    list_run_write_list(&f->run, f->run.count, false);
    start(f, 0); /* relay a reads its own copy of the list */
    assert_true(drain(f, 30) >= 0);
    wait_settled(f, owners, 20, "before the edit");
    victim = owned_by(f, owners, 0) >= owned_by(f, owners, 1) ? 0 : 1;
    assert_non_null(file = fopen(victim == 0 ? own : shared, "w"));
    for (int i = 0; i < f->run.count; i++)
        if (owners[i] != victim)
            fprintf(file, "db%d %s\n", i, f->run.urls[i]);
    assert_int_equal(fclose(file), 0);
    usleep(1500 * 1000); /* each relay looks at its list every second */
    list_run_enqueue(&f->run, f->run.count, rows + 1, rows + 20);
    took = drain(f, 20);
    print_message("left to another list: relay %c let %d databases go; their rows published"
                  " %.1f s after their commit\n",
                  'a' + victim, owned_by(f, owners, victim), took);
    memcpy(f->run.list_path, shared, sizeof(shared));
    unlink(own);
    if (took < 0) {
        print_leases(f, "left to another list");
        relay_dump_log(&f->relays[0]);
        relay_dump_log(&f->relays[1]);
    }
    assert_true(took >= 0 && took < SCHEDULER_NOT_HELD_WAKE_SECONDS + 5);
    stop(f, 0);
    stop(f, 1);
    list_run_check_redis(&f->run, rows + 20, rows + 20);
}

/*
 * Three tenants of eight hold outbox.job locked (LOCK TABLE, in EXCLUSIVE
 * mode so that the test can still count their rows; the relay's claim
 * waits for either mode) in transactions left open, beside a relay of
 * budget 4: a claim there gives up after SCHEDULER_LOCK_TIMEOUT_MS, the
 * database is backed off, and the other tenants' rows are published
 * within seconds, not one lock_timeout (10 s) per locked tenant per slot.
 */
static void
test_tenants_holding_locks(void **state)
{
    struct fixture *f = *state;
    int rows = f->bc.rows, healthy;
    PGconn *lockers[3];
    double took;

    make_list(f);
    healthy = f->run.count - 3;
    start(f, 0);
    assert_true(drain(f, 30) >= 0);
    for (int k = 0; k < 3; k++) {
        lockers[k] = harness_connect(f->run.urls[healthy + k]);
        harness_exec(lockers[k], "BEGIN; LOCK TABLE outbox.job IN EXCLUSIVE MODE");
    }
    for (int round = 0; round < 3; round++) {
        list_run_enqueue(&f->run, healthy, rows + 1 + round * 10, rows + 10 + round * 10);
        took = drain(f, 20);
        print_message("three tenants holding locks: round %d, the others' rows published %.1f s"
                      " after their commit\n", round + 1, took);
        assert_true(took >= 0 && took < 3);
    }
    for (int k = 0; k < 3; k++) { /* the locks end: those tenants' rows flow again */
        PQfinish(lockers[k]);
        list_run_enqueue_into(&f->run, healthy + k, rows + 1, rows + 30);
    }
    took = drain(f, SCHEDULER_RETRY_MAX_SECONDS + 15);
    print_message("locks released: their tenants' rows published %.1f s after their commit\n",
                  took);
    assert_true(took >= 0);
    stop(f, 0);
    list_run_check_redis(&f->run, rows + 30, rows + 30);
}

/*
 * Opens count loopback servers that accept connections and never answer,
 * each listed in file as hungK; their sockets into hung.
 */
static void
list_hung_servers(FILE *file, int *hung, int count)
{
    for (int k = 0; k < count; k++) {
        struct sockaddr_in address = {.sin_family = AF_INET,
                                      .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t length = sizeof(address);

        assert_true((hung[k] = socket(AF_INET, SOCK_STREAM, 0)) >= 0);
        assert_int_equal(bind(hung[k], (struct sockaddr *)&address, sizeof(address)), 0);
        assert_int_equal(listen(hung[k], 64), 0);
        assert_int_equal(getsockname(hung[k], (struct sockaddr *)&address, &length), 0);
        fprintf(file, "hung%d postgresql://postgres@127.0.0.1:%d/hung\n", k,
                ntohs(address.sin_port));
    }
}

/*
 * Ten listed servers that accept connections and never answer (a socket
 * that listens and never accepts: the kernel completes the handshake, the
 * startup packet gets no reply) beside the eight healthy databases, budget
 * 4: each connect to them holds its slot until libpq's connect_timeout, and
 * at most half the slots connect to databases not known to answer at once,
 * so the healthy ones' rows are published within seconds, round after
 * round, not behind a queue of ten-second connects.
 */
static void
test_servers_never_answering(void **state)
{
    struct fixture *f = *state;
    int rows = f->bc.rows, hung[10];
    FILE *file;
    double took;

    make_list(f);
    assert_non_null(file = fopen(f->run.list_path, "a"));
    list_hung_servers(file, hung, 10);
    assert_int_equal(fclose(file), 0);
    start(f, 0);
    for (int round = 0; round < 4; round++) {
        list_run_enqueue(&f->run, f->run.count, rows + 1 + round * 10, rows + 10 + round * 10);
        took = drain(f, 60);
        print_message("ten servers never answering: round %d, the healthy databases' rows"
                      " published %.1f s after their commit\n", round + 1, took);
        if (took < 0 || took >= (round == 0 ? 30 : 4))
            relay_dump_log(&f->relays[0]);
        assert_true(took >= 0 && took < (round == 0 ? 30 : 4));
        sleep(2);
    }
    for (int k = 0; k < 10; k++)
        close(hung[k]);
    stop(f, 0);
    list_run_check_redis(&f->run, rows + 40, rows + 40);
}

/*
 * Forty listed servers that accept connections and never answer, listed
 * before the healthy databases, budget 4: the slots visited the databases
 * never visited in list order, one at a time (half the slots for databases
 * not known to answer), so the healthy ones' first visit waited for forty
 * ten-second connects. Now the servers of databases never visited are
 * probed first, all at once, and those that do not answer within 2 s are
 * backed off before any slot connects to them.
 */
static void
test_servers_never_answering_listed_first(void **state)
{
    struct fixture *f = *state;
    int rows = f->bc.rows, hung[40];
    char healthy[8192];
    size_t length;
    FILE *file;
    double took;

    make_list(f);
    assert_non_null(file = fopen(f->run.list_path, "r"));
    length = fread(healthy, 1, sizeof(healthy), file);
    assert_true(length > 0 && length < sizeof(healthy));
    assert_int_equal(fclose(file), 0);
    assert_non_null(file = fopen(f->run.list_path, "w"));
    list_hung_servers(file, hung, 40);
    assert_int_equal(fwrite(healthy, 1, length, file), length);
    assert_int_equal(fclose(file), 0);
    start(f, 0);
    list_run_enqueue(&f->run, f->run.count, rows + 1, rows + 10);
    took = drain(f, 60);
    print_message("forty servers never answering listed first: the healthy databases' rows"
                  " published %.1f s after their commit\n", took);
    if (took < 0 || took >= 15)
        relay_dump_log(&f->relays[0]);
    assert_true(took >= 0 && took < 15);
    for (int k = 0; k < 40; k++)
        close(hung[k]);
    stop(f, 0);
    list_run_check_redis(&f->run, rows + 10, rows + 10);
}

/* OUTBOX_TEST_FILTER (a cmocka pattern, e.g. "test_pause*") runs only the tests that match. */
/* Calls database i's lease function as relay_id (no watch); whether it holds the lease. */
static bool
take_as(const struct fixture *f, int i, const char *relay_id)
{
    char sql[160];

    snprintf(sql, sizeof(sql), "SELECT count(*) FROM outbox.database_lease_take('%s', %d, NULL)"
                               " WHERE held",
             relay_id, LEASE_SECONDS);
    return harness_query_ll(f->run.conns[i], sql) == 1;
}

/* When a waiting winner last stamped database i's lease, in microseconds of the epoch; 0: never. */
static long long
wanted_at(const struct fixture *f, int i)
{
    return harness_query_ll(f->run.conns[i], "SELECT coalesce((extract(epoch FROM wanted_at)"
                                             " * 1000000)::bigint, 0) FROM outbox.database_lease");
}

/*
 * The relay that wins a database, kept out by a live owner, stamps the
 * lease (sql/027) at most once a quarter lease: a write the owner's watch
 * sees, whatever it missed before, so the owner looks at its lease again
 * and gives the database up. The owner keeps the lease and nothing is
 * stamped while the winner is away; the stamp does not take the lease.
 */
static void
test_waiting_winner_stamps_the_lease(void **state)
{
    struct fixture *f = *state;
    const char *winner, *loser;
    long long first;

    f->run.count = 1;
    list_run_make_database(&f->run, 0);
    loser = harness_query_ll(f->run.conns[0], "SELECT (md5('relay-x:' || current_database())"
                                              " > md5('relay-y:' || current_database()))::int") == 1
                ? "relay-y" : "relay-x";
    winner = strcmp(loser, "relay-x") == 0 ? "relay-y" : "relay-x";
    assert_true(take_as(f, 0, loser)); /* alone: it wins */
    assert_true(take_as(f, 0, loser));
    assert_int_equal(wanted_at(f, 0), 0);
    assert_false(take_as(f, 0, winner)); /* the owner lives on its lease: the winner waits */
    first = wanted_at(f, 0);
    assert_true(first > 0);
    assert_false(take_as(f, 0, winner));
    assert_int_equal(wanted_at(f, 0), first); /* once a quarter lease */
    assert_false(take_as(f, 0, loser));       /* it sees the winner: gives the lease up */
    assert_true(take_as(f, 0, winner));
    assert_int_equal(wanted_at(f, 0), first);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_waiting_winner_stamps_the_lease, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stopped_relay_loses_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_postgres_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_relay_joining, setup, teardown),
        cmocka_unit_test_setup_teardown(test_watch_session_ended, setup, teardown),
        cmocka_unit_test_setup_teardown(test_watch_name_taken_by_another_role, setup, teardown),
        cmocka_unit_test_setup_teardown(test_watch_of_one_server_stalled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pause_held_database, setup, teardown),
        cmocka_unit_test_setup_teardown(test_row_held_after_its_head_finished, setup, teardown),
        cmocka_unit_test_setup_teardown(test_removed_database_not_answering, setup, teardown),
        cmocka_unit_test_setup_teardown(test_database_left_to_another_list, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tenants_holding_locks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_servers_never_answering, setup, teardown),
        cmocka_unit_test_setup_teardown(test_servers_never_answering_listed_first, setup, teardown),
    };

    if (getenv("OUTBOX_TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("OUTBOX_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
