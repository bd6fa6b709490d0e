/*
 * json.h - the programs' one JSON reader and one JSON writer.
 *
 * The writer puts a string, quoted and escaped, into a buffer: the relay's
 * JSON log lines, outboxctl's --json output and the console's API all write
 * their strings through it, so all escape alike (invalid UTF-8 becomes
 * U+FFFD; JSON_HTML_SAFE also escapes < > & for what a browser may read).
 *
 * The reader is strict and small: a cursor (struct json_reader) over one
 * text, with a function per kind of value; json_read_object() walks an
 * object and hands each member to the caller's function, which reads the
 * value with the json_read_* that fits. Errors are OUTBOX_ERR_INVALID with
 * a message naming the problem and its offset.
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

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buffer.h"

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
    size_t capacity; /* slots allocated in members */
    char *storage;   /* owned: the decoded strings */
};

/*
 * Where a reader is in its text. Decoded strings go into storage (length + 1
 * bytes, owned), stay valid until json_reader_clear(), are NUL-terminated
 * and may hold NUL bytes (from \u0000): use their lengths.
 */
struct json_reader {
    const unsigned char *text;
    size_t length;
    size_t at;                /* the next byte to read */
    char *out;                /* the next free byte of storage */
    char *storage;            /* owned */
    struct outbox_error *err; /* where a failure is told */
};

/* Reads one member's value at r->at (the key is decoded); 0 or -1 with r->err set. */
typedef int (*json_member_reader)(struct json_reader *r, const char *key, size_t key_len, void *arg);
/* Reads one item of an array at r->at; 0 or -1 with r->err set. */
typedef int (*json_item_reader)(struct json_reader *r, void *arg);

/* Starts a reader over text[0..length); -1 (OUTBOX_ERR_INTERNAL) when out of memory. */
int json_reader_init(struct json_reader *r, const char *text, size_t length, struct outbox_error *err);
/* Frees the reader's storage; the decoded strings go with it. */
void json_reader_clear(struct json_reader *r);

/* Reads the whole rest of the text as one object, each member through read_value. */
int json_read_object(struct json_reader *r, json_member_reader read_value, void *arg);
/* Reads an array, each item through read_item. */
int json_read_array(struct json_reader *r, json_item_reader read_item, void *arg);
/* Decodes a string into the reader's storage (see struct json_reader). */
int json_read_string(struct json_reader *r, const char **value, size_t *value_len);
/* Reads an integer (digits, an optional leading '-') that fits in 64 bits. */
int json_read_integer(struct json_reader *r, int64_t *value);
int json_read_bool(struct json_reader *r, bool *value);
/* True, and past it, when the next value is null; else nothing is read. */
bool json_read_null(struct json_reader *r);
/* A word for the value at r->at, for messages: "an object", "a number"... */
const char *json_value_kind(const struct json_reader *r);

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

/* Writer flag: also escape < > & (as \u003c...), for answers a browser may read. */
#define JSON_HTML_SAFE 1u

/*
 * Appends text[0..length) to out as a quoted JSON string: " and \ escaped,
 * \n \t \r short, other control bytes and DEL as \u00XX, invalid UTF-8 as
 * \ufffd (one per byte), everything else as it is.
 */
void json_put_string(struct buffer *out, const char *text, size_t length, unsigned flags);
/* The same for a NUL-terminated text; NULL is written as null. */
void json_put_text(struct buffer *out, const char *text, unsigned flags);

/*
 * Length of the well-formed UTF-8 sequence at s (at most n bytes, n > 0): 1
 * for ASCII; no overlong forms, no surrogates, nothing above U+10FFFF; 0
 * when invalid.
 */
size_t json_utf8_length(const unsigned char *s, size_t n);

#endif
