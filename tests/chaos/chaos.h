/*
 * chaos.h - the fault-injection driver: proves that no committed row is lost
 * and no rolled-back row is published while relays, brokers, PostgreSQL and
 * the network between them fail at random moments.
 *
 * One run, on a fresh database cloned from the test template:
 *   - producer threads commit real business transactions (an order row plus
 *     its outbox row) at a steady rate; some roll back, some reuse an
 *     idempotency key, about half carry an ordering key out of a few hundred;
 *     a third of the rows (every third ordering key) go to a stream queue of
 *     4 partitions (sql/009_stream.sql), the rest to a row-state queue
 *   - three relays on that database, reaching PostgreSQL and the broker
 *     through loopback TCP proxies (tests/chaos/proxy.h)
 *   - faults at random moments from a seed (printed; OUTBOX_CHAOS_SEED
 *     replays the schedule): kill -9 and restart of a relay, SIGSTOP longer
 *     than the lease then SIGCONT, broker stop/start, PostgreSQL fast
 *     restart, proxy cut / stall / slow
 *   - a trigger on outbox.job logs every state transition to an audit table
 * Relays mark published rows succeeded, or with delete_on_success delete
 * them (--on-success delete); the audit logs deletes like any transition.
 * Then the faults stop, the relays drain and stop, every message is read
 * from the broker, and the verdict is printed: every committed row
 * succeeded and was delivered (exactly once on Redis), no rolled-back row
 * was delivered, per ordering key the first deliveries are in job_id order,
 * and every fenced write was made by the owner of the current claim before
 * its lease ended.
 *
 * Runs inside a cmocka test (setup errors fail the test through the
 * integration harness) with the environment of tests/run.sh.
 */
#ifndef OUTBOX_CHAOS_H
#define OUTBOX_CHAOS_H

#include <stdbool.h>
#include <stdint.h>

#include <libpq-fe.h>

enum chaos_broker {
    CHAOS_RABBITMQ,
    CHAOS_REDIS,
};

struct chaos_options {
    enum chaos_broker broker;
    int seconds;   /* how long producers and faults run (the drain comes after) */
    uint64_t seed; /* the fault schedule */
    int rate;      /* business transactions per second, all producers together */
    bool soak;     /* also judge the relay's memory and descriptors over time */
    bool delete_on_success; /* relays run with --on-success delete */
};

/*
 * Fills options from the environment: OUTBOX_CHAOS_SECONDS (default
 * default_seconds), OUTBOX_CHAOS_SEED (default: from the clock),
 * OUTBOX_CHAOS_RATE (default 150), OUTBOX_CHAOS_SOAK (1: soak checks).
 */
void chaos_options_from_env(struct chaos_options *options, enum chaos_broker broker,
                            int default_seconds);

/*
 * Creates the driver's business table and the audit of outbox.job (a
 * trigger logging every transition with the session's application_name)
 * in the database of conn.
 */
void chaos_audit_install(PGconn *conn);

/*
 * The audited writes that break the lease protocol: a change of a running
 * row (extend, complete, fail, release) not made by the session, worker and
 * generation of its latest claim or made after its lease ended, and reaps
 * before the lease ended.
 */
long long chaos_audit_violations(PGconn *conn);

/* Runs the driver, prints the verdict; true when every check passed. */
bool chaos_run(const struct chaos_options *options);

#endif
