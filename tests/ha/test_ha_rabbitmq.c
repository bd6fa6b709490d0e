/*
 * test_ha_rabbitmq.c - the relay rides through the loss of the RabbitMQ node
 * it publishes to.
 *
 * PostgreSQL and a three-node RabbitMQ cluster (stack.sh rabbitmq-cluster);
 * the relay reaches the cluster through the endpoint list. The queue is a
 * quorum queue: its messages live on a majority of the nodes, so a node that
 * leaves takes nothing it confirmed with it. The test prints what the
 * failover cost (seconds to reconnect, duplicate deliveries) for the
 * operating guide.
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

#include "amqp_consumer.h"
#include "ha_common.h"
#include "harness.h"
#include "relay_runner.h"

#define NODES 3
#define ROWS 30000
#define ROWS_PER_COMMIT 100
#define CONCURRENCY 2
/* a relay whose node went away publishes through another node within this */
#define RECONNECT_LIMIT_SECONDS 15.0

struct fixture {
    char *url;
    PGconn *conn;
    const char *cluster_url;
    int ports[NODES];
    char queue[64];
    int stopped_node; /* 1-based node the test stopped, restarted at teardown; 0 for none */
};

static int test_counter;

static int
group_setup(void **state)
{
    (void)state;
    return ha_start_cluster("rabbitmq-cluster");
}

/* amqp:// URL of node index (1-based) alone. */
static void
node_url(const struct fixture *f, int node, char *out, size_t size)
{
    snprintf(out, size, "amqp://guest:guest@127.0.0.1:%d/", f->ports[node - 1]);
}

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    char url[128];
    queue_consumer *mq;

    assert_non_null(f);
    f->url = harness_database_new();
    f->conn = harness_connect(f->url);
    f->cluster_url = harness_env("OUTBOX_TEST_AMQP_CLUSTER_URL");
    assert_int_equal(sscanf(harness_env("OUTBOX_TEST_AMQP_CLUSTER_PORTS"), "%d %d %d", &f->ports[0],
                            &f->ports[1], &f->ports[2]),
                     NODES);
    snprintf(f->queue, sizeof(f->queue), "ha-orders-%d-%d", (int)getpid(), test_counter++);
    node_url(f, 1, url, sizeof(url));
    mq = queue_consumer_connect(url);
    assert_non_null(mq);
    if (queue_consumer_declare_quorum_queue(mq, f->queue) != 0)
        fail_msg("declaring quorum queue %s: %s", f->queue, queue_consumer_error(mq));
    queue_consumer_free(mq);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;
    char url[128];
    queue_consumer *mq;

    if (f->stopped_node != 0) {
        char node[8];
        const char *args[] = {"cluster-rabbitmqctl", node, "start_app", NULL};

        snprintf(node, sizeof(node), "%d", f->stopped_node);
        harness_stack_run(args);
    }
    node_url(f, 1, url, sizeof(url));
    mq = queue_consumer_connect(url);
    if (mq != NULL)
        queue_consumer_delete_queue(mq, f->queue);
    queue_consumer_free(mq);
    PQfinish(f->conn);
    harness_database_drop(f->url);
    free(f);
    return 0;
}

/* Runs rabbitmqctl ACTION on node (stop_app, start_app) and remembers a stopped one. */
static void
node_action(struct fixture *f, int node, const char *action)
{
    char index[8];
    const char *args[] = {"cluster-rabbitmqctl", index, action, NULL};

    snprintf(index, sizeof(index), "%d", node);
    ha_stack(args);
    f->stopped_node = strcmp(action, "stop_app") == 0 ? node : 0;
}

/* The 1-based node listening on port, or 0. */
static int
node_of_port(const struct fixture *f, int port)
{
    for (int i = 0; i < NODES; i++)
        if (f->ports[i] == port)
            return i + 1;
    return 0;
}

/* The port of "endpoint=127.0.0.1:PORT" in a log line, or 0. */
static int
endpoint_port(const char *line)
{
    const char *at = strstr(line, "endpoint=127.0.0.1:");

    return at != NULL ? atoi(at + strlen("endpoint=127.0.0.1:")) : 0;
}

