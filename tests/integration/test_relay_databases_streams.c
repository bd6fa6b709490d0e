/*
 * test_relay_databases_streams.c - stream queues (docs/stream.md) of the
 * databases of a list (--databases FILE), served by the relays holding
 * them. What a user relies on: every stream row reaches Redis, each key's
 * rows in the order they were committed, each row under one message id
 * (its database's identity and its job id), with a relay killed with -9
 * mid-run; every relay's connections within --max-db-connections; and a
 * database removed from a relay's list gives its stream partitions back,
 * so the database's own relay takes them within a lease; a busy stream
 * database leaves a row database its turn of the slots. Every wait is
 * bounded; every relay started is killed on every exit path (teardown).
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
#include "redis_consumer.h"
#include "relay_runner.h"

#define RELAYS 2
#define BUDGET 4
#define LEASE_SECONDS 5
#define STREAM_QUEUE "ev"
#define PARTITIONS 4
#define KEYS 5
#define MAX_ROWS 1500

struct fixture {
    struct broker_case bc;
    struct run run;
    struct relay_process relays[RELAYS];
    bool running[RELAYS];
    int ports[RELAYS];
    char names[RELAYS][32];
    int own_relay; /* the relay of one database (--database-url), outside the budget; -1: none */
    long long most_connections[RELAYS]; /* the most seen open at once, each relay */
};

static int
setup(void **state)
{
    static int tests;
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    f->bc = (struct broker_case){"redis", "OUTBOX_TEST_REDIS_URL", 4, 30, 0, BUDGET, "5",
                                 "--stream-prefix", ":"};
    f->run.bc = &f->bc;
    f->run.admin = harness_connect(harness_env("OUTBOX_TEST_PG_URL"));
    snprintf(f->run.list_path, sizeof(f->run.list_path), "%s/databases-streams-%d.list",
             harness_env("OUTBOX_TEST_STACK_DIR"), (int)getpid());
    f->own_relay = -1;
    snprintf(f->run.prefix, sizeof(f->run.prefix), "mdb-streams-%d-%d:", (int)getpid(), tests++);
    for (int k = 0; k < RELAYS; k++) {
        f->ports[k] = harness_free_port();
        snprintf(f->names[k], sizeof(f->names[k]), "mdb-streams-%c", 'a' + k);
    }
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;
    redisContext *redis = stream_consumer_connect(harness_env("OUTBOX_TEST_REDIS_URL"));

    for (int k = 0; k < RELAYS; k++)
        if (f->running[k]) {
            relay_signal(&f->relays[k], SIGKILL);
            harness_wait_exit(f->relays[k].pid, 5000);
        }
    if (redis != NULL) {
        stream_consumer_delete_test_keys(redis, f->run.prefix);
        redisFree(redis);
    }
    list_run_drop(&f->run);
    free(f);
    return 0;
}

/* Makes database i (its row queue's rows too), with a stream queue of PARTITIONS when asked. */
static void
make_database(struct fixture *f, int i, bool stream)
{
    list_run_make_database(&f->run, i);
    if (stream)
        harness_exec(f->run.conns[i], "SELECT outbox.stream_enable('" STREAM_QUEUE "', 4)");
    f->run.count = i + 1;
}

/*
 * Adds keyed stream rows numbered first to last to database i, in
 * transactions of 50: row n has key n % KEYS, so each key's numbers rise.
 */
static void
enqueue_stream(struct fixture *f, int i, int first, int last)
{
    char sql[512];

    for (int from = first; from <= last; from += 50) {
        int to = from + 49 < last ? from + 49 : last;

        snprintf(sql, sizeof(sql),
                 "SELECT count(outbox.enqueue('" STREAM_QUEUE "',"
                 " jsonb_build_object('db', '%s', 'k', g %% %d, 'n', g),"
                 " ordering_key => 'k' || (g %% %d)))"
                 " FROM generate_series(%d, %d) AS g",
                 f->run.ids[i], KEYS, KEYS, from, to);
        harness_exec(f->run.conns[i], sql);
    }
}

/* Writes a list of the databases [first, last) to path. */
static void
write_list(const struct fixture *f, const char *path, int first, int last)
{
    FILE *file = fopen(path, "w");

    assert_non_null(file);
    for (int i = first; i < last; i++)
        fprintf(file, "db%d %s\n", i, f->run.urls[i]);
    assert_int_equal(fclose(file), 0);
}

