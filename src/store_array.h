/*
 * store_array.h - PostgreSQL array literals built element by element, to
 * pass a list as one text parameter. Depends on buffer.c alone.
 */
#ifndef OUTBOX_STORE_ARRAY_H
#define OUTBOX_STORE_ARRAY_H

#include <stdbool.h>
#include <stddef.h>

#include "buffer.h"

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
