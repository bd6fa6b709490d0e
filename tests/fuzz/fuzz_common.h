/*
 * fuzz_common.h - helpers shared by the libFuzzer targets in tests/fuzz.
 *
 * A failed invariant aborts with a message on stderr, which libFuzzer
 * reports as a crash and saves the input under its artifact prefix.
 */
#ifndef OUTBOX_FUZZ_COMMON_H
#define OUTBOX_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "outbox.h"

#define FUZZ_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "invariant failed: %s: ", #cond);                                      \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* The input as a NUL-terminated string (it ends at its first NUL byte). */
static inline char *
fuzz_string(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);

    if (text == NULL)
        abort();
    memcpy(text, data, size);
    text[size] = '\0';
    return text;
}

/* How many times needle occurs in haystack, overlapping occurrences counted. */
static inline size_t
fuzz_count(const char *haystack, const char *needle)
{
    size_t count = 0;

    if (needle[0] == '\0')
        return 0;
    for (const char *p = strstr(haystack, needle); p != NULL; p = strstr(p + 1, needle))
        count++;
    return count;
}

/* A failed call's error: a known code and a non-empty message on one line. */
static inline void
fuzz_check_message(const struct outbox_error *err, const char *input)
{
    FUZZ_CHECK(err->message[0] != '\0', "empty message for '%s'", input);
    FUZZ_CHECK(strpbrk(err->message, "\r\n") == NULL, "message '%s' spans lines", err->message);
}

#endif
