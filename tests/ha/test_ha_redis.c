/*
 * test_ha_redis.c - outbox-relay against Redis Sentinel and Redis Cluster.
 *
 * Each test starts its own deployment with tests/harness/redis_ha.sh (a
 * primary, a replica and three sentinels; or three masters with a replica
 * each) in a directory under OUTBOX_TEST_STACK_DIR, and stops it on the way
 * out. PostgreSQL comes from the stack tests/run.sh starts. What a user
 * relies on: every committed row ends succeeded, and every job is in its
 * stream exactly once, across a failover (with the default --redis-wait 1)
 * and across a slot moving between cluster masters while rows flow.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "keyslot.h"
#include "redis_consumer.h"
#include "relay_runner.h"

#define HA_PASSWORD "outbox-test-secret"
#define SENTINEL_ROWS 30000
#define CLUSTER_QUEUES 50
#define CLUSTER_ROWS_PER_QUEUE 200
/* a failover or a slot move spends attempts: rows get room for them */
#define MAX_ATTEMPTS 1000

struct fixture {
    char dir[512]; /* the deployment's directory */
    char *url;     /* the test's database */
    PGconn *conn;
};

static int deployment_counter;

static void
sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static double
now_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Runs tests/harness/redis_ha.sh COMMAND DIR [NAME]; its exit status. */
static int
ha_script(const char *command, const char *dir, const char *name)
{
    char script[1024];
    pid_t pid;
    int status;

    snprintf(script, sizeof(script), "%s/tests/harness/redis_ha.sh",
             harness_env("OUTBOX_SOURCE_DIR"));
    fflush(NULL);
    pid = fork();
    if (pid == -1)
        fail_msg("unable to fork: %s", strerror(errno));
    if (pid == 0) {
        execl(script, script, command, dir, name, (char *)NULL);
        _exit(127);
    }
    while (waitpid(pid, &status, 0) == -1)
        if (errno != EINTR)
            fail_msg("unable to wait for redis_ha.sh: %s", strerror(errno));
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/* The first line of DIR/NAME as a number (a port or a pid); 0 when missing. */
static long
read_number(const char *dir, const char *name)
{
    char path[700], line[64] = "";
    FILE *file;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    file = fopen(path, "r");
    if (file == NULL)
        return 0;
    if (fgets(line, sizeof(line), file) == NULL)
        line[0] = '\0';
    fclose(file);
    return atol(line);
}

/* A redis:// URL for one server of the deployment. */
static void
node_url(char *out, size_t size, int port)
{
    snprintf(out, size, "redis://:%s@127.0.0.1:%d/0", HA_PASSWORD, port);
}

/* Runs a command given as NULL-terminated strings; the reply (never NULL). */
static redisReply *
node_command(redisContext *context, const char *first, ...)
{
    const char *argv[64];
    int argc = 0;
    va_list ap;
    redisReply *reply;

    va_start(ap, first);
    for (const char *arg = first; arg != NULL && argc < 64; arg = va_arg(ap, const char *))
        argv[argc++] = arg;
    va_end(ap);
    reply = stream_consumer_command(context, argc, argv);
    if (reply == NULL)
        fail_msg("redis command %s: no reply", first);
    return reply;
}

static redisContext *
connect_port(int port)
{
    char url[256];
    redisContext *context;

    node_url(url, sizeof(url), port);
    context = stream_consumer_connect(url);
    if (context == NULL)
        fail_msg("unable to connect to redis on port %d", port);
    return context;
}

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    snprintf(f->dir, sizeof(f->dir), "%s/redis-ha-%d-%d", harness_env("OUTBOX_TEST_STACK_DIR"),
             (int)getpid(), deployment_counter++);
    f->url = harness_database_new();
    f->conn = harness_connect(f->url);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    ha_script("stop", f->dir, NULL);
    PQfinish(f->conn);
    harness_database_drop(f->url);
    free(f);
    return 0;
}

/* ---- a producer that keeps committing rows ------------------------------------------ */

struct producer {
    const char *database_url;
    const char *queue;
    int total;       /* rows to commit */
    int per_commit;  /* rows per transaction */
    int pause_ms;    /* between transactions */
    atomic_int done; /* rows committed so far */
    atomic_bool stop; /* set to end before total */
    char error[256]; /* empty unless a commit failed */
    pthread_t thread;
};