/* Starts relay k over the run's list. */
static void
start(struct fixture *f, int k)
{
    list_run_start_relay(&f->run, &f->relays[k], f->names[k], f->ports[k]);
    f->running[k] = true;
}

/* The value of the gauge outbox_database_connections in relay k's /metrics; -1 when unread. */
static long long
metrics_connections(const struct fixture *f, int k)
{
    char *metrics = relay_scrape_metrics(f->ports[k]);
    const char *line = metrics != NULL ? strstr(metrics, "\noutbox_database_connections{") : NULL;
    const char *value = line != NULL ? strstr(line, "} ") : NULL;
    long long open = value != NULL ? strtoll(value + 2, NULL, 10) : -1;

    free(metrics);
    return open;
}

/*
 * Each running relay's connections, as the relay counts them (its slots'
 * and its statistics watch's) and as PostgreSQL lists them under its name
 * (the slots' only: a budget of 4 keeps one for the watch): within the budget.
 */
static void
assert_within_budget(struct fixture *f)
{
    for (int k = 0; k < RELAYS; k++) {
        long long sessions, counted;

        if (!f->running[k] || k == f->own_relay)
            continue;
        sessions = list_run_connections_of(f->run.admin, f->names[k]);
        counted = metrics_connections(f, k);
        if (sessions > f->most_connections[k])
            f->most_connections[k] = sessions;
        if (counted > f->most_connections[k])
            f->most_connections[k] = counted;
        if (sessions > BUDGET - 1 || counted > BUDGET)
            fail_msg("relay %c: %lld sessions of its slots, %lld counted open, budget %d", 'a' + k,
                     sessions, counted, BUDGET);
    }
}

/* Stream rows after their partition's cursor in database i (0: every one published). */
static long long
stream_left(const struct fixture *f, int i)
{
    return harness_query_ll(f->run.conns[i],
                            "SELECT count(*) FROM outbox.job AS j JOIN outbox.stream_cursor AS c"
                            " ON c.queue = j.queue AND c.partition = j.stream_partition"
                            " WHERE j.state = 'stream' AND (j.xid, j.job_id)"
                            "  > (c.cursor_xid, c.cursor_job_id)");
}

/*
 * Waits up to seconds for every stream row of the first streams databases
 * and every row of the row queue to be published, checking the budget all
 * along; the seconds it took, -1 when not.
 */
static double
drain(struct fixture *f, int streams, double seconds)
{
    double from = wall_clock_seconds();

    for (;;) {
        long long left = 0;

        for (int i = 0; i < f->run.count; i++)
            left +=
                harness_query_ll(f->run.conns[i], "SELECT count(*) FROM outbox.job"
                                                  " WHERE state NOT IN ('succeeded', 'stream')");
        for (int i = 0; i < streams; i++)
            left += stream_left(f, i);
        if (left == 0)
            return wall_clock_seconds() - from;
        if (wall_clock_seconds() - from > seconds) {
            print_message("%lld rows left after %.0f s\n", left, seconds);
            return -1;
        }
        assert_within_budget(f);
        usleep(100 * 1000);
    }
}

/* What check_streams follows for one database: each row's message id, each key's last number. */
struct seen_rows {
    char *message_ids[MAX_ROWS + 1];
    int last[KEYS];
};

/* Records one Redis entry of the stream queue; fails the test on a broken promise. */
static void
check_entry(const struct fixture *f, struct seen_rows *seen, int streams,
            const struct stream_consumer_entry *entry, long long *duplicates)
{
    char db[64] = "";
    const char *uid;
    int k = -1, n = 0, i;

    if (sscanf(entry->payload, "{\"k\": %d, \"n\": %d, \"db\": \"%63[^\"]\"}", &k, &n, db) != 3)
        fail_msg("unexpected payload %s", entry->payload);
    for (i = 0; i < streams && strcmp(f->run.ids[i], db) != 0; i++)
        ;
    assert_true(i < streams && k >= 0 && k < KEYS && n >= 1 && n <= MAX_ROWS);
    /* the message id: the row's own database's id and the row's uuid */
    uid = entry->message_id != NULL ? entry->message_id + strlen(db) + 1 : NULL;
    if (uid == NULL || strncmp(entry->message_id, db, strlen(db)) != 0 ||
        entry->message_id[strlen(db)] != ':' || strlen(uid) != 36 ||
        strspn(uid, "0123456789abcdef-") != 36 || uid[8] != '-' || uid[13] != '-')
        fail_msg("row %d of %s (job %lld) published as %s", n, db, (long long)entry->job_id,
                 entry->message_id != NULL ? entry->message_id : "(none)");
    if (seen[i].message_ids[n] != NULL) {
        if (strcmp(seen[i].message_ids[n], entry->message_id) != 0)
            fail_msg("row %d of %s published as %s and as %s", n, db, seen[i].message_ids[n],
                     entry->message_id);
        (*duplicates)++; /* a batch in flight at the kill, published again: same id */
        return;
    }
    /* a key's rows in their order: each row first seen after the key's earlier ones */
    if (n <= seen[i].last[k])
        fail_msg("key k%d of %s: row %d published after row %d", k, db, n, seen[i].last[k]);
    seen[i].last[k] = n;
    seen[i].message_ids[n] = strdup(entry->message_id);
}

