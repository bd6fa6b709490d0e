/*
 * buffer.h - a growable, NUL-terminated byte buffer.
 *
 * Appends never fail at the call site: an allocation failure sets `failed`,
 * later appends do nothing, and the owner checks `failed` once at the end.
 * A zeroed struct buffer is empty and ready; buffer_clear() frees it and
 * zeroes it again. data is NULL until the first append.
 */
#ifndef OUTBOX_BUFFER_H
#define OUTBOX_BUFFER_H

#include <stdbool.h>
#include <stddef.h>

struct buffer {
    char *data;  /* NUL-terminated after any successful append */
    size_t len;  /* bytes in data, without the NUL */
    size_t cap;  /* bytes allocated */
    bool failed; /* an allocation failed: the content is incomplete */
};

void buffer_append(struct buffer *b, const char *bytes, size_t n);
void buffer_puts(struct buffer *b, const char *text);
void buffer_putc(struct buffer *b, char c);
void buffer_printf(struct buffer *b, const char *format, ...) __attribute__((format(printf, 2, 3)));
void buffer_clear(struct buffer *b);

#endif