static void *
produce(void *arg)
{
    struct producer *p = arg;
    PGconn *conn = PQconnectdb(p->database_url);
    char sql[512];

    if (PQstatus(conn) != CONNECTION_OK) {
        snprintf(p->error, sizeof(p->error), "%s", PQerrorMessage(conn));
        PQfinish(conn);
        return NULL;
    }
    while (atomic_load(&p->done) < p->total && !atomic_load(&p->stop)) {
        int n = p->total - atomic_load(&p->done);
        PGresult *result;

        if (n > p->per_commit)
            n = p->per_commit;
        snprintf(sql, sizeof(sql),
                 "SELECT count(outbox.enqueue('%s', jsonb_build_object('n', g),"
                 " max_attempts => %d)) FROM generate_series(1, %d) AS g",
                 p->queue, MAX_ATTEMPTS, n);
        result = PQexec(conn, sql);
        if (PQresultStatus(result) != PGRES_TUPLES_OK) {
            snprintf(p->error, sizeof(p->error), "%s", PQerrorMessage(conn));
            PQclear(result);
            break;
        }
        PQclear(result);
        atomic_fetch_add(&p->done, n);
        sleep_ms(p->pause_ms);
    }
    PQfinish(conn);
    return NULL;
}

static void
producer_start(struct producer *p)
{
    assert_int_equal(pthread_create(&p->thread, NULL, produce, p), 0);
}

static void
producer_join(struct producer *p)
{
    pthread_join(p->thread, NULL);
    if (p->error[0] != '\0')
        fail_msg("producer: %s", p->error);
}

/* Commits count rows into queue in one transaction. */
static void
enqueue_many(PGconn *conn, const char *queue, int count)
{
    char sql[512];

    snprintf(sql, sizeof(sql),
             "SELECT count(outbox.enqueue('%s', jsonb_build_object('n', g), max_attempts => %d))"
             " FROM generate_series(1, %d) AS g",
             queue, MAX_ATTEMPTS, count);
    assert_int_equal(harness_query_ll(conn, sql), count);
}

/* ---- checks on streams ------------------------------------------------------------- */

/*
 * Counts, for jobs 1..max_job, how often each appears in the entries:
 * *missing jobs never appear, *duplicates appear more than once (extra
 * entries counted). counts has max_job + 1 slots, zeroed by the caller, and
 * may gather several streams.
 */
static void
count_jobs(const struct stream_consumer_stream *entries, int *counts, long long max_job)
{
    for (size_t i = 0; i < entries->count; i++) {
        long long job = entries->entries[i].job_id;

        if (job < 1 || job > max_job)
            fail_msg("stream entry %s has job_id %lld, not a row of this test",
                     entries->entries[i].id, job);
        counts[job]++;
    }
}

static void
summarize(const int *counts, long long max_job, long long *missing, long long *duplicates)
{
    *missing = 0;
    *duplicates = 0;
    for (long long job = 1; job <= max_job; job++) {
        if (counts[job] == 0)
            (*missing)++;
        else if (counts[job] > 1)
            *duplicates += counts[job] - 1;
    }
}

/* ---- Sentinel ---------------------------------------------------------------------- */

/* The sentinel URL of the deployment in dir (from its env file). */
static void
read_sentinel_url(const char *dir, char *url, size_t size)
{
    char path[700], line[1024], format[64];
    FILE *env;

    snprintf(path, sizeof(path), "%s/env", dir);
    env = fopen(path, "r");
    assert_non_null(env);
    url[0] = '\0';
    snprintf(format, sizeof(format), "export OUTBOX_TEST_SENTINEL_URL='%%%zu[^']'", size - 1);
    while (fgets(line, sizeof(line), env) != NULL)
        if (sscanf(line, format, url) == 1)
            break;
    fclose(env);
    assert_true(strncmp(url, "redis+sentinel://", 17) == 0);
}

/* The port the sentinel on port names as the primary; 0 when it names none. */
static int
sentinel_primary_port(int sentinel_port)
{
    redisContext *context = connect_port(sentinel_port);
    redisReply *reply =
        node_command(context, "SENTINEL", "get-master-addr-by-name", "outbox", (const char *)NULL);
    int port = 0;

    if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 2)
        port = atoi(reply->element[1]->str);
    freeReplyObject(reply);
    redisFree(context);
    return port;
}

/*
 * Whether every sentinel of the deployment in dir names port as the primary.
 * Nothing is persisted here, so the old primary comes back empty: a sentinel
 * still holding the old configuration when it does would turn the promoted
 * replica back into its replica and empty it (Redis's own hazard of a
 * restart without persistence, which no client can undo).
 */
static bool
sentinels_agree(const char *dir, int port)
{
    char name[32];

    for (int i = 1; i <= 3; i++) {
        snprintf(name, sizeof(name), "sentinel%d.port", i);
        if (sentinel_primary_port((int)read_number(dir, name)) != port)
            return false;
    }
    return true;
}

