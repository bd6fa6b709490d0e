/*
 * store_array.c - PostgreSQL array literals, how the store passes a batch
 * of values as one text parameter that the statement casts.
 *
 * Appends never fail at the call site; an allocation failure surfaces once,
 * as NULL from store_array_finish().
 */
#include "store_array.h"

/* Starts the next element: the opening brace or a comma. */
static void
array_next(struct pg_array *a)
{
    buffer_putc(&a->text, a->count++ == 0 ? '{' : ',');
}

void
store_array_add_int(struct pg_array *a, long long value)
{
    array_next(a);
    buffer_printf(&a->text, "%lld", value);
}

void
store_array_add_double(struct pg_array *a, double value)
{
    array_next(a);
    buffer_printf(&a->text, "%.3f", value);
}

void
store_array_add_bool(struct pg_array *a, bool value)
{
    array_next(a);
    buffer_putc(&a->text, value ? 't' : 'f');
}

/* An unquoted NULL element. */
void
store_array_add_null(struct pg_array *a)
{
    array_next(a);
    buffer_puts(&a->text, "NULL");
}

void
store_array_add_text(struct pg_array *a, const char *text)
{
    array_next(a);
    buffer_putc(&a->text, '"');
    for (; text != NULL && *text != '\0'; text++) {
        if (*text == '"' || *text == '\\')
            buffer_putc(&a->text, '\\');
        buffer_putc(&a->text, *text);
    }
    buffer_putc(&a->text, '"');
}

const char *
store_array_finish(struct pg_array *a)
{
    if (a->count == 0)
        buffer_putc(&a->text, '{');
    buffer_putc(&a->text, '}');
    return a->text.failed ? NULL : a->text.data;
}

void
store_array_clear(struct pg_array *a)
{
    buffer_clear(&a->text);
    a->count = 0;
}

