/*
 * outboxctl's output helpers: JSON strings, tables padded to their widest
 * cell, byte counts as pg_size_pretty prints them, text on one line. They
 * print to a FILE and never fail but for memory, which the caller reports.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "json.h"

/* ---- output helpers ---------------------------------------------------- */

/* Writes text as a JSON string (NULL as null) through the shared writer. */
void
ctl_json_string(FILE *out, const char *text)
{
    struct buffer json = {0};

    json_put_text(&json, text, 0);
    if (json.data != NULL)
        fwrite(json.data, 1, json.len, out);
    buffer_clear(&json);
}

/* Appends a row of printf-formatted cells, one format per column. */
bool
ctl_table_add_row(struct ctl_table *table, ...)
{
    va_list ap;

    if (table->rows == table->capacity) {
        size_t capacity = table->capacity ? table->capacity * 2 : 16;
        char **cells = realloc(table->cells, capacity * table->columns * sizeof(*cells));

        if (cells == NULL)
            return false;
        table->cells = cells;
        table->capacity = capacity;
    }
    va_start(ap, table);
    for (size_t column = 0; column < table->columns; column++) {
        char **cell = &table->cells[table->rows * table->columns + column];
        const char *text = va_arg(ap, const char *);

        *cell = strdup(text != NULL ? text : "");
        if (*cell == NULL) {
            for (size_t done = 0; done < column; done++)
                free(table->cells[table->rows * table->columns + done]);
            va_end(ap);
            return false;
        }
    }
    va_end(ap);
    table->rows++;
    return true;
}

void
ctl_table_print(const struct ctl_table *table, FILE *out)
{
    size_t widths[16] = {0};

    for (size_t i = 0; i < table->rows * table->columns; i++) {
        size_t len = strlen(table->cells[i]);

        if (len > widths[i % table->columns])
            widths[i % table->columns] = len;
    }
    for (size_t row = 0; row < table->rows; row++) {
        for (size_t column = 0; column < table->columns; column++) {
            const char *cell = table->cells[row * table->columns + column];
            bool last = column + 1 == table->columns;
            int width = (int)widths[column];

            if (table->right_aligned != NULL && table->right_aligned[column])
                fprintf(out, "%*s", width, cell);
            else if (last)
                fputs(cell, out);
            else
                fprintf(out, "%-*s", width, cell);
            fputs(last ? "\n" : "  ", out);
        }
    }
}

void
ctl_table_clear(struct ctl_table *table)
{
    for (size_t i = 0; i < table->rows * table->columns; i++)
        free(table->cells[i]);
    free(table->cells);
    table->cells = NULL;
    table->rows = table->capacity = 0;
}

/* Formats a byte count as pg_size_pretty does, into buf. */
const char *
ctl_format_bytes(char *buf, size_t size, int64_t bytes)
{
    static const char *const units[] = {"bytes", "kB", "MB", "GB", "TB"};
    double value = (double)bytes;
    size_t unit = 0;

    while (value >= 10240.0 && unit + 1 < sizeof(units) / sizeof(units[0])) {
        value /= 1024.0;
        unit++;
    }
    snprintf(buf, size, "%.0f %s", value, units[unit]);
    return buf;
}

/* Copies text into buf with control characters (e.g. newlines) as spaces. */
const char *
ctl_one_line(char *buf, size_t size, const char *text)
{
    size_t n = 0;

    for (const char *p = text != NULL ? text : ""; *p != '\0' && n + 1 < size; p++)
        buf[n++] = (unsigned char)*p < 0x20 ? ' ' : *p;
    buf[n] = '\0';
    return buf;
}