static long long
count_where(struct fixture *f, const char *condition)
{
    char sql[512];

    snprintf(sql, sizeof(sql), "SELECT count(*) FROM outbox.job WHERE queue = '%s' AND %s",
             f->queue, condition);
    return harness_query_ll(f->conn, sql);
}

/* The value of outbox_broker_endpoint for endpoint 127.0.0.1:port in a scrape, or -1. */
static long long
endpoint_gauge(const char *metrics, int port)
{
    char label[96];
    const char *line;

    snprintf(label, sizeof(label), "endpoint=\"127.0.0.1:%d\"}", port);
    for (line = metrics; line != NULL && *line != '\0'; line = strchr(line, '\n')) {
        const char *at;

        line += *line == '\n';
        if (strncmp(line, "outbox_broker_endpoint{", 23) != 0)
            continue;
        at = strstr(line, label);
        if (at != NULL && at < line + strcspn(line, "\n"))
            return atoll(at + strlen(label));
    }
    return -1;
}

/*
 * --check with one node stopped: the node is named as skipped, the two
 * others as reachable, and the configuration is still OK.
 */
static void
test_check_names_the_node_that_is_down(void **state)
{
    struct fixture *f = *state;
    const char *argv[] = {"--database-url", f->url, "--broker", f->cluster_url, "--check", NULL};
    char output[8192], expected[128];

    node_action(f, 2, "stop_app");
    assert_int_equal(relay_run_capture(argv, output, sizeof(output)), 0);
    printf("%s", output);
    assert_non_null(strstr(output, "configuration OK"));
    snprintf(expected, sizeof(expected), "broker endpoint 127.0.0.1:%d: skipped", f->ports[1]);
    assert_non_null(strstr(output, expected));
    snprintf(expected, sizeof(expected), "broker endpoint 127.0.0.1:%d: reachable", f->ports[0]);
    assert_non_null(strstr(output, expected));
    snprintf(expected, sizeof(expected), "broker endpoint 127.0.0.1:%d: reachable", f->ports[2]);
    assert_non_null(strstr(output, expected));
    node_action(f, 2, "start_app");
}

/*
 * 30 000 rows flowing; the node that pipeline 0 publishes to stops. Every
 * pipeline that was on it logs the loss and publishes through another node
 * within 15 s of it (by the relay's log; how long stop_app itself takes is
 * RabbitMQ's), every committed row is delivered, none is left unsucceeded,
 * and the endpoint gauge follows the move.
 */