/* Prints the first and last job missing from counts, if any, and the sentinels' events. */
static void
print_missing_range(const char *dir, const int *counts, long long max_job)
{
    long long first = 0, last = 0;

    for (long long job = 1; job <= max_job; job++)
        if (counts[job] == 0) {
            if (first == 0)
                first = job;
            last = job;
        }
    if (first == 0)
        return;
    print_message("missing jobs between %lld and %lld; the sentinels' events:\n", first, last);
    for (int i = 1; i <= 3; i++) {
        char path[700], line[512];
        FILE *log;

        snprintf(path, sizeof(path), "%s/sentinel%d.log", dir, i);
        if ((log = fopen(path, "r")) == NULL)
            continue;
        while (fgets(line, sizeof(line), log) != NULL)
            if (strstr(line, " +") != NULL || strstr(line, " -") != NULL)
                print_message("sentinel%d: %s", i, line);
        fclose(log);
    }
}

/*
 * 30 000 rows committed over several seconds while the relay publishes
 * through the sentinels; the primary is killed with SIGKILL a third of the
 * way in and started again once every sentinel names the replica (it comes back as a
 * replica). Every row ends succeeded; the stream on the new primary is
 * checked job by job. With wait_replicas 1 no job may be missing or
 * appended twice; without, the losses and duplicates asynchronous
 * replication allows are counted and printed.
 */
static void
run_sentinel_failover(struct fixture *f, const char *wait_replicas)
{
    struct producer producer = {.database_url = f->url, .queue = "ha", .total = SENTINEL_ROWS,
                                .per_commit = 100, .pause_ms = 10};
    const char *with_wait[] = {"--redis-wait", wait_replicas, "--retry-base", "100ms",
                               "--retry-max", "1s", "--batch-size", "200", NULL};
    const char *const *extra = wait_replicas != NULL ? with_wait : with_wait + 2;
    struct stream_consumer_stream entries;
    struct relay_process relay;
    char sentinel_url[512];
    int primary_port, replica_port, sentinel_port, *counts;
    long long succeeded, missing, duplicates;
    double started;
    pid_t primary_pid;
    redisContext *context;

    assert_int_equal(ha_script("sentinel", f->dir, NULL), 0);
    primary_port = (int)read_number(f->dir, "primary.port");
    replica_port = (int)read_number(f->dir, "replica.port");
    sentinel_port = (int)read_number(f->dir, "sentinel1.port");
    read_sentinel_url(f->dir, sentinel_url, sizeof(sentinel_url));
    assert_int_equal(sentinel_primary_port(sentinel_port), primary_port);

    relay_start_process(&relay, f->url, sentinel_url, extra);
    producer_start(&producer);
    while (atomic_load(&producer.done) < SENTINEL_ROWS / 3 && producer.error[0] == '\0')
        sleep_ms(20);
    assert_true(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                          " WHERE state = 'succeeded'") > 0);
    primary_pid = (pid_t)read_number(f->dir, "primary.pid");
    assert_true(primary_pid > 0);
    assert_int_equal(kill(primary_pid, SIGKILL), 0);

    /* the sentinels promote the replica; then the old primary comes back, as a replica */
    started = now_seconds();
    while (!sentinels_agree(f->dir, replica_port)) {
        if (now_seconds() - started > 60)
            fail_msg("no failover within 60 s");
        sleep_ms(100);
    }
    print_message("failover after %.1f s\n", now_seconds() - started);
    assert_int_equal(ha_script("start-node", f->dir, "primary"), 0);
    producer_join(&producer);

    succeeded = wait_for_value(f->conn, "SELECT count(*) FROM outbox.job WHERE state = 'succeeded'",
                               SENTINEL_ROWS, 120000);
    if (succeeded != SENTINEL_ROWS)
        relay_dump_log(&relay);
    assert_int_equal(succeeded, SENTINEL_ROWS);
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 30000), 0);

    /* the stream on the new primary, job by job */
    context = connect_port(replica_port);
    assert_int_equal(stream_consumer_read_stream(context, "ha", &entries), 0);
    counts = calloc(SENTINEL_ROWS + 1, sizeof(*counts));
    assert_non_null(counts);
    count_jobs(&entries, counts, SENTINEL_ROWS);
    summarize(counts, SENTINEL_ROWS, &missing, &duplicates);
    print_message("--redis-wait %s: %zu entries for %d jobs, %lld missing, %lld appended twice\n",
                  wait_replicas ? wait_replicas : "default", entries.count, SENTINEL_ROWS, missing,
                  duplicates);
    print_missing_range(f->dir, counts, SENTINEL_ROWS);
    if (wait_replicas == NULL || strcmp(wait_replicas, "0") != 0) {
        assert_int_equal(missing, 0);
        assert_int_equal(duplicates, 0);
        assert_int_equal(entries.count, SENTINEL_ROWS);
    }
    free(counts);
    stream_consumer_stream_clear(&entries);
    redisFree(context);
}

