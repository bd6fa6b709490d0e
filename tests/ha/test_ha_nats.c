/*
 * test_ha_nats.c - the relay rides through the loss of a JetStream stream's
 * leader.
 *
 * PostgreSQL and a three-node JetStream cluster (stack.sh nats-cluster); the
 * relay reaches the cluster through the server list. The stream has three
 * replicas on file storage: what its leader acked lives on a majority, and
 * its duplicate window travels with it, so the rows the relay publishes
 * again after the loss are acked as duplicates by the new leader instead of
 * being stored twice. The test prints what the failover cost.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ha_common.h"
#include "harness.h"
#include "nats_consumer.h"
#include "relay_runner.h"

#define NODES 3
#define ROWS 30000
#define ROWS_PER_COMMIT 100
#define CONCURRENCY 2

struct fixture {
    char *url;
    PGconn *conn;
    const char *cluster_url;
    char consumer_url[256]; /* every node, each with its scheme, for libnats */
    nats_consumer *nats;
    char queue[64];
    char stream[64];
    char prefix[72];
};

static int test_counter;

static int
group_setup(void **state)
{
    (void)state;
    return ha_start_cluster("nats-cluster");
}

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    int ports[NODES];
    char subject[96];
    int made = -1;

    assert_non_null(f);
    f->url = harness_database_new();
    f->conn = harness_connect(f->url);
    f->cluster_url = harness_env("OUTBOX_TEST_NATS_CLUSTER_URL");
    assert_int_equal(sscanf(harness_env("OUTBOX_TEST_NATS_CLUSTER_PORTS"), "%d %d %d", &ports[0],
                            &ports[1], &ports[2]),
                     NODES);
    snprintf(f->consumer_url, sizeof(f->consumer_url),
             "nats://127.0.0.1:%d,nats://127.0.0.1:%d,nats://127.0.0.1:%d", ports[0], ports[1],
             ports[2]);
    snprintf(f->queue, sizeof(f->queue), "ha-orders-%d-%d", (int)getpid(), test_counter);
    snprintf(f->stream, sizeof(f->stream), "ha-%d-%d", (int)getpid(), test_counter++);
    snprintf(f->prefix, sizeof(f->prefix), "%s.", f->stream);
    snprintf(subject, sizeof(subject), "%s>", f->prefix);
    f->nats = nats_consumer_connect(f->consumer_url);
    assert_non_null(f->nats);
    /* a cluster just formed may still be placing its first stream: a few tries */
    for (int tries = 0; tries < 30 && made != 0; tries++) {
        made = nats_consumer_create_stream(f->nats, f->stream,
                                           &(struct nats_consumer_stream_options){
                                               .subject = subject, .replicas = NODES});
        if (made != 0)
            sleep(1);
    }
    assert_int_equal(made, 0);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    nats_consumer_delete_stream(f->nats, f->stream);
    nats_consumer_free(f->nats);
    PQfinish(f->conn);
    harness_database_drop(f->url);
    free(f);
    return 0;
}

/* kill -9 of the server named node ("n2"), by its pid file in the cluster's stack directory. */
static void
kill_node(const char *node)
{
    char path[512], text[32] = "";
    FILE *file;
    pid_t pid;

    snprintf(path, sizeof(path), "%s/nats-cluster/%s/nats.pid", harness_env("OUTBOX_TEST_STACK_DIR"),
             node);
    file = fopen(path, "r");
    assert_non_null(file);
    assert_non_null(fgets(text, sizeof(text), file));
    fclose(file);
    pid = (pid_t)strtol(text, NULL, 10);
    assert_true(pid > 1);
    assert_int_equal(kill(pid, SIGKILL), 0);
}

static int
compare_id(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return (x > y) - (x < y);
}

/* Reads the stream (retrying while the cluster settles) and compares it with the queue's rows. */
static void
count_stream(struct fixture *f, struct ha_delivery *delivery)
{
    struct nats_consumer_message *messages = NULL;
    size_t count = 0;
    int64_t *ids;
    PGresult *rows;
    int rc = -1, row = 0;

    for (int tries = 0; tries < 30 && rc != 0; tries++) {
        rc = nats_consumer_read(f->nats, f->stream, &messages, &count);
        if (rc != 0)
            sleep(1);
    }
    assert_int_equal(rc, 0);
    ids = calloc(count + 1, sizeof(*ids));
    assert_non_null(ids);
    for (size_t i = 0; i < count; i++)
        ids[i] = messages[i].job_id;
    nats_consumer_messages_free(messages, count);
    qsort(ids, count, sizeof(*ids), compare_id);
    rows = PQexec(f->conn, "SELECT job_id FROM outbox.job ORDER BY 1");
    assert_int_equal(PQresultStatus(rows), PGRES_TUPLES_OK);
    memset(delivery, 0, sizeof(*delivery));
    delivery->rows = PQntuples(rows);
    delivery->messages = (long long)count;
    for (size_t i = 0; i < count; i++) {
        if (i > 0 && ids[i] == ids[i - 1]) {
            delivery->duplicates++;
            continue;
        }
        delivery->unique++;
        while (row < PQntuples(rows) && strtoll(PQgetvalue(rows, row, 0), NULL, 10) < ids[i])
            row++;
        if (row >= PQntuples(rows) || strtoll(PQgetvalue(rows, row, 0), NULL, 10) != ids[i])
            delivery->strays++;
    }
    PQclear(rows);
    free(ids);
}

