/*
 * store_admin_lock.h - administrative statements that take a strong lock on
 * outbox.job without stopping producers behind them.
 *
 * A statement waiting for a lock on outbox.job queues every later lock
 * request of the table behind its own: with one producer transaction open,
 * `CREATE TRIGGER` (SHARE ROW EXCLUSIVE) stopped the inserts of every queue
 * for as long as that transaction stayed open. Here such a statement runs
 * in a transaction of its own that waits for any lock at most a short try
 * (lock_timeout), so producers wait at most that long; the caller tries
 * again between pauses, and can name the sessions it waits for. Nothing
 * here is exported from the library.
 */
#ifndef OUTBOX_STORE_ADMIN_LOCK_H
#define OUTBOX_STORE_ADMIN_LOCK_H

#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

#include "outbox.h"

/* The lock a statement takes on outbox.job, for naming who holds it off. */
enum store_job_lock {
    STORE_LOCK_SHARE_ROW_EXCLUSIVE, /* CREATE TRIGGER: conflicts with writers */
    STORE_LOCK_ACCESS_EXCLUSIVE,    /* DROP TRIGGER: conflicts with every session using the table */
};

/*
 * Runs sql with params on conn (autocommit, idle) in a transaction of its
 * own that waits at most lock_timeout_ms for each lock, expecting one
 * boolean row; *value gets it. A lock not granted in time rolls everything
 * back and fails with OUTBOX_ERR_BUSY and SQLSTATE 55P03 (see
 * store_lock_timed_out()).
 */
int store_admin_boolean_locked(PGconn *conn, const char *sql, int nparams,
                               const char *const *values, int lock_timeout_ms, bool *value,
                               const char *context, struct outbox_error *err);

/* True when err is a lock not granted within the try's lock_timeout. */
bool store_lock_timed_out(const struct outbox_error *err);

/*
 * Writes into out (size bytes, one line) the sessions that now hold a lock
 * on outbox.job conflicting with lock: "pid 4242 (user \"app\", idle in
 * transaction, transaction open 21 s)", comma-separated, a prepared
 * transaction as such; "" when none does (the wait was on another lock).
 * Names and application names are quoted as JSON strings, so the line holds
 * no control character. pids (pids_size bytes) gets their pids alone
 * ("4242,4250"), to tell whether the holders changed.
 */
int store_job_lock_holders(PGconn *conn, enum store_job_lock lock, char *out, size_t size,
                           char *pids, size_t pids_size, struct outbox_error *err);

#endif
