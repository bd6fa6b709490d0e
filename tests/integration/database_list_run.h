/*
 * database_list_run.h - what the tests of a relay of many databases
 * (--databases FILE) share: databases made with their own identity and
 * rows, the list's file, relays started over it, and the checks of what
 * reached Redis and what PostgreSQL saw.
 *
 * Rows are enqueued with payload {"db": ID, "n": K}, ID the database's
 * identity, K numbered from 1 in each database. Like harness.h, these fail
 * the current cmocka test on an error. Include <cmocka.h> (with its
 * prelude) before this header.
 */
#ifndef OUTBOX_TESTS_DATABASE_LIST_RUN_H
#define OUTBOX_TESTS_DATABASE_LIST_RUN_H

#include <stdbool.h>

#include <libpq-fe.h>

#include "relay_runner.h"

#define LIST_RUN_MAX_DATABASES 40
#define LIST_RUN_QUEUE "orders"

/* One broker's run: how many databases, rows and connections. */
struct broker_case {
    const char *name;
    const char *url_variable; /* OUTBOX_TEST_*_URL */
    int databases;            /* listed at start; one more is added while the relays run */
    int rows;                 /* per database before the kill */
    int more_rows;            /* per database after it */
    int budget;               /* --max-db-connections of each relay */
    const char *lease;        /* --lease, NULL: the default */
    /*
     * The relay's option naming where the rows go, given run->prefix:
     * --stream-prefix (Redis), --topic-prefix (Kafka: the topic prefix +
     * QUEUE, made by the test), --exchange (AMQP: bound to the queue prefix
     * with key QUEUE); prefix_end ends the prefix (":" for Redis keys).
     */
    const char *prefix_option;
    const char *prefix_end;
};

struct run {
    const struct broker_case *bc;
    char *urls[LIST_RUN_MAX_DATABASES];
    PGconn *conns[LIST_RUN_MAX_DATABASES];
    char ids[LIST_RUN_MAX_DATABASES][48];
    int count; /* databases made */
    char list_path[256];
    char prefix[64]; /* Redis stream prefix, or the AMQP queue name */
    PGconn *admin;
};

/*
 * Starts run: the admin connection, the list's path and the stream prefix
 * named by tag and the test's pid (databases-TAG-PID.list, mdb-TAG-PID:),
 * and count databases made (run->bc set by the caller).
 */
void list_run_begin(struct run *run, const char *tag, int count);

/* Makes database i: its own identity, then bc->rows rows numbered from 1. */
void list_run_make_database(struct run *run, int i);

/* Adds the rows numbered first to last to database i. */
void list_run_enqueue_into(struct run *run, int i, int first, int last);

/* Adds the rows numbered first to last to each of the first databases. */
void list_run_enqueue(struct run *run, int databases, int first, int last);

/* Writes the list of the first databases (db0, db1...), with an unreachable one when asked. */
void list_run_write_list(const struct run *run, int databases, bool with_unreachable);

/* Starts a relay over the list under application name name; its metrics on port (0: off). */
void list_run_start_relay(struct run *run, struct relay_process *relay, const char *name, int port);

/* Rows not yet succeeded, summed over the databases. */
long long list_run_rows_left(const struct run *run);

/*
 * Redis: one entry per row of every database, each under its own database's
 * message id and payload, none twice: rows_each rows in each database but
 * the last, last_rows in it. Deletes the run's streams.
 */
void list_run_check_redis(struct run *run, int rows_each, int last_rows);

/* Sessions ever opened to the run's databases (pg_stat_database.sessions). */
long long list_run_sessions_opened(const struct run *run);

/*
 * Connections open under application_name name: the fewer of two looks 50 ms
 * apart, since a backend whose client closed its connection is still listed
 * until it has exited, while the client may already have opened the next.
 */
long long list_run_connections_of(PGconn *admin, const char *name);

/* The same, to database datname only. */
long long list_run_connections_to(PGconn *admin, const char *name, const char *datname);

/* The relays' statistics watch sessions (named by each relay, whatever PGAPPNAME says). */
long long list_run_watch_connections(PGconn *admin);

/* The databases a relay's /metrics body says it serves. */
int list_run_served_count(const char *metrics);

/* The log lines of relay that contain both needles. */
int list_run_log_lines_with(const struct relay_process *relay, const char *a, const char *b);

/*
 * Which of count relays (those running) owner names: a worker prefix or an
 * owner name made from one (host:pid:uuid...); -1 for NULL or none.
 */
int list_run_relay_of(const struct relay_process *relays, const bool *running, int count,
                      const char *owner);

/* Closes the run's connections, drops its databases, removes the list's file. */
void list_run_drop(struct run *run);

#endif