/*
 * kill -9 of the stream's leader while 30 000 rows are committed and
 * relayed: every row succeeded at its first attempt, the stream holds each
 * exactly once, nothing that is no row.
 */
static void
test_leader_kill_mid_run(void **state)
{
    struct fixture *f = *state;
    struct relay_process relay;
    struct ha_producer producer = {.database_url = f->url, .queue = f->queue, .total = ROWS,
                                   .rows_per_commit = ROWS_PER_COMMIT, .pause_ms = 20};
    struct ha_delivery delivery;
    char concurrency[8], leader[64] = "", after[64] = "";
    /*
     * A lease longer than an election plus the broker's I/O timeout (10 s): a
     * publish waiting out the election keeps its rows, where the tests' usual
     * 5 s lease could expire under it and spend an attempt on the reaper's
     * side (no row is lost either way: the stream stores a re-publish once).
     */
    const char *extra[] = {"--queues", f->queue, "--subject-prefix", f->prefix,
                           "--concurrency", concurrency, "--lease", "30", NULL};
    double killed_at;
    long long retried;

    snprintf(concurrency, sizeof(concurrency), "%d", CONCURRENCY);
    relay_start_process(&relay, f->url, f->cluster_url, extra);
    ha_producer_start(&producer);

    ha_wait_third_through(f->conn, &relay, ROWS);
    assert_int_equal(nats_consumer_stream_leader(f->nats, f->stream, leader, sizeof(leader)), 0);
    killed_at = wall_clock_seconds();
    kill_node(leader);
    printf("ha: kill -9 of stream leader %s after %lld rows succeeded\n", leader,
           harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE state = 'succeeded'"));

    ha_producer_join(&producer);
    if (producer.error[0] != '\0')
        fail_msg("%s", producer.error);
    assert_int_equal(producer.committed, ROWS);
    ha_wait_all_succeeded(f->conn, &relay);
    printf("ha: every row succeeded %.1f s after the kill\n", wall_clock_seconds() - killed_at);
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 30000), 0);

    for (int tries = 0; tries < 30 && after[0] == '\0'; tries++)
        if (nats_consumer_stream_leader(f->nats, f->stream, after, sizeof(after)) != 0)
            sleep(1);
    assert_string_not_equal(after, leader);
    retried = harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE attempts > 1");
    {
        /* what the new leader acked as duplicates: published twice, stored once */
        char line[2048];
        long long duplicates = 0;
        FILE *log = fopen(relay.log_path, "r");

        while (log != NULL && fgets(line, sizeof(line), log) != NULL) {
            const char *count = strstr(line, "count=");

            if (strstr(line, "acked messages as duplicates") != NULL && count != NULL)
                duplicates += strtoll(count + 6, NULL, 10);
        }
        if (log != NULL)
            fclose(log);
        printf("ha: %lld publishes acked as duplicates\n", duplicates);
    }
    count_stream(f, &delivery);
    printf("ha: nats leader kill: %lld rows, %lld messages, %lld distinct, %lld stored twice,"
           " %lld strays; %lld rows needed more than one attempt; new leader %s\n",
           delivery.rows, delivery.messages, delivery.unique, delivery.duplicates,
           delivery.strays, retried, after);
    assert_int_equal(delivery.rows, ROWS);
    assert_int_equal(delivery.strays, 0);
    assert_int_equal(delivery.duplicates, 0);
    assert_int_equal(delivery.unique, ROWS);
    /* the election is no row's fault: publishes into it were given back, not failed */
    if (retried != 0) {
        PGresult *why = PQexec(f->conn, "SELECT count(*), left(last_error, 300) FROM outbox.job"
                                        " WHERE attempts > 1 GROUP BY 2 ORDER BY 1 DESC LIMIT 5");

        for (int r = 0; PQresultStatus(why) == PGRES_TUPLES_OK && r < PQntuples(why); r++)
            printf("ha: %s rows spent an attempt: %s\n", PQgetvalue(why, r, 0),
                   PQgetvalue(why, r, 1));
        PQclear(why);
    }
    assert_int_equal(retried, 0);
    ha_producer_clear(&producer);
    unlink(relay.log_path);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_leader_kill_mid_run, setup, teardown),
    };

    return cmocka_run_group_tests_name("ha_nats", tests, group_setup, ha_group_teardown);
}
