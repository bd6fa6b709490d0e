/*
 * store_stream_sql.h - the statements of stream queues (store_stream_sql.c):
 * prepared once per connection by store_stream.c, taking bound parameters
 * only; the lag and horizon queries also run unprepared on a caller's
 * connection (store_stream_admin.c).
 */
#ifndef OUTBOX_STORE_STREAM_SQL_H
#define OUTBOX_STORE_STREAM_SQL_H

enum stream_statement {
    SSTMT_ACQUIRE,
    SSTMT_RENEW,
    SSTMT_RELEASE,
    SSTMT_READ,
    SSTMT_ADVANCE,
    SSTMT_LAG,
    SSTMT_HORIZON,
    SSTMT_CLEANUP,
    SSTMT_KEY_LATER,
    SSTMT_MEMBER,
    SSTMT_LEAVE,
    SSTMT_SURPLUS,
    SSTMT_KEY_CLEANUP,
    SSTMT_REBASE,
    SSTMT_PENDING,
    SSTMT_COUNT,
};

/* A statement's prepared name and its text. */
struct stream_statement_text {
    const char *name;
    const char *sql;
};

extern const struct stream_statement_text stream_statements[SSTMT_COUNT];

/* The lag of every partition, and the transaction at the horizon (their columns: the readers'). */
extern const char stream_sql_lag[];
extern const char stream_sql_horizon[];

/*
 * Whether the database holds the row of job id $1 with identity $2 (any, ''),
 * in transaction $3: a check a broker's order record asks, rare enough to
 * run unprepared on whichever connection asks it (stream_row_held).
 */
extern const char stream_sql_row_held[];

#endif
