/*
 * buffer.h - a growable, NUL-terminated byte buffer.
 *
 * Appends never fail at the call site: an allocation failure sets `failed`,
 * later appends do nothing, and the owner checks `failed` once at the end.
 * A zeroed struct buffer is empty and ready; buffer_clear() frees it and
 * zeroes it again. data is NULL until the first append.
 *
 * array_grow() is the same growth for an array of fixed-size items.
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

/*
 * Room for one more item in a growable array of count items of size bytes
 * and *capacity slots: items itself while there is room, else the array
 * reallocated to twice the slots (16 at first) and *capacity updated. NULL
 * when out of memory, items then still valid and *capacity unchanged.
 */
void *array_grow(void *items, size_t *capacity, size_t count, size_t size);

#endif