/* The default (--redis-wait 1 with Sentinel) keeps the promise: nothing lost, nothing twice. */
static void
test_sentinel_failover_by_default_loses_nothing_and_appends_once(void **state)
{
    run_sentinel_failover(*state, NULL);
}

static void
test_sentinel_failover_without_wait_counts_duplicates(void **state)
{
    run_sentinel_failover(*state, "0");
}

/*
 * A switchover (SENTINEL FAILOVER): the old primary stays up and becomes a
 * replica, so the relay's connection to it survives and its next calls are
 * answered -READONLY. The relay must ask the sentinels again and carry on
 * with the new primary: every row succeeded. Between the replica's
 * promotion and the old primary's demotion the old primary still accepts
 * appends, which its resync then discards: with wait_replicas 1 those rows
 * are not marked (the old primary has no replica left) and every job is in
 * the new primary's stream once; without, the loss is counted and printed.
 */
static void
run_sentinel_switchover(struct fixture *f, const char *wait_replicas)
{
    struct producer producer = {.database_url = f->url, .queue = "ha", .total = 5000,
                                .per_commit = 50, .pause_ms = 20};
    const char *with_wait[] = {"--redis-wait", wait_replicas, "--retry-base", "100ms",
                               "--retry-max", "1s", "--batch-size", "200", NULL};
    const char *const *extra = wait_replicas != NULL ? with_wait : with_wait + 2;
    struct stream_consumer_stream entries;
    struct relay_process relay;
    char url[512];
    int replica_port, sentinel_port, *counts;
    long long succeeded, missing, duplicates;
    double started;
    redisContext *context;
    redisReply *reply;

    assert_int_equal(ha_script("sentinel", f->dir, NULL), 0);
    replica_port = (int)read_number(f->dir, "replica.port");
    sentinel_port = (int)read_number(f->dir, "sentinel1.port");
    read_sentinel_url(f->dir, url, sizeof(url));
    relay_start_process(&relay, f->url, url, extra);
    producer_start(&producer);
    while (atomic_load(&producer.done) < 1500 && producer.error[0] == '\0')
        sleep_ms(20);
    context = connect_port(sentinel_port);
    reply = node_command(context, "SENTINEL", "FAILOVER", "outbox", (const char *)NULL);
    if (reply->type == REDIS_REPLY_ERROR)
        fail_msg("SENTINEL FAILOVER: %s", reply->str);
    freeReplyObject(reply);
    redisFree(context);
    started = now_seconds();
    while (sentinel_primary_port(sentinel_port) != replica_port) {
        if (now_seconds() - started > 60)
            fail_msg("no switchover within 60 s");
        sleep_ms(100);
    }
    producer_join(&producer);
    /* with --redis-wait 1 nothing is marked until the old primary has resynced as a replica */
    succeeded = wait_for_value(f->conn, "SELECT count(*) FROM outbox.job WHERE state = 'succeeded'",
                               5000, 120000);
    if (succeeded != 5000)
        relay_dump_log(&relay);
    assert_int_equal(succeeded, 5000);
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 30000), 0);

    context = connect_port(replica_port);
    assert_int_equal(stream_consumer_read_stream(context, "ha", &entries), 0);
    counts = calloc(5001, sizeof(*counts));
    assert_non_null(counts);
    count_jobs(&entries, counts, 5000);
    summarize(counts, 5000, &missing, &duplicates);
    print_message("switchover, --redis-wait %s: %zu entries for 5000 jobs, %lld missing,"
                  " %lld appended twice\n",
                  wait_replicas ? wait_replicas : "default", entries.count, missing, duplicates);
    if (wait_replicas == NULL || strcmp(wait_replicas, "0") != 0) {
        assert_int_equal(missing, 0);
        assert_int_equal(duplicates, 0);
    }
    free(counts);
    stream_consumer_stream_clear(&entries);
    redisFree(context);
}

/* Without --redis-wait: Sentinel's default is 1, and no acknowledged append is lost. */
static void
test_sentinel_switchover_by_default_loses_nothing(void **state)
{
    run_sentinel_switchover(*state, NULL);
}

static void
test_sentinel_switchover_without_wait_counts_losses(void **state)
{
    run_sentinel_switchover(*state, "0");
}

/* --check with an unknown master name fails naming it, without the password. */
static void
test_sentinel_unknown_master_is_config_error(void **state)
{
    struct fixture *f = *state;
    char url[512], output[4096];
    const char *argv[] = {"--check", "--database-url", f->url, "--broker", url,
                          "--metrics-addr", "off", NULL};
    int sentinel_port;

    assert_int_equal(ha_script("sentinel", f->dir, NULL), 0);
    sentinel_port = (int)read_number(f->dir, "sentinel1.port");
    snprintf(url, sizeof(url), "redis+sentinel://default:%s@127.0.0.1:%d/no-such-master",
             HA_PASSWORD, sentinel_port);
    assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 1);
    assert_non_null(strstr(output, "does not know master 'no-such-master'"));
    assert_null(strstr(output, HA_PASSWORD));
}

