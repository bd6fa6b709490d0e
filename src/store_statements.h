/*
 * store_statements.h - the table of every statement a store prepares, with
 * the privileges each needs.
 *
 * Every statement a store sends on its own connection is a row of
 * store_statements[]: prepared once at connect and run with bound
 * parameters only. The privilege audit walks the same rows, so a statement
 * cannot be added without naming what it needs. This is the store's ground
 * floor: plain data, it calls nothing. Nothing here is exported.
 */
#ifndef OUTBOX_STORE_STATEMENTS_H
#define OUTBOX_STORE_STATEMENTS_H


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

#ifdef OUTBOX_MUTANTS
/* The statement's text as the mutant OUTBOX_MUTANT names has it (store_mutants.c). */
const char *store_mutant_sql(enum statement statement, const char *sql);
#endif

#endif