static void
test_node_stop_mid_run(void **state)
{
    struct fixture *f = *state;
    struct relay_process relay;
    struct ha_producer producer = {.database_url = f->url, .queue = f->queue, .total = ROWS,
                                   .rows_per_commit = ROWS_PER_COMMIT, .pause_ms = 20};
    struct ha_delivery delivery;
    char metrics_addr[64], concurrency[8], line[2048], url[128];
    const char *extra[] = {"--queues", f->queue, "--metrics-addr", metrics_addr,
                           "--concurrency", concurrency, NULL};
    int metrics_port = harness_free_port(), before[CONCURRENCY], stopped, survivor;
    double stop_at, worst = 0;
    char *metrics;

    snprintf(metrics_addr, sizeof(metrics_addr), "127.0.0.1:%d", metrics_port);
    snprintf(concurrency, sizeof(concurrency), "%d", CONCURRENCY);
    relay_start_process(&relay, f->url, f->cluster_url, extra);
    ha_producer_start(&producer);

    /* mid-run: a third of the rows are through */
    ha_wait_third_through(f->conn, &relay, ROWS);
    for (int p = 0; p < CONCURRENCY; p++) {
        char pipeline[32];
        const char *needles[] = {"broker connected", pipeline, NULL};

        snprintf(pipeline, sizeof(pipeline), "pipeline=%d ", p);
        assert_true(relay_log_find(&relay, 0, true, needles, line, sizeof(line)) > 0);
        before[p] = endpoint_port(line);
        assert_int_not_equal(node_of_port(f, before[p]), 0);
    }
    stopped = node_of_port(f, before[0]);
    stop_at = wall_clock_seconds();
    node_action(f, stopped, "stop_app");
    printf("ha: stopped node %d (127.0.0.1:%d) after %lld rows succeeded\n", stopped,
           f->ports[stopped - 1], count_where(f, "state = 'succeeded'"));

    for (int p = 0; p < CONCURRENCY; p++) {
        char pipeline[32], lost_line[2048];
        const char *connected[] = {"broker connected", pipeline, NULL};
        const char *lost[] = {"broker connection lost", pipeline, NULL};
        double at = -1, lost_at;

        if (before[p] != f->ports[stopped - 1])
            continue;
        snprintf(pipeline, sizeof(pipeline), "pipeline=%d ", p);
        for (int waited = 0; at < 0 && waited < 60000; waited += 100) {
            usleep(100 * 1000);
            at = relay_log_find(&relay, stop_at, false, connected, line, sizeof(line));
        }
        if (at < 0) {
            relay_dump_log(&relay);
            fail_msg("pipeline %d did not reconnect within 60 s of stop_app", p);
        }
        assert_int_not_equal(endpoint_port(line), f->ports[stopped - 1]);
        assert_int_not_equal(node_of_port(f, endpoint_port(line)), 0);
        /* the clock starts when the pipeline lost its node: stop_app's own time is RabbitMQ's */
        lost_at = relay_log_find(&relay, stop_at, false, lost, lost_line, sizeof(lost_line));
        if (lost_at < 0 || lost_at > at) {
            relay_dump_log(&relay);
            fail_msg("pipeline %d did not log the loss of node %d before reconnecting", p,
                     stopped);
        }
        printf("ha: pipeline %d lost node %d %.2f s after stop_app began and published through"
               " 127.0.0.1:%d %.2f s after that\n",
               p, stopped, lost_at - stop_at, endpoint_port(line), at - lost_at);
        if (at - lost_at > worst)
            worst = at - lost_at;
        if (at - lost_at > RECONNECT_LIMIT_SECONDS) {
            relay_dump_log(&relay);
            fail_msg("pipeline %d took %.1f s to reconnect, more than %.0f s", p, at - lost_at,
                     RECONNECT_LIMIT_SECONDS);
        }
    }

    ha_producer_join(&producer);
    if (producer.error[0] != '\0')
        fail_msg("%s", producer.error);
    assert_int_equal(producer.committed, ROWS);
    assert_int_equal(producer.in_doubt, 0);
    ha_wait_all_succeeded(f->conn, &relay);
    assert_int_equal(count_where(f, "true"), ROWS);

    /* nothing is counted on the stopped node any more; every pipeline is counted once */
    metrics = relay_scrape_metrics(metrics_port);
    assert_non_null(metrics);
    assert_int_equal(endpoint_gauge(metrics, f->ports[stopped - 1]), 0);
    {
        long long total = 0;

        for (int i = 0; i < NODES; i++)
            total += endpoint_gauge(metrics, f->ports[i]);
        assert_int_equal(total, CONCURRENCY);
    }
    free(metrics);

    relay_signal(&relay, SIGTERM);
    assert_int_equal(relay_wait(&relay, 30000), 0);

    survivor = stopped == 1 ? 2 : 1;
    node_url(f, survivor, url, sizeof(url));
    ha_drain_amqp(f->conn, url, f->queue, &delivery);
    printf("ha: rabbitmq node stop: %lld rows, %lld messages, %lld distinct, %lld duplicates,"
           " %lld strays; reconnected within %.2f s of the loss\n",
           delivery.rows, delivery.messages, delivery.unique, delivery.duplicates,
           delivery.strays, worst);
    assert_int_equal(delivery.strays, 0);
    assert_int_equal(delivery.unique, ROWS);
    ha_producer_clear(&producer);
    unlink(relay.log_path);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_check_names_the_node_that_is_down, setup, teardown),
        cmocka_unit_test_setup_teardown(test_node_stop_mid_run, setup, teardown),
    };

    return cmocka_run_group_tests_name("ha_rabbitmq", tests, group_setup, ha_group_teardown);
}