/* Polls INFO replication on port until it counts replicas connected replicas (60 s at most). */
static void
wait_for_replicas(int port, int replicas)
{
    double started = now_seconds();
    char needle[64];

    snprintf(needle, sizeof(needle), "connected_slaves:%d\r", replicas);
    for (;;) {
        redisContext *context = connect_port(port);
        redisReply *reply = node_command(context, "INFO", "replication", (const char *)NULL);
        bool found = reply->type == REDIS_REPLY_STRING && strstr(reply->str, needle) != NULL;

        freeReplyObject(reply);
        redisFree(context);
        if (found)
            return;
        if (now_seconds() - started > 60)
            fail_msg("the redis on port %d never had %d replicas", port, replicas);
        sleep_ms(100);
    }
}

/*
 * --check and the start-up line say how many replicas the primary has.
 * When it has none, the default --redis-wait 1 cannot be met: --check
 * fails saying so, and a running relay marks nothing, spends no attempt
 * and says why, until the replica is back; then every row succeeds.
 */
static void
test_sentinel_replicas_shown_and_a_lone_primary_defers(void **state)
{
    struct fixture *f = *state;
    char url[512], output[8192], expected[128];
    const char *check[] = {"--check", "--database-url", f->url, "--broker", url,
                           "--metrics-addr", "off", NULL};
    const char *extra[] = {"--retry-base", "100ms", "--retry-max", "1s", NULL};
    const char *started_line[] = {"broker replicas", expected, "redis_wait=1", NULL};
    const char *deferred_line[] = {"has 0 replicas, fewer than --redis-wait 1", NULL};
    struct relay_process relay;
    int primary_port, status;
    pid_t replica_pid;

    assert_int_equal(ha_script("sentinel", f->dir, NULL), 0);
    primary_port = (int)read_number(f->dir, "primary.port");
    read_sentinel_url(f->dir, url, sizeof(url));
    wait_for_replicas(primary_port, 1);
    status = relay_run_capture(check, output, sizeof(output));
    snprintf(expected, sizeof(expected), "127.0.0.1:%d has 1 replica (--redis-wait 1)",
             primary_port);
    if (status != 0 || strstr(output, expected) == NULL)
        fail_msg("--check exited %d without '%s':\n%s", status, expected, output);

    replica_pid = (pid_t)read_number(f->dir, "replica.pid");
    assert_true(replica_pid > 0);
    assert_int_equal(kill(replica_pid, SIGKILL), 0);
    wait_for_replicas(primary_port, 0);
    status = relay_run_capture(check, output, sizeof(output));
    snprintf(expected, sizeof(expected), "has 0 replicas, fewer than --redis-wait 1");
    if (status != 2 || strstr(output, expected) == NULL)
        fail_msg("--check exited %d without '%s':\n%s", status, expected, output);

    enqueue_many(f->conn, "lone", 20);
    relay_start_process(&relay, f->url, url, extra);
    snprintf(expected, sizeof(expected), "127.0.0.1:%d has 0 replicas", primary_port);
    for (int i = 0; i < 300 && (relay_log_find(&relay, 0, false, started_line, NULL, 0) < 0 ||
                                relay_log_find(&relay, 0, false, deferred_line, NULL, 0) < 0);
         i++)
        sleep_ms(100);
    if (relay_log_find(&relay, 0, false, started_line, NULL, 0) < 0 ||
        relay_log_find(&relay, 0, false, deferred_line, NULL, 0) < 0) {
        relay_dump_log(&relay);
        fail_msg("no start-up line naming the lone primary, or no line saying why rows wait");
    }
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state IN ('succeeded', 'dead')"),
                     0);
    /* deferred rows are given back with their attempt: none was spent */
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'ready' AND attempts > 0"),
                     0);

    assert_int_equal(ha_script("start-node", f->dir, "replica"), 0);
    if (wait_for_value(f->conn, "SELECT count(*) FROM outbox.job WHERE state = 'succeeded'", 20,
                       120000) != 20) {
        relay_dump_log(&relay);
        fail_msg("the rows did not succeed once the replica was back");
    }
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 30000), 0);
}

/* ---- Cluster ----------------------------------------------------------------------- */

struct cluster_node {
    int port;
    char id[64];
    bool master;
};

