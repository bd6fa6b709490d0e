/*
 * test_store_statements.c - the statement table names what each statement
 * needs: every table it reads or writes, every function it calls that any
 * statement names, and nothing it does not use. The privilege audit walks
 * these needs, so a statement missing one here would pass the audit and
 * fail at run time.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "store_statements.h"

/* Whether statement lists a need of this kind, name and (when not NULL) detail. */
static bool
lists(const struct store_statement *statement, enum store_need_kind kind, const char *name,
      const char *detail)
{
    for (size_t i = 0; i < STORE_NEEDS_MAX && statement->needs[i].kind != STORE_NEED_NONE; i++) {
        const struct store_need *need = &statement->needs[i];

        if (need->kind == kind && strcmp(need->name, name) == 0 &&
            (detail == NULL || strcmp(need->detail, detail) == 0))
            return true;
    }
    return false;
}

/* Whether sql calls name: "name(" not preceded by a letter, digit or '_'. */
static bool
calls(const char *sql, const char *name)
{
    char call[80];
    const char *at = sql;

    if (strcmp(name, "timezone") == 0)
        return strstr(sql, " AT TIME ZONE ") != NULL;
    snprintf(call, sizeof(call), "%s(", name);
    while ((at = strstr(at, call)) != NULL) {
        char before = at == sql ? ' ' : at[-1];

        if (before != '_' && !(before >= 'a' && before <= 'z') && !(before >= '0' && before <= '9'))
            return true;
        at++;
    }
    return false;
}

static void
test_every_statement_has_a_name_text_and_needs(void **state)
{
    (void)state;
    for (size_t s = 0; s < STMT_COUNT; s++) {
        assert_non_null(store_statements[s].name);
        assert_non_null(store_statements[s].sql);
        assert_int_not_equal(store_statements[s].needs[0].kind, STORE_NEED_NONE);
        /* the list ends inside its array */
        assert_int_equal(store_statements[s].needs[STORE_NEEDS_MAX - 1].kind, STORE_NEED_NONE);
    }
}

/* Fails naming the statement when a need is missing or listed for nothing. */
static void
expect(const struct store_statement *st, bool uses, bool listed, const char *what)
{
    if (uses && !listed)
        fail_msg("%s uses %s without listing it", st->name, what);
    if (listed && !uses)
        fail_msg("%s lists %s and does not use it", st->name, what);
}

/* Tables: read, updated (with the CHECK constraint's function), deleted from. */
static void
test_tables_written_and_read_are_listed(void **state)
{
    (void)state;
    for (size_t s = 0; s < STMT_COUNT; s++) {
        const struct store_statement *st = &store_statements[s];
        bool updates_rows = strstr(st->sql, "UPDATE outbox.job") != NULL;

        expect(st, strstr(st->sql, "outbox.job") != NULL,
               lists(st, STORE_NEED_TABLE, "job", "SELECT"), "SELECT on outbox.job");
        expect(st, updates_rows || strstr(st->sql, "FOR UPDATE") != NULL,
               lists(st, STORE_NEED_TABLE, "job", "UPDATE"), "UPDATE on outbox.job");
        expect(st, updates_rows, lists(st, STORE_NEED_FUNCTION, "headers_are_strings", NULL),
               "outbox.headers_are_strings()");
        expect(st, strstr(st->sql, "DELETE FROM outbox.job") != NULL,
               lists(st, STORE_NEED_TABLE, "job", "DELETE"), "DELETE on outbox.job");
        expect(st, strstr(st->sql, "outbox.paused") != NULL,
               lists(st, STORE_NEED_TABLE, "paused", "SELECT"), "SELECT on outbox.paused");
    }
}

/*
 * Functions: a statement calling a function that any statement lists must
 * list it too, and every function listed is called (the CHECK constraint's
 * headers_are_strings() by the update).
 */
static void
test_functions_called_are_listed(void **state)
{
    (void)state;
    for (size_t s = 0; s < STMT_COUNT; s++) {
        const struct store_statement *st = &store_statements[s];

        for (size_t o = 0; o < STMT_COUNT; o++) {
            for (size_t i = 0; i < STORE_NEEDS_MAX; i++) {
                const struct store_need *need = &store_statements[o].needs[i];

                if (need->kind != STORE_NEED_FUNCTION || strcmp(need->schema, "pg_catalog") != 0)
                    continue;
                if (calls(st->sql, need->name) && !lists(st, STORE_NEED_FUNCTION, need->name, NULL))
                    fail_msg("%s calls %s() without listing it", st->name, need->name);
            }
        }
        for (size_t i = 0; i < STORE_NEEDS_MAX && st->needs[i].kind != STORE_NEED_NONE; i++) {
            const struct store_need *need = &st->needs[i];

            if (need->kind == STORE_NEED_FUNCTION && strcmp(need->schema, "pg_catalog") == 0 &&
                !calls(st->sql, need->name))
                fail_msg("%s lists %s() and does not call it", st->name, need->name);
        }
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_statement_has_a_name_text_and_needs),
        cmocka_unit_test(test_tables_written_and_read_are_listed),
        cmocka_unit_test(test_functions_called_are_listed),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