/*
 * Reads the stream queue's Redis stream: every row 1..rows of each of the
 * first streams databases, in its key's order, under its message id.
 * Returns the entries published twice.
 */
static long long
check_streams(const struct fixture *f, int streams, int rows)
{
    redisContext *redis = stream_consumer_connect(harness_env("OUTBOX_TEST_REDIS_URL"));
    struct stream_consumer_stream stream = {0};
    struct seen_rows *seen = calloc((size_t)streams, sizeof(*seen));
    char key[128];
    long long duplicates = 0;

    assert_non_null(redis);
    assert_non_null(seen);
    snprintf(key, sizeof(key), "%s" STREAM_QUEUE, f->run.prefix);
    assert_int_equal(stream_consumer_read_stream(redis, key, &stream), 0);
    for (size_t e = 0; e < stream.count; e++)
        check_entry(f, seen, streams, &stream.entries[e], &duplicates);
    for (int i = 0; i < streams; i++)
        for (int n = 1; n <= rows; n++) {
            if (seen[i].message_ids[n] == NULL)
                fail_msg("stream row %d of db%d never published", n, i);
            free(seen[i].message_ids[n]);
        }
    print_message("stream: %zu entries for %d rows, %lld published again\n", stream.count,
                  streams * rows, duplicates);
    free(seen);
    stream_consumer_stream_clear(&stream);
    redisFree(redis);
    return duplicates;
}

/* The running relay that owner (a worker prefix or a name made from one) names; -1: none. */
static int
relay_of(const struct fixture *f, const char *owner)
{
    return list_run_relay_of(f->relays, f->running, RELAYS, owner);
}

/* The running relay holding every partition of database i with a live lease; -1 when none. */
static int
partitions_owner(const struct fixture *f, int i)
{
    PGresult *result =
        PQexec(f->run.conns[i], "SELECT min(owner), count(DISTINCT owner), count(*)"
                                " FROM outbox.stream_cursor WHERE lease_until > clock_timestamp()");
    int k = -1;

    if (PQresultStatus(result) == PGRES_TUPLES_OK && PQntuples(result) == 1 &&
        atoi(PQgetvalue(result, 0, 1)) == 1 && atoi(PQgetvalue(result, 0, 2)) == PARTITIONS)
        k = relay_of(f, PQgetvalue(result, 0, 0));
    PQclear(result);
    return k;
}

/*
 * Three databases with a keyed stream queue and a fourth with rows only,
 * two relays of budget 4 sharing the list, rows flowing; the relay holding
 * most stream partitions is killed with -9 mid-run. The other takes its
 * databases and, once their leases end, its partitions: every stream row
 * published, each key in order, each row under its one message id, the
 * duplicates no more than the batches in flight; the row queue's rows
 * each once; every relay within its budget all along.
 */
