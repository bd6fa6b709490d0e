/*
 * store_internal.h - what the store's files share: the connection struct,
 * the table of prepared statements with the privileges each needs, the
 * deadline-bounded ways to run them, and PostgreSQL array literals.
 *
 * Every statement a store sends on its own connection is a row of
 * store_statements[]: prepared once at connect, run with bound parameters
 * only, and waited for at most STORE_STATEMENT_DEADLINE_MS. The privilege
 * audit walks the same rows, so a statement cannot be added without naming
 * what it needs. Nothing here is exported from the library.
 */
#ifndef OUTBOX_STORE_INTERNAL_H
#define OUTBOX_STORE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "buffer.h"
#include "outbox.h"

/*
 * The server cancels a statement after STORE_STATEMENT_TIMEOUT (and a lock
 * wait as long); if no answer came STORE_STATEMENT_DEADLINE_MS after we
 * began to wait, the server is stalled and the connection is dropped.
 */
#define STORE_STATEMENT_TIMEOUT "10s"
#define STORE_STATEMENT_DEADLINE_MS 12000

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

/*
 * Every statement the store prepares, by name in the code (a typo cannot
 * compile) and by its server-side name in store_statements[].
 */
enum statement {
    STMT_CLAIM_ALL,
    STMT_CLAIM_QUEUES,
    STMT_CLAIM_ALL_PAUSED,
    STMT_CLAIM_QUEUES_PAUSED,
    STMT_PAUSES,
    STMT_EXTEND,
    STMT_COMPLETE,
    STMT_COMPLETE_DELETE,
    STMT_RELEASE,
    STMT_FAIL,
    STMT_REAP,
    STMT_BACKLOG,
    STMT_HORIZON,
    STMT_SWEEP_HELD,
    STMT_CLEANUP_CUTOFF,
    STMT_CLEANUP_BATCH,
    STMT_TABLE_SAMPLE,
    STMT_COUNT,
};

/* What a privilege is on: a table (or view) of a schema, or a function. */
enum store_need_kind {
    STORE_NEED_NONE,     /* ends a statement's list */
    STORE_NEED_TABLE,    /* detail: the privilege, SELECT, UPDATE or DELETE */
    STORE_NEED_FUNCTION, /* detail: the argument types, as regtype prints them */
};

/* One privilege a statement needs: on schema.name, as detail says. */
struct store_need {
    enum store_need_kind kind;
    const char *schema;
    const char *name;
    const char *detail;
};

/* Room for the longest list of needs, plus its end. */
#define STORE_NEEDS_MAX 16

struct store_statement {
    const char *name; /* server-side name */
    const char *sql;
    struct store_need needs[STORE_NEEDS_MAX]; /* ends at the first STORE_NEED_NONE */
};

extern const struct store_statement store_statements[STMT_COUNT];

struct outbox_store {
    PGconn *conn;
    char *worker_id;
    bool listening;
    bool block_on_dead_head; /* ordering: a dead head keeps its key blocked */
    bool delete_on_success;  /* complete deletes the row instead of marking it succeeded */
    char *sweep_queue;       /* where the sweep of held rows goes on; NULL: from the start */
    char *sweep_key;
    /* statements sent in pipeline mode whose results are not collected yet, oldest first */
    enum statement queued[STORE_QUEUE_MAX];
    int queued_count;
    struct store_pauses pauses;
};

/* ---- running statements (store.c) ---- */

/* Waits for the next result within the deadline; OUTBOX_ERR_TIMEOUT past it. */
int store_await_result(outbox_store *store, const char *context, struct outbox_error *err);
/* Collects a statement sent outside pipeline mode; its last result, or NULL with err. */
PGresult *store_await_last_result(outbox_store *store, const char *context,
                                  struct outbox_error *err);
/* Runs sql (one or more statements, no parameters) within the deadline; its last result. */
PGresult *store_exec_bounded(outbox_store *store, const char *sql, const char *context,
                             struct outbox_error *err);
/* Runs a prepared statement and waits; NULL with err unless its status is expected. */
PGresult *store_run_prepared(outbox_store *store, enum statement statement, int nparams,
                             const char *const *values, ExecStatusType expected,
                             const char *context, struct outbox_error *err);
/* Sends a prepared statement in pipeline mode without waiting (see store.c). */
int store_queue_prepared(outbox_store *store, enum statement statement, int nparams,
                         const char *const *values, const char *context,
                         struct outbox_error *err);
/* The result of the statement queued first, which must be statement (any claim for a claim). */
PGresult *store_collect_prepared(outbox_store *store, enum statement statement,
                                 ExecStatusType expected, const char *context,
                                 struct outbox_error *err);

/* ---- privileges (store_privileges.c) ---- */

/* A privilege role lacks: OUTBOX_ERR_CONFIG, SQLSTATE 42501; returns -1. */
int store_missing_privilege(struct outbox_error *err, const char *role, const char *what);
/* The first privilege of store_statements[] the session lacks, DELETE only when with_delete. */
int store_check_privileges(outbox_store *store, bool with_delete, struct outbox_error *err);

/* ---- pauses (store_worker.c) ---- */

/* Reads the pauses now; nothing may be queued. */
int store_pauses_read(outbox_store *store, struct outbox_error *err);

/* ---- PostgreSQL array literals (store_array.c) ---- */

/*
 * An array literal built element by element ("{1,2,3}", "{\"a\",\"b\"}"),
 * passed as one text parameter and cast by the statement. Allocation
 * failures surface once, from store_array_finish().
 */
struct pg_array {
    struct buffer text;
    size_t count;
};

void store_array_add_int(struct pg_array *a, long long value);
void store_array_add_double(struct pg_array *a, double value);
void store_array_add_bool(struct pg_array *a, bool value);
void store_array_add_null(struct pg_array *a);
/* A double-quoted element: any text, with '"' and '\' escaped. */
void store_array_add_text(struct pg_array *a, const char *text);
/* Closes the literal; its text, or NULL when out of memory. */
const char *store_array_finish(struct pg_array *a);
void store_array_clear(struct pg_array *a);

#endif
