/*
 * store_console.h - the queries behind the operator's console (outboxctl
 * serve): the overview at a glance, the stream partitions, the traffic
 * chart (its dead rows, with their payloads, are store_dead.h's).
 *
 * Nothing here scans the whole of outbox.job on a large table: ready,
 * running and dead rows are counted from their partial indexes, and stream
 * rows waiting after their cursor from job_stream_idx, so their cost
 * follows the backlog; succeeded rows and published stream rows, the bulk
 * of a busy table, are counted exactly only while the table is small and
 * estimated from the planner's statistics beyond that (the overview says
 * which). Same conventions as store_admin.h: caller-owned connection with
 * no transaction open, bound parameters, results released by the matching
 * *_clear().
 */
#ifndef OUTBOX_STORE_CONSOLE_H
#define OUTBOX_STORE_CONSOLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "outbox.h"
#include "store_admin.h"
#include "store_stream.h"

/* Above this heap size succeeded rows are estimated instead of counted. */
#define STORE_CONSOLE_EXACT_BYTES (64 * 1024 * 1024)

/* A worker id holding leases (a relay seen at work). */
struct store_console_relay {
    char *worker_id;
    int64_t rows;            /* running rows it holds */
    double lease_min_seconds; /* seconds until its first lease expires (< 0: expired) */
    double lease_max_seconds;
};

struct store_console_overview {
    struct store_status status;  /* queues and blocked keys; no cleanup sample */
    bool succeeded_estimated;    /* queues[].succeeded come from planner statistics */
    struct store_console_relay *relays;
    size_t relay_count;
};

/* What store_console_overview() reads, or-ed together: each page asks for what it shows. */
#define STORE_CONSOLE_QUEUES 1u  /* the counts per queue (with their blocked and paused marks) */
#define STORE_CONSOLE_BLOCKED 2u /* blocked keys */
#define STORE_CONSOLE_PAUSED 4u  /* pauses */
#define STORE_CONSOLE_RELAYS 8u  /* relays holding leases */
#define STORE_CONSOLE_TABLE 16u  /* schema version, table figures, the vacuum horizon */
#define STORE_CONSOLE_EVERYTHING 31u

/*
 * Fills the parts of overview that parts names, the others left empty
 * (see the header comment for what is exact).
 */
int store_console_overview(PGconn *conn, unsigned parts, struct store_console_overview *overview,
                           struct outbox_error *err);
void store_console_overview_clear(struct store_console_overview *overview);

/*
 * Every stream partition's lag, owner and lease (stream_admin_lag()), and,
 * when there is any, the transaction at the snapshot horizon that every
 * stream's read waits for (stream_admin_horizon()).
 */
struct store_console_streams {
    struct stream_lag *partitions; /* by queue, then partition */
    size_t count;
    struct stream_horizon horizon; /* found false when no stream or no holder */
};

int store_console_streams(PGconn *conn, struct store_console_streams *streams,
                          struct outbox_error *err);
void store_console_streams_clear(struct store_console_streams *streams);

#define STORE_CONSOLE_CHART_MINUTES 60

/*
 * Rows enqueued (created_at of rows still in the table) and published
 * (succeeded rows by finished_at) per minute over the last hour, oldest
 * minute first; minute_epoch is the start of each minute.
 */
struct store_console_chart {
    int64_t minute_epoch[STORE_CONSOLE_CHART_MINUTES];
    int64_t enqueued[STORE_CONSOLE_CHART_MINUTES];
    int64_t published[STORE_CONSOLE_CHART_MINUTES];
};

/*
 * Fills chart's minutes, and counts the rows of those from from_epoch on
 * (0: all of them; the others stay 0). Published rows come from
 * job_succeeded_idx; enqueued rows from the primary key, after a binary
 * search (in the same statement) for the first job_id created since then,
 * as job ids grow with created_at: both cost the rows counted, not the
 * table's.
 */
int store_console_chart(PGconn *conn, int64_t from_epoch, struct store_console_chart *chart,
                        struct outbox_error *err);

/*
 * One database at a glance, for the console's Databases view: its schema,
 * identity, whole-database pause and lease (outbox.database_lease), and its
 * rows as the overview counts them (store_console_overview() with
 * STORE_CONSOLE_QUEUES, summed over the queues).
 */
struct store_console_database {
    int schema_version;
    bool identity_present; /* false before migration 015 */
    struct store_identity_row identity;
    bool lease_present; /* false before migration 018: no pause, no lease */
    char *paused_at;    /* ISO 8601 UTC; NULL: not paused */
    char *paused_by;
    char *pause_reason; /* NULL when none was given */
    char *lease_owner;  /* the relay of a list holding the lease; NULL: none */
    char *lease_until;  /* ISO 8601 UTC; NULL: none */
    int64_t ready, running, dead;
    int64_t waiting; /* stream rows after their partition's cursor */
};

/* Fills database; 0, or -1 with err (OUTBOX_ERR_SCHEMA on a database without the schema). */
int store_console_database(PGconn *conn, struct store_console_database *database,
                           struct outbox_error *err);
void store_console_database_clear(struct store_console_database *database);

#endif