static void
test_streams_through_a_kill(void **state)
{
    struct fixture *f = *state;
    int streams = 3, held[RELAYS] = {0}, victim = 0, rows = 1400;
    double took, from;

    for (int i = 0; i < 4; i++)
        make_database(f, i, i < streams);
    for (int i = 0; i < streams; i++)
        enqueue_stream(f, i, 1, 200);
    list_run_write_list(&f->run, f->run.count, false);
    start(f, 0);
    start(f, 1);
    for (int round = 0; round < 10; round++) {
        assert_within_budget(f);
        usleep(200 * 1000);
    }
    for (int i = 0; i < streams; i++)
        enqueue_stream(f, i, 201, 1200);
    /* mid-run: killed while it holds partitions, its batches in flight */
    from = wall_clock_seconds();
    while (held[0] + held[1] == 0 && wall_clock_seconds() - from < 30) { /* a loaded host */
        for (int i = 0; i < streams; i++) {
            int k = partitions_owner(f, i);

            held[k >= 0 ? k : 0] += k >= 0;
        }
        usleep(5 * 1000);
    }
    victim = held[1] > held[0] ? 1 : 0;
    assert_true(held[victim] > 0);
    relay_signal(&f->relays[victim], SIGKILL);
    harness_wait_exit(f->relays[victim].pid, 5000);
    f->running[victim] = false;
    for (int i = 0; i < streams; i++)
        enqueue_stream(f, i, 1201, rows);
    took = drain(f, streams, LEASE_SECONDS + 30);
    print_message("relay %c killed holding the partitions of %d of %d stream databases; every row"
                  " published %.1f s later (lease %d s); at most %lld and %lld connections open\n",
                  'a' + victim, held[victim], streams, took, LEASE_SECONDS, f->most_connections[0],
                  f->most_connections[1]);
    if (took < 0) {
        relay_dump_log(&f->relays[1 - victim]);
        fail_msg("the stream rows were not all published");
    }
    /* the batches in flight at the kill at most, published again */
    assert_true(check_streams(f, streams, rows) <= (long long)streams * PARTITIONS * 20);
    list_run_check_redis(&f->run, f->bc.rows, f->bc.rows);
    relay_signal(&f->relays[1 - victim], SIGTERM);
    f->running[1 - victim] = false;
    assert_int_equal(relay_wait(&f->relays[1 - victim], 15000), 0);
}

/* Partitions of database i relay k holds with a live lease. */
static int
partitions_of(const struct fixture *f, int i, int k)
{
    PGresult *result = PQexec(f->run.conns[i], "SELECT owner FROM outbox.stream_cursor"
                                               " WHERE lease_until > clock_timestamp()");
    int count = 0;

    for (int r = 0; PQresultStatus(result) == PGRES_TUPLES_OK && r < PQntuples(result); r++)
        count += relay_of(f, PQgetvalue(result, r, 0)) == k;
    PQclear(result);
    return count;
}

/*
 * Relay a serves a list of three stream databases; relay b is db0's own
 * relay (--database-url), publishing its streams beside a. db0's later
 * rows wait behind a transaction left open (the horizon), so each keeps
 * the partitions it holds. db0 removed from a's list, a gives its
 * partitions back (and the database's lease) at once: b holds every one
 * within a lease, and publishes the rows once the transaction ends. a
 * stopped gives the others back.
 */
static void
test_removed_database_gives_partitions_back(void **state)
{
    struct fixture *f = *state;
    int streams = 3;
    double from, took = -1, freed = -1;
    PGconn *horizon;
    char metrics[32];
    const char *extra[] = {"--stream-prefix", f->run.prefix, "--lease", "5",
                           "--metrics-addr",  metrics,       NULL};

    for (int i = 0; i < streams; i++) {
        make_database(f, i, true);
        enqueue_stream(f, i, 1, 100);
    }
    write_list(f, f->run.list_path, 0, streams);
    start(f, 0);
    snprintf(metrics, sizeof(metrics), "127.0.0.1:%d", f->ports[1]);
    setenv("PGAPPNAME", f->names[1], 1);
    relay_start_process(&f->relays[1], f->run.urls[0], harness_env("OUTBOX_TEST_REDIS_URL"), extra);
    unsetenv("PGAPPNAME");
    f->running[1] = true;
    f->own_relay = 1;
    assert_true(drain(f, streams, 30) >= 0);
    horizon = harness_connect(f->run.urls[0]);
    harness_exec(horizon, "BEGIN");
    harness_exec(horizon, "SELECT pg_current_xact_id()");
    for (int i = 0; i < streams; i++)
        enqueue_stream(f, i, 101, 150);
    from = wall_clock_seconds();
    while (partitions_of(f, 0, 0) == 0 && wall_clock_seconds() - from < 10)
        usleep(50 * 1000);
    print_message("relay a holds %d of db0's partitions, relay b %d\n", partitions_of(f, 0, 0),
                  partitions_of(f, 0, 1));
    assert_true(partitions_of(f, 0, 0) > 0);
    write_list(f, f->run.list_path, 1, streams);
    from = wall_clock_seconds();
    while (wall_clock_seconds() - from < 3 * LEASE_SECONDS && took < 0) {
        if (freed < 0 && partitions_of(f, 0, 0) == 0)
            freed = wall_clock_seconds() - from;
        if (partitions_of(f, 0, 1) == PARTITIONS)
            took = wall_clock_seconds() - from;
        assert_within_budget(f);
        usleep(50 * 1000);
    }
    print_message("db0 removed from relay a's list: its partitions given back %.1f s later, all"
                  " held by relay b %.1f s later (lease %d s)\n",
                  freed, took, LEASE_SECONDS);
    if (freed < 0 || freed >= LEASE_SECONDS || took < 0 || took >= LEASE_SECONDS) {
        relay_dump_log(&f->relays[0]);
        relay_dump_log(&f->relays[1]);
        fail_msg("db0's partitions not taken over within a lease");
    }
    assert_int_equal(
        list_run_log_lines_with(&f->relays[0], "stream partitions given back", "database=db0"), 1);
    assert_true(stream_left(f, 0) > 0); /* the horizon held them: relay b publishes them */
    harness_exec(horizon, "ROLLBACK");
    PQfinish(horizon);
    assert_true(drain(f, streams, 20) >= 0);
    relay_signal(&f->relays[0], SIGTERM);
    f->running[0] = false;
    assert_int_equal(relay_wait(&f->relays[0], 15000), 0);
    for (int i = 1; i < streams; i++)
        assert_int_equal(harness_query_ll(f->run.conns[i],
                                          "SELECT count(*) FROM outbox.stream_cursor"
                                          " WHERE lease_until > clock_timestamp()"),
                         0);
    check_streams(f, streams, 150);
}

