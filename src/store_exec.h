/*
 * store_exec.h - a store's connection state and the deadline-bounded ways
 * to run statements on it.
 *
 * Every statement of store_statements[] is run here, with bound parameters,
 * and waited for at most STORE_STATEMENT_DEADLINE_MS. The store's other
 * files (connect, worker protocol, privileges, producer, maintenance) all
 * stand on this one; store_exec.c calls none of them. Nothing here is
 * exported from the library.
 */
#ifndef OUTBOX_STORE_EXEC_H
#define OUTBOX_STORE_EXEC_H

#include <stdbool.h>

#include "outbox.h"
#include "store_statements.h"
#include "timeouts.h" /* STORE_STATEMENT_TIMEOUT_SECONDS, STORE_STATEMENT_DEADLINE_MS */

/* At most this many statements are sent ahead of their results: the four
 * callers may send, and a read of the pauses ahead of a claim. */
#define STORE_QUEUE_MAX 5

/* The pauses as claim parameters (array literals), from the pauses statement. */
struct store_pauses {
    bool any;
    char *queues;     /* whole queues paused */
    char *key_queues; /* with keys: the (queue, key) pairs paused */
    char *keys;
    double read_at; /* monotonic seconds; 0: read before the next claim */
    bool pending;   /* a read is sent ahead and not collected yet */
    double sent_at; /* when that read was sent */
};

struct outbox_store {
    PGconn *conn;
    char *worker_id;
    bool listening;
    bool block_on_dead_head; /* ordering: a dead head keeps its key blocked */
    bool delete_on_success;  /* complete deletes the row instead of marking it succeeded */
    char *sweep_queue;       /* where the sweep of held rows goes on; NULL: from the start */
    char *sweep_key;
    /* statements sent in pipeline mode whose results are not collected yet, oldest first,
     * each with whether its Prepare went ahead of it */
    enum statement queued[STORE_QUEUE_MAX];
    bool queued_prepare[STORE_QUEUE_MAX];
    int queued_count;
    bool prepared[STMT_COUNT]; /* prepared on this connection (or its Prepare sent) */
    struct store_pauses pauses;
};

/* Waits for the next result within the deadline; OUTBOX_ERR_TIMEOUT past it. */
int store_await_result(outbox_store *store, const char *context, struct outbox_error *err);
/* Collects a statement sent outside pipeline mode; its last result, or NULL with err. */
PGresult *store_await_last_result(outbox_store *store, const char *context,
                                  struct outbox_error *err);
/* Runs sql (one or more statements, no parameters) within the deadline; its last result. */
PGresult *store_exec_bounded(outbox_store *store, const char *sql, const char *context,
                             struct outbox_error *err);
/* Prepares statement now unless it is; nothing may be queued. 0, or -1 with err. */
int store_prepare(outbox_store *store, enum statement statement, struct outbox_error *err);
/* Runs a prepared statement (prepared first unless it is) and waits; NULL with err unless its
 * status is expected. */
PGresult *store_run_prepared(outbox_store *store, enum statement statement, int nparams,
                             const char *const *values, ExecStatusType expected,
                             const char *context, struct outbox_error *err);
/* Sends a prepared statement in pipeline mode without waiting, its Prepare ahead of it
 * unless it is prepared (see store_exec.c). */
int store_queue_prepared(outbox_store *store, enum statement statement, int nparams,
                         const char *const *values, const char *context,
                         struct outbox_error *err);
/* The result of the statement queued first, which must be statement (any claim for a claim). */
PGresult *store_collect_prepared(outbox_store *store, enum statement statement,
                                 ExecStatusType expected, const char *context,
                                 struct outbox_error *err);

#endif
