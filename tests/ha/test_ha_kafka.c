/*
 * test_ha_kafka.c - the relay rides through the loss of the Kafka broker
 * that leads its partition.
 *
 * PostgreSQL and a three-node KRaft cluster (stack.sh kafka-cluster, each
 * node broker and controller); the relay bootstraps from the three. The
 * topic is replicated three times with min.insync.replicas=2, so with
 * acks=all a record the leader confirmed is on two nodes at least, and the
 * loss of any one node takes none of them. The test kills the leader of
 * partition 0 with SIGKILL mid-run and prints what the failover cost
 * (duplicates, seconds until every row was through) for the operating guide.
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
#include "kafka_consumer.h"
#include "relay_runner.h"

#define ROWS 30000
#define ROWS_PER_COMMIT 100
#define PARTITIONS 3

struct fixture {
    char *url;
    PGconn *conn;
    const char *cluster_url;
    char topic[64];
    int killed_node; /* node id the test killed, started again at teardown; 0 for none */
};

static int test_counter;

static int
group_setup(void **state)
{
    (void)state;
    return ha_start_cluster("kafka-cluster");
}

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    const char *const configs[] = {"min.insync.replicas", "2", NULL};
    char why[512];

    assert_non_null(f);
    f->url = harness_database_new();
    f->conn = harness_connect(f->url);
    f->cluster_url = harness_env("OUTBOX_TEST_KAFKA_CLUSTER_URL");
    snprintf(f->topic, sizeof(f->topic), "ha-orders-%d-%d", (int)getpid(), test_counter++);
    if (kafka_consumer_create_topic(f->cluster_url, f->topic, PARTITIONS, 3, configs, 60000, why,
                                    sizeof(why)) != 0)
        fail_msg("creating topic %s: %s", f->topic, why);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    if (f->killed_node != 0) {
        char node[8];
        const char *args[] = {"start-kafka-node", node, NULL};

        snprintf(node, sizeof(node), "%d", f->killed_node);
        harness_stack_run(args);
    }
    kafka_consumer_delete_topic(f->cluster_url, f->topic);
    PQfinish(f->conn);
    harness_database_drop(f->url);
    free(f);
    return 0;
}

static int
compare_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;

    return (x > y) - (x < y);
}

/* Reads the whole topic and compares its message ids with the committed rows. */
static void
drain_topic(struct fixture *f, const struct ha_producer *producer, struct ha_delivery *delivery)
{
    struct kafka_consumer_topic topic;
    long long *ids, *rows;
    char why[512];
    size_t r = 0;

    if (kafka_consumer_read_topic(f->cluster_url, f->topic, 120000, &topic, why, sizeof(why)) != 0)
        fail_msg("reading topic %s: %s", f->topic, why);
    ids = calloc(topic.count + 1, sizeof(*ids));
    rows = calloc((size_t)producer->committed + 1, sizeof(*rows));
    assert_non_null(ids);
    assert_non_null(rows);
    for (size_t i = 0; i < topic.count; i++)
        ids[i] = topic.records[i].job_id;
    memcpy(rows, producer->committed_ids, (size_t)producer->committed * sizeof(*rows));
    qsort(ids, topic.count, sizeof(*ids), compare_ll);
    qsort(rows, (size_t)producer->committed, sizeof(*rows), compare_ll);
    memset(delivery, 0, sizeof(*delivery));
    delivery->rows = producer->committed;
    delivery->messages = (long long)topic.count;
    for (size_t i = 0; i < topic.count; i++) {
        if (i > 0 && ids[i] == ids[i - 1]) {
            delivery->duplicates++;
            continue;
        }
        delivery->unique++;
        while (r < (size_t)producer->committed && rows[r] < ids[i])
            r++;
        if (r == (size_t)producer->committed || rows[r] != ids[i])
            delivery->strays++;
    }
    kafka_consumer_topic_clear(&topic);
    free(ids);
    free(rows);
}

/*
 * 30 000 rows flowing; the leader of partition 0 is killed with SIGKILL
 * once a third are through. Every committed row reaches the topic (0
 * lost), every row ends succeeded, nothing that is no row is there, and
 * the duplicates the failover cost are counted and printed.
 */
static void
test_partition_leader_killed_mid_run(void **state)
{
    struct fixture *f = *state;
    struct relay_process relay;
    struct ha_producer producer = {.database_url = f->url, .queue = f->topic, .total = ROWS,
                                   .rows_per_commit = ROWS_PER_COMMIT, .pause_ms = 20};
    struct ha_delivery delivery;
    const char *extra[] = {"--queues", f->topic, "--concurrency", "2", NULL};
    char node[8];
    const char *kill_args[] = {"kill-kafka-node", node, NULL};
    double killed_at, done_at;
    int leader;

    relay_start_process(&relay, f->url, f->cluster_url, extra);
    ha_producer_start(&producer);
    ha_wait_third_through(f->conn, &relay, ROWS);
    leader = kafka_consumer_partition_leader(f->cluster_url, f->topic, 0);
    assert_true(leader >= 1 && leader <= 3);
    snprintf(node, sizeof(node), "%d", leader);
    killed_at = wall_clock_seconds();
    ha_stack(kill_args);
    f->killed_node = leader;
    printf("ha: killed kafka node %d (leader of partition 0) after %lld rows succeeded\n", leader,
           harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE state = 'succeeded'"));

    ha_producer_join(&producer);
    if (producer.error[0] != '\0')
        fail_msg("%s", producer.error);
    assert_int_equal(producer.committed, ROWS);
    assert_int_equal(producer.in_doubt, 0);
    ha_wait_all_succeeded(f->conn, &relay);
    done_at = wall_clock_seconds();
    assert_int_equal(harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job"
                                               " WHERE state = 'succeeded' AND attempts >= 1"),
                     ROWS);
    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 30000), 0);

    drain_topic(f, &producer, &delivery);
    printf("ha: kafka leader kill -9: %lld rows, %lld records, %lld distinct, %lld duplicates,"
           " %lld strays, %lld rows claimed more than once; every row succeeded %.1f s after"
           " the kill\n",
           delivery.rows, delivery.messages, delivery.unique, delivery.duplicates,
           delivery.strays,
           harness_query_ll(f->conn, "SELECT count(*) FROM outbox.job WHERE attempts > 1"),
           done_at - killed_at);
    assert_int_equal(delivery.strays, 0);
    assert_int_equal(delivery.unique, ROWS); /* 0 lost */
    ha_producer_clear(&producer);
    unlink(relay.log_path);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_partition_leader_killed_mid_run, setup, teardown),
    };

    return cmocka_run_group_tests_name("ha_kafka", tests, group_setup, ha_group_teardown);
}