/*
 * A busy stream database shares the slots as a busy row database does: one
 * relay of budget 1 (one slot, which the two databases take in turn; no
 * watch: polled), db0 draining a backlog of 300 000 keyed stream rows, db1
 * a row database: each row put in db1 while db0's backlog is still there
 * is published within its poll (1 s at most) and one slice of db0
 * (0.25 s): the stream's turn ends with its slice. Rows are put in until
 * the backlog is gone (however fast this host drains it), at least two of
 * them beside it.
 */
static void
test_busy_stream_shares_the_slots(void **state)
{
    struct fixture *f = *state;
    double worst = 0;
    int beside = 0;

    f->bc.budget = 1;
    f->bc.rows = 1;
    make_database(f, 0, true);
    make_database(f, 1, false);
    harness_exec(f->run.conns[0],
                 "SELECT count(outbox.enqueue('" STREAM_QUEUE "', jsonb_build_object('n', g),"
                 " ordering_key => 'k' || (g % 100))) FROM generate_series(1, 300000) AS g");
    list_run_write_list(&f->run, f->run.count, false);
    start(f, 0);
    /* started: db1's first row published, db0's backlog being published */
    assert_int_equal(wait_for_value(f->run.conns[1],
                                    "SELECT count(*) FROM outbox.job WHERE state <> 'succeeded'", 0,
                                    10000),
                     0);
    for (int n = 0; n < 20 && stream_left(f, 0) > 0; n++) {
        double from = wall_clock_seconds(), took;

        list_run_enqueue_into(&f->run, 1, n + 2, n + 2);
        assert_int_equal(
            wait_for_value(f->run.conns[1],
                           "SELECT count(*) FROM outbox.job WHERE state <> 'succeeded'", 0, 5000),
            0);
        took = wall_clock_seconds() - from;
        if (stream_left(f, 0) == 0)
            break; /* the backlog may have gone before this row: not counted */
        print_message("row %d: %.2f s\n", n + 2, took);
        worst = took > worst ? took : worst;
        beside++;
    }
    print_message("a row database's rows beside a stream backlog: %d rows, at most %.2f s each\n",
                  beside, worst);
    assert_true(beside >= 2);              /* the backlog was there all along */
    assert_true(worst < 1.0 + 0.25 + 0.2); /* the poll, a slice, the test's look */
}

/* OUTBOX_TEST_FILTER (a cmocka pattern, e.g. "test_removed*") runs only the tests that match. */
int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_streams_through_a_kill, setup, teardown),
        cmocka_unit_test_setup_teardown(test_removed_database_gives_partitions_back, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_busy_stream_shares_the_slots, setup, teardown),
    };

    if (getenv("OUTBOX_TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("OUTBOX_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
