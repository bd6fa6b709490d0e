/*
 * json.h - a small strict reader for the JSON the relay has to look inside.
 *
 * The outbox keeps message headers as a JSON object of string values
 * ({"trace-id": "abc"}); a broker wants them as separate key/value pairs.
 * json_parse_string_object() decodes exactly that shape: one object whose
 * values are all strings, with the full set of JSON string escapes
 * (\uXXXX, surrogate pairs joined into one code point) turned into UTF-8.
 * Anything else (nested objects, numbers, arrays, invalid UTF-8, lone
 * surrogates, trailing text) is refused with a message naming the problem,
 * so a bad row fails on its own instead of reaching the broker half-read.
 */
#ifndef OUTBOX_JSON_H
#define OUTBOX_JSON_H

#include <stddef.h>

#include "outbox.h"

/*
 * One decoded member. key and value point into the owning object, are
 * NUL-terminated for convenience, and may also contain NUL bytes (from
 * \u0000), so use the lengths.
 */
struct json_member {
    const char *key;
    size_t key_len;
    const char *value;
    size_t value_len;
};

/* A decoded object of string values, in document order. */
struct json_string_object {
    struct json_member *members;
    size_t count;
    char *storage; /* owned: the decoded strings */
};

/*
 * Decodes text[0..length) as an object of string values into object (which
 * the caller then clears with json_string_object_clear()). Returns 0, or -1
 * with OUTBOX_ERR_INVALID (OUTBOX_ERR_INTERNAL when out of memory) and
 * object left empty. Duplicate keys are kept as they come.
 */
int json_parse_string_object(const char *text, size_t length, struct json_string_object *object,
                             struct outbox_error *err);

/* Frees what object owns and empties it; a cleared or zeroed object is fine. */
void json_string_object_clear(struct json_string_object *object);

#endif