/* Reads the nodes of the cluster from CLUSTER NODES on port; their count. */
static size_t
cluster_nodes(int port, struct cluster_node *nodes, size_t max)
{
    redisContext *context = connect_port(port);
    redisReply *reply = node_command(context, "CLUSTER", "NODES", (const char *)NULL);
    size_t count = 0;

    assert_int_equal(reply->type, REDIS_REPLY_STRING);
    for (char *line = strtok(reply->str, "\n"); line != NULL && count < max;
         line = strtok(NULL, "\n")) {
        char id[64], address[128], flags[128];

        if (sscanf(line, "%63s %127s %127s", id, address, flags) != 3)
            continue;
        snprintf(nodes[count].id, sizeof(nodes[count].id), "%s", id);
        nodes[count].port = atoi(strchr(address, ':') + 1);
        nodes[count].master = strstr(flags, "master") != NULL;
        count++;
    }
    freeReplyObject(reply);
    redisFree(context);
    return count;
}

/* The port of the master that owns slot, from CLUSTER SLOTS on port. */
static int
slot_owner(int port, unsigned slot)
{
    redisContext *context = connect_port(port);
    redisReply *reply = node_command(context, "CLUSTER", "SLOTS", (const char *)NULL);
    int owner = 0;

    for (size_t i = 0; reply->type == REDIS_REPLY_ARRAY && i < reply->elements; i++) {
        const redisReply *range = reply->element[i];

        if ((unsigned)range->element[0]->integer <= slot &&
            slot <= (unsigned)range->element[1]->integer)
            owner = (int)range->element[2]->element[1]->integer;
    }
    freeReplyObject(reply);
    redisFree(context);
    return owner;
}

/* How often the server on port answered with error prefix (INFO errorstats). */
static long long
error_count(int port, const char *prefix)
{
    redisContext *context = connect_port(port);
    redisReply *reply = node_command(context, "INFO", "errorstats", (const char *)NULL);
    char needle[64];
    const char *at;
    long long count = 0;

    snprintf(needle, sizeof(needle), "errorstat_%s:count=", prefix);
    if (reply->type == REDIS_REPLY_STRING && (at = strstr(reply->str, needle)) != NULL)
        count = atoll(at + strlen(needle));
    freeReplyObject(reply);
    redisFree(context);
    return count;
}

/*
 * Moves slot from one master to another while the relay writes to it, the
 * way redis-cli --cluster reshard does: IMPORTING on the target, MIGRATING
 * on the source, wait until the source refused a call for the migration
 * (TRYAGAIN: the stream is there, the new dedup records are not; or ASK),
 * MIGRATE the keys in small steps with pauses, then tell every master the
 * slot's new owner.
 */
static void
move_slot(const struct cluster_node *nodes, size_t count, unsigned slot, int from, int to)
{
    const char *from_id = NULL, *to_id = NULL;
    redisContext *source = connect_port(from), *target = connect_port(to);
    char slot_text[16], port_text[16];
    redisReply *reply;

    for (size_t i = 0; i < count; i++) {
        if (nodes[i].port == from)
            from_id = nodes[i].id;
        if (nodes[i].port == to)
            to_id = nodes[i].id;
    }
    assert_non_null(from_id);
    assert_non_null(to_id);
    snprintf(slot_text, sizeof(slot_text), "%u", slot);
    snprintf(port_text, sizeof(port_text), "%d", to);
    /* a node may not have heard of the other through the bus yet: a few tries */
    for (int tries = 0;; tries++) {
        reply = node_command(target, "CLUSTER", "SETSLOT", slot_text, "IMPORTING", from_id,
                             (const char *)NULL);
        if (reply->type == REDIS_REPLY_STATUS)
            break;
        if (tries == 100)
            fail_msg("CLUSTER SETSLOT IMPORTING: %s", reply->str);
        freeReplyObject(reply);
        sleep_ms(100);
    }
    freeReplyObject(reply);
    reply = node_command(source, "CLUSTER", "SETSLOT", slot_text, "MIGRATING", to_id,
                         (const char *)NULL);
    if (reply->type != REDIS_REPLY_STATUS)
        fail_msg("CLUSTER SETSLOT MIGRATING: %s", reply->str);
    freeReplyObject(reply);
    /* the relay meets the migration (a call refused TRYAGAIN or sent on with ASK) before any key moves */
    {
        double started = now_seconds();

        while (error_count(from, "TRYAGAIN") + error_count(from, "ASK") == 0) {
            if (now_seconds() - started > 120)
                fail_msg("no append met the migration of slot %u", slot);
            sleep_ms(100);
        }
    }
    for (int round = 0; round < 1000; round++) {
        redisReply *keys;

        sleep_ms(100);
        keys = node_command(source, "CLUSTER", "GETKEYSINSLOT", slot_text, "5", (const char *)NULL);
        assert_int_equal(keys->type, REDIS_REPLY_ARRAY);
        if (keys->elements == 0) {
            freeReplyObject(keys);
            break;
        }
        for (size_t i = 0; i < keys->elements; i++) {
            reply = node_command(source, "MIGRATE", "127.0.0.1", port_text, keys->element[i]->str,
                                 "0", "5000", "AUTH", HA_PASSWORD, (const char *)NULL);
            if (reply->type == REDIS_REPLY_ERROR)
                fail_msg("MIGRATE %s: %s", keys->element[i]->str, reply->str);
            freeReplyObject(reply);
        }
        freeReplyObject(keys);
    }
    sleep_ms(300);
    for (size_t i = 0; i < count; i++) {
        redisContext *context;

        if (!nodes[i].master)
            continue;
        context = connect_port(nodes[i].port);
        reply = node_command(context, "CLUSTER", "SETSLOT", slot_text, "NODE", to_id,
                             (const char *)NULL);
        if (reply->type == REDIS_REPLY_ERROR)
            fail_msg("CLUSTER SETSLOT NODE on %d: %s", nodes[i].port, reply->str);
        freeReplyObject(reply);
        redisFree(context);
    }
    redisFree(source);
    redisFree(target);
}

