/*
 * ha_common.h - what the failover tests share: starting their own servers,
 * a producer that keeps committing rows through a failover, and the final
 * count of what reached the broker.
 *
 * The tests of tests/ha run under tests/run.sh ha, one after the other, on
 * the usual stack (PostgreSQL, RabbitMQ, Redis, Kafka). A test that needs more (a
 * RabbitMQ cluster, a standby it may crash) starts it with
 * ha_start_servers() in a stack directory of its own inside
 * OUTBOX_TEST_STACK_DIR, so that what it breaks is never shared; stopping
 * the outer stack stops it too. Include <cmocka.h> (with its prelude)
 * before this header.
 */
#ifndef OUTBOX_TEST_HA_COMMON_H
#define OUTBOX_TEST_HA_COMMON_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include <libpq-fe.h>

/*
 * Starts the NULL-terminated services (stack.sh names, e.g. "postgres",
 * "rabbitmq-cluster") in the stack directory OUTBOX_TEST_STACK_DIR/name,
 * prints how long that took, and loads that stack's environment: its
 * OUTBOX_TEST_* variables replace the outer stack's, the others stay.
 * Fails the test when they do not start.
 */
void ha_start_servers(const char *name, const char *const services[]);

/* Stops what ha_start_servers() started (for a group teardown). */
void ha_stop_servers(void);

/*
 * cmocka group setup and teardown of a test that needs one cluster: the
 * stack.sh service cluster (e.g. "kafka-cluster") started with
 * ha_start_servers() in a stack directory of the same name, then stopped.
 */
int ha_start_cluster(const char *cluster);
int ha_group_teardown(void **state);

struct relay_process;

/*
 * Waits up to 120 s until a third of rows have succeeded (mid-run, the
 * moment to break something); dumps relay's log and fails the test when not.
 */
void ha_wait_third_through(PGconn *conn, struct relay_process *relay, int rows);

/*
 * Waits up to 180 s (after the last commit) until no row is left
 * unsucceeded; dumps relay's log and fails the test when some are.
 */
void ha_wait_all_succeeded(PGconn *conn, struct relay_process *relay);

/* Runs stack.sh COMMAND $DIR ARGS... (NULL-terminated), printing it; fails the test unless it exits 0. */
void ha_stack(const char *const args[]);

/*
 * A producer thread: commits rows transactions of rows_per_commit rows
 * each (autocommit statements calling outbox.enqueue) into queue until it
 * has committed total rows, pausing pause_ms between commits. A failed
 * commit (a connection lost mid-failover) is in doubt: the producer
 * reconnects and goes on, for at most 120 s of failures in a row.
 */
struct ha_producer {
    /* set by the caller */
    const char *database_url;
    const char *queue;
    int total;
    int rows_per_commit;
    int pause_ms;
    /* results, read after ha_producer_join() */
    long long *committed_ids; /* job ids of acknowledged commits */
    long long committed;      /* rows acknowledged */
    long long in_doubt;       /* rows of commits that failed without an answer */
    char error[512];          /* why it gave up, "" when it did not */
    pthread_t thread;
    atomic_llong progress; /* rows acknowledged so far, read while it runs */
};

void ha_producer_start(struct ha_producer *producer);
void ha_producer_join(struct ha_producer *producer);
void ha_producer_clear(struct ha_producer *producer);

/* What the broker holds for one queue, next to the rows of that queue. */
struct ha_delivery {
    long long rows;       /* rows of the queue in outbox.job */
    long long messages;   /* messages drained from the broker */
    long long unique;     /* distinct message ids among them */
    long long duplicates; /* messages - unique */
    long long strays;     /* message ids that are no row of the queue */
};

/*
 * Drains the AMQP queue through broker_url (one endpoint) and compares the
 * message ids with the job ids of queue's rows in conn's database.
 */
void ha_drain_amqp(PGconn *conn, const char *broker_url, const char *queue,
                   struct ha_delivery *delivery);

#endif
