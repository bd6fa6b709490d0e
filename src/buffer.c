/*
 * buffer.c - a growable, NUL-terminated byte buffer.
 */
#include "buffer.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Makes room for extra bytes plus the NUL; false (and failed) when out of memory. */
static bool
reserve(struct buffer *b, size_t extra)
{
    size_t cap;
    char *data;

    if (b->failed)
        return false;
    if (b->len + extra + 1 <= b->cap)
        return true;
    if (extra > ((size_t)-1) / 2 - b->len) {
        b->failed = true;
        return false;
    }
    cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1)
        cap *= 2;
    data = realloc(b->data, cap);
    if (data == NULL) {
        b->failed = true;
        return false;
    }
    b->data = data;
    b->cap = cap;
    return true;
}

void
buffer_append(struct buffer *b, const char *bytes, size_t n)
{
    if (!reserve(b, n))
        return;
    memcpy(b->data + b->len, bytes, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void
buffer_puts(struct buffer *b, const char *text)
{
    buffer_append(b, text, strlen(text));
}

void
buffer_putc(struct buffer *b, char c)
{
    buffer_append(b, &c, 1);
}

void
buffer_printf(struct buffer *b, const char *format, ...)
{
    va_list ap;
    int n;

    va_start(ap, format);
    n = vsnprintf(NULL, 0, format, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = true;
        return;
    }
    if (!reserve(b, (size_t)n))
        return;
    va_start(ap, format);
    vsnprintf(b->data + b->len, (size_t)n + 1, format, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void
buffer_clear(struct buffer *b)
{
    free(b->data);
    memset(b, 0, sizeof(*b));
}

void *
array_grow(void *items, size_t *capacity, size_t count, size_t size)
{
    size_t slots = *capacity ? *capacity * 2 : 16;
    void *grown;

    if (count < *capacity)
        return items;
    if (slots > SIZE_MAX / size)
        return NULL;
    grown = realloc(items, slots * size);
    if (grown != NULL)
        *capacity = slots;
    return grown;
}