/*
 * Counts every job of every queue's stream on the masters; fails the test
 * unless each of the max_job jobs is there once.
 */
static void
assert_each_job_once(const struct cluster_node *nodes, size_t count, long long max_job)
{
    int *counts = calloc((size_t)max_job + 1, sizeof(*counts));
    long long missing, duplicates;
    size_t entries_total = 0;

    assert_non_null(counts);
    for (size_t i = 0; i < count; i++) {
        redisContext *context;

        if (!nodes[i].master)
            continue;
        context = connect_port(nodes[i].port);
        for (int q = 0; q < CLUSTER_QUEUES; q++) {
            struct stream_consumer_stream entries;
            char stream[32];

            snprintf(stream, sizeof(stream), "q%02d", q);
            if (slot_owner(nodes[i].port, keyslot_of(stream, strlen(stream))) != nodes[i].port)
                continue;
            assert_int_equal(stream_consumer_read_stream(context, stream, &entries), 0);
            count_jobs(&entries, counts, max_job);
            entries_total += entries.count;
            stream_consumer_stream_clear(&entries);
        }
        redisFree(context);
    }
    summarize(counts, max_job, &missing, &duplicates);
    print_message("%zu entries for %lld jobs: %lld missing, %lld appended twice\n", entries_total,
                  max_job, missing, duplicates);
    assert_int_equal(missing, 0);
    assert_int_equal(duplicates, 0);
    free(counts);
}

/*
 * Rows published: succeeded, or stream rows behind their partition's
 * cursor (q07 and q11 are stream queues).
 */
static const char SQL_PUBLISHED[] =
    "SELECT count(*) FROM outbox.job AS j WHERE j.state = 'succeeded'"
    " OR (j.state = 'stream' AND EXISTS (SELECT 1 FROM outbox.stream_cursor AS c"
    "     WHERE c.queue = j.queue AND c.partition = j.stream_partition"
    "       AND (j.xid, j.job_id) <= (c.cursor_xid, c.cursor_job_id)))";

/*
 * 50 queues (streams over all three masters), two of them stream queues,
 * 10 000 rows and more, one stream queue's slot moved to another master
 * while rows for it keep coming and the relay publishes: every job once.
 * Then every row published again (row-state rows set back to ready, the
 * stream cursors back to the start): still once. A row routed to a stream
 * whose name holds a '}' without a hash tag dies at once, saying why.
 */
