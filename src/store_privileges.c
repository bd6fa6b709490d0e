/*
 * store_privileges.c - the audit of the privileges a store's role needs.
 *
 * The list is never kept by hand: it is every need of every row of
 * store_statements[], each once, after USAGE on schema outbox. Objects are
 * found through the catalogs, which need no privilege, so a missing USAGE is
 * reported instead of failing the lookup; a function this server does not
 * have (extract() before PostgreSQL 14) is not checked. The first privilege
 * missing is reported, tables before functions.
 */
#include <stdio.h>
#include <string.h>

#include "buffer.h"
#include "error.h"
#include "store_privileges.h"

#define AUDIT_CONTEXT "unable to read the role's privileges"

/* Every distinct need, with its place in the report. */
#define AUDIT_NEEDS_MAX 64

struct audit_entry {
    const struct store_need *need;
    int position;
};

struct audit {
    struct audit_entry entries[AUDIT_NEEDS_MAX];
    size_t count;
    const char *tables[AUDIT_NEEDS_MAX]; /* table names in order of first use */
    size_t table_count;
};

static bool
same_need(const struct store_need *a, const struct store_need *b)
{
    return a->kind == b->kind && strcmp(a->schema, b->schema) == 0 &&
           strcmp(a->name, b->name) == 0 && strcmp(a->detail, b->detail) == 0;
}

/*
 * Where a need stands in the report: a table's SELECT, UPDATE, DELETE in
 * that order, tables in order of first use, then functions in order of
 * first use.
 */
static int
audit_position(struct audit *audit, const struct store_need *need)
{
    static const char *const ranks[] = {"SELECT", "UPDATE", "DELETE"};
    size_t table = 0, rank = 0;

    if (need->kind == STORE_NEED_FUNCTION)
        return 1000 + (int)audit->count;
    while (table < audit->table_count && strcmp(audit->tables[table], need->name) != 0)
        table++;
    if (table == audit->table_count)
        audit->tables[audit->table_count++] = need->name;
    while (rank < 3 && strcmp(ranks[rank], need->detail) != 0)
        rank++;
    return (int)(table * 4 + rank) + 1;
}

/* Adds need once; DELETE only with_delete. */
static void
audit_add(struct audit *audit, const struct store_need *need, bool with_delete)
{
    if (need->kind == STORE_NEED_TABLE && !with_delete && strcmp(need->detail, "DELETE") == 0)
        return;
    for (size_t i = 0; i < audit->count; i++)
        if (same_need(audit->entries[i].need, need))
            return;
    if (audit->count == AUDIT_NEEDS_MAX)
        return; /* the table outgrew the audit: store_check_privileges() says so */
    audit->entries[audit->count].position = audit_position(audit, need);
    audit->entries[audit->count].need = need;
    audit->count++;
}

/* Appends text as a SQL string literal. */
static void
put_literal(struct buffer *sql, const char *text)
{
    buffer_putc(sql, '\'');
    for (; *text != '\0'; text++) {
        if (*text == '\'')
            buffer_putc(sql, '\'');
        buffer_putc(sql, *text);
    }
    buffer_putc(sql, '\'');
}

/* The needs as a VALUES list of (position, kind, schema_name, name, detail). */
static void
put_needs(struct buffer *sql, const struct audit *audit)
{
    for (size_t i = 0; i < audit->count; i++) {
        const struct store_need *need = audit->entries[i].need;

        buffer_printf(sql, "%s(%d, '%s', ", i == 0 ? "" : ", ", audit->entries[i].position,
                      need->kind == STORE_NEED_TABLE ? "table" : "function");
        put_literal(sql, need->schema);
        buffer_puts(sql, ", ");
        put_literal(sql, need->name);
        buffer_puts(sql, ", ");
        put_literal(sql, need->detail);
        buffer_putc(sql, ')');
    }
}

/* The audit statement: the first need not granted, with the role's name. */
static void
build_audit(struct buffer *sql, const struct audit *audit)
{
    buffer_puts(sql, "WITH need (position, kind, schema_name, name, detail) AS (VALUES ");
    put_needs(sql, audit);
    buffer_puts(
        sql,
        "), checked (position, what, granted) AS ("
        "  SELECT 0, 'USAGE on schema outbox', has_schema_privilege(oid, 'USAGE')"
        "   FROM pg_catalog.pg_namespace WHERE nspname = 'outbox'"
        "  UNION ALL SELECT w.position, w.detail || ' on table ' || w.schema_name || '.' || w.name,"
        "   has_table_privilege(c.oid, w.detail)"
        "   FROM need AS w JOIN pg_catalog.pg_namespace AS n ON n.nspname = w.schema_name"
        "   JOIN pg_catalog.pg_class AS c ON c.relnamespace = n.oid AND c.relname = w.name"
        "   WHERE w.kind = 'table'"
        "  UNION ALL SELECT w.position, 'EXECUTE on function '"
        "    || CASE WHEN w.schema_name = 'pg_catalog' THEN '' ELSE w.schema_name || '.' END"
        "    || w.name || '(' || w.detail || ')', has_function_privilege(p.oid, 'EXECUTE')"
        "   FROM need AS w JOIN pg_catalog.pg_namespace AS n ON n.nspname = w.schema_name"
        "   JOIN pg_catalog.pg_proc AS p ON p.pronamespace = n.oid AND p.proname = w.name"
        "    AND array_to_string(p.proargtypes::regtype[], ',') = w.detail"
        "   WHERE w.kind = 'function')"
        " SELECT what, current_user FROM checked WHERE NOT granted ORDER BY position LIMIT 1");
}

int
store_missing_privilege(struct outbox_error *err, const char *role, const char *what)
{
    char quoted[64];

    outbox_error_set(err, OUTBOX_ERR_CONFIG,
                     "role '%s' lacks %s (grant it the outbox_relay role of"
                     " sql/roles/outbox_relay_role.sql)",
                     outbox_error_quote(quoted, sizeof(quoted), role), what);
    if (err != NULL)
        memcpy(err->sqlstate, "42501", 6);
    return -1;
}

int
store_check_privileges(outbox_store *store, enum privilege_audit which, struct outbox_error *err)
{
    bool with_delete = which == AUDIT_WITH_DELETE;
    struct audit audit = {0};
    struct buffer sql = {0};
    PGresult *result;
    int rc = 0;

    for (size_t s = 0; s < STMT_COUNT; s++)
        for (const struct store_need *need = store_statements[s].needs;
             need < store_statements[s].needs + STORE_NEEDS_MAX && need->kind != STORE_NEED_NONE;
             need++)
            audit_add(&audit, need, with_delete);
    if (audit.count == AUDIT_NEEDS_MAX)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "%s: too many privileges to check",
                                AUDIT_CONTEXT);
    build_audit(&sql, &audit);
    if (sql.failed) {
        buffer_clear(&sql);
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    }
    result = store_exec_bounded(store, sql.data, AUDIT_CONTEXT, err);
    buffer_clear(&sql);
    if (result == NULL)
        return -1;
    if (PQresultStatus(result) != PGRES_TUPLES_OK)
        rc = outbox_error_from_pg(err, store->conn, result, AUDIT_CONTEXT);
    else if (PQntuples(result) > 0)
        rc = store_missing_privilege(err, PQgetvalue(result, 0, 1), PQgetvalue(result, 0, 0));
    PQclear(result);
    return rc;
}

int
outbox_store_check_privileges(outbox_store *store, struct outbox_error *err)
{
    return store_check_privileges(store, AUDIT_WITH_DELETE, err);
}