static void
test_cluster_appends_each_job_once_across_a_reshard(void **state)
{
    struct fixture *f = *state;
    const char *extra[] = {"--retry-base", "100ms", "--retry-max", "1s", "--batch-size", "200",
                           NULL};
    struct cluster_node nodes[16];
    struct relay_process relay;
    char cluster_url[1024];
    int ports[16], masters_with_streams = 0, from, to = 0;
    size_t node_count;
    unsigned moved_slot;
    long long rows, succeeded, retried;
    struct producer producer;

    assert_int_equal(ha_script("cluster", f->dir, NULL), 0);
    node_count = 0;
    {
        char name[32];

        for (int i = 1; i <= 6; i++) {
            snprintf(name, sizeof(name), "node%d.port", i);
            ports[i - 1] = (int)read_number(f->dir, name);
        }
    }
    snprintf(cluster_url, sizeof(cluster_url), "redis+cluster://default:%s@127.0.0.1:%d,127.0.0.1:%d",
             HA_PASSWORD, ports[0], ports[1]);
    node_count = cluster_nodes(ports[0], nodes, 16);
    assert_int_equal(node_count, 6);
    /* the streams are spread over every master */
    for (size_t i = 0; i < node_count; i++) {
        bool owns = false;

        for (int q = 0; q < CLUSTER_QUEUES && nodes[i].master; q++) {
            char stream[32];

            snprintf(stream, sizeof(stream), "q%02d", q);
            owns = owns || slot_owner(ports[0], keyslot_of(stream, strlen(stream))) == nodes[i].port;
        }
        masters_with_streams += owns;
    }
    assert_int_equal(masters_with_streams, 3);

    harness_exec(f->conn, "SELECT outbox.stream_enable('q07', 2), outbox.stream_enable('q11', 3)");
    /* half the rows are there at the start, half come while the relay runs */
    for (int q = 0; q < CLUSTER_QUEUES; q++) {
        char queue[32];

        snprintf(queue, sizeof(queue), "q%02d", q);
        enqueue_many(f->conn, queue, CLUSTER_ROWS_PER_QUEUE / 2);
    }
    relay_start_process(&relay, f->url, cluster_url, extra);
    moved_slot = keyslot_of("q07", 3);
    from = slot_owner(ports[0], moved_slot);
    for (size_t i = 0; i < node_count; i++)
        if (nodes[i].master && nodes[i].port != from && to == 0)
            to = nodes[i].port;
    for (int q = 0; q < CLUSTER_QUEUES; q++) {
        char queue[32];

        snprintf(queue, sizeof(queue), "q%02d", q);
        enqueue_many(f->conn, queue, CLUSTER_ROWS_PER_QUEUE / 2);
    }
    /* q07 gets rows all through the move */
    producer = (struct producer){.database_url = f->url, .queue = "q07", .total = 1000000,
                                 .per_commit = 2, .pause_ms = 20};
    producer_start(&producer);
    move_slot(nodes, node_count, moved_slot, from, to);
    sleep_ms(300);
    atomic_store(&producer.stop, true);
    producer_join(&producer);
    assert_int_equal(slot_owner(ports[0], moved_slot), to);
    rows = harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job");

    succeeded = wait_for_value(f->conn, SQL_PUBLISHED, rows, 120000);
    if (succeeded != rows)
        relay_dump_log(&relay);
    assert_int_equal(succeeded, rows);
    /* refused calls are given back without costing an attempt */
    retried = harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE attempts > 1");
    print_message("%lld rows, %lld of them needed more than one attempt; %lld calls refused"
                  " TRYAGAIN during the move\n",
                  rows, retried, error_count(from, "TRYAGAIN") + error_count(to, "TRYAGAIN"));
    /* job ids of this database are 1..rows */
    assert_int_equal(harness_query_ll(f->conn, "SELECT max(job_id) FROM outbox.job"), rows);
    assert_each_job_once(nodes, node_count, rows);

    /* re-drive every row: published again, appended never */
    harness_exec(f->conn, "UPDATE outbox.job SET state = 'ready', worker_id = NULL,"
                          " lease_until = NULL, finished_at = NULL, run_at = now()"
                          " WHERE state = 'succeeded'");
    /* the owners lose their leases and take the partitions over from the start */
    harness_exec(f->conn, "UPDATE outbox.stream_cursor SET cursor_xid = '0', cursor_job_id = 0,"
                          " owner = NULL, lease_until = NULL");
    succeeded = wait_for_value(f->conn, SQL_PUBLISHED, rows, 120000);
    if (succeeded != rows)
        relay_dump_log(&relay);
    assert_int_equal(succeeded, rows);

    /* a routing key with a '}' and no hash tag cannot be published with its dedup record */
    harness_query_ll(f->conn, "SELECT outbox.enqueue('q00', '{}'::jsonb, routing_key => 'odd}key')");
    assert_int_equal(wait_for_value(f->conn, "SELECT count(*) FROM outbox.job WHERE state = 'dead'"
                                             " AND last_error LIKE '%without a hash tag%'",
                                    1, 30000),
                     1);
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 30000), 0);
    assert_each_job_once(nodes, node_count, rows);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_sentinel_unknown_master_is_config_error, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_sentinel_replicas_shown_and_a_lone_primary_defers,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_sentinel_switchover_by_default_loses_nothing, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_sentinel_switchover_without_wait_counts_losses,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_sentinel_failover_by_default_loses_nothing_and_appends_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sentinel_failover_without_wait_counts_duplicates,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_cluster_appends_each_job_once_across_a_reshard, setup,
                                        teardown),
    };

    signal(SIGPIPE, SIG_IGN);
    /* OUTBOX_TEST_FILTER=test_cluster* runs only the matching tests */
    if (getenv("OUTBOX_TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("OUTBOX_TEST_FILTER"));
    return cmocka_run_group_tests_name("ha_redis", tests, NULL, NULL);
}
