/*
 * json.c - decoding a JSON object of string values (see json.h).
 */
#include "json.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

/* Where the reader is; the output cursor writes decoded strings into storage. */
struct reader {
    const unsigned char *text;
    size_t length;
    size_t at;
    char *out;
    struct outbox_error *err;
};

static void
skip_space(struct reader *r)
{
    while (r->at < r->length && (r->text[r->at] == ' ' || r->text[r->at] == '\t' ||
                                 r->text[r->at] == '\n' || r->text[r->at] == '\r'))
        r->at++;
}

/* -1 with the standard message for running off the end. */
static int
truncated(struct reader *r)
{
    return outbox_error_set(r->err, OUTBOX_ERR_INVALID, "unexpected end of json at offset %zu",
                            r->at);
}

/* Reads 4 hex digits at r->at into *value. */
static int
read_hex4(struct reader *r, uint32_t *value)
{
    uint32_t result = 0;

    if (r->length - r->at < 4)
        return truncated(r);
    for (int i = 0; i < 4; i++) {
        unsigned char c = r->text[r->at + (size_t)i];
        uint32_t digit;

        if (c >= '0' && c <= '9')
            digit = (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            digit = (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            digit = (uint32_t)(c - 'A' + 10);
        else
            return outbox_error_set(r->err, OUTBOX_ERR_INVALID,
                                    "invalid \\u escape in json at offset %zu", r->at);
        result = result << 4 | digit;
    }
    r->at += 4;
    *value = result;
    return 0;
}

/* Appends code point cp (already known valid) as UTF-8. */
static void
put_utf8(struct reader *r, uint32_t cp)
{
    if (cp < 0x80) {
        *r->out++ = (char)cp;
    } else if (cp < 0x800) {
        *r->out++ = (char)(0xC0 | cp >> 6);
        *r->out++ = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *r->out++ = (char)(0xE0 | cp >> 12);
        *r->out++ = (char)(0x80 | (cp >> 6 & 0x3F));
        *r->out++ = (char)(0x80 | (cp & 0x3F));
    } else {
        *r->out++ = (char)(0xF0 | cp >> 18);
        *r->out++ = (char)(0x80 | (cp >> 12 & 0x3F));
        *r->out++ = (char)(0x80 | (cp >> 6 & 0x3F));
        *r->out++ = (char)(0x80 | (cp & 0x3F));
    }
}

/* Decodes the \u escape whose "\u" was just consumed, joining surrogate pairs. */
static int
read_unicode_escape(struct reader *r)
{
    size_t start = r->at - 2;
    uint32_t cp;

    if (read_hex4(r, &cp) != 0)
        return -1;
    if (cp >= 0xDC00 && cp <= 0xDFFF)
        return outbox_error_set(r->err, OUTBOX_ERR_INVALID,
                                "lone low surrogate in json at offset %zu", start);
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        uint32_t low;

        if (r->length - r->at < 2 || r->text[r->at] != '\\' || r->text[r->at + 1] != 'u') {
            if (r->length - r->at < 2)
                return truncated(r);
            return outbox_error_set(r->err, OUTBOX_ERR_INVALID,
                                    "lone high surrogate in json at offset %zu", start);
        }
        r->at += 2;
        if (read_hex4(r, &low) != 0)
            return -1;
        if (low < 0xDC00 || low > 0xDFFF)
            return outbox_error_set(r->err, OUTBOX_ERR_INVALID,
                                    "lone high surrogate in json at offset %zu", start);
        cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    put_utf8(r, cp);
    return 0;
}

/*
 * Copies one raw UTF-8 sequence starting at r->at after checking it is
 * well formed: no overlong forms, no surrogates, nothing above U+10FFFF.
 */
static int
copy_utf8(struct reader *r)
{
    const unsigned char *p = r->text + r->at;
    size_t left = r->length - r->at;
    size_t need;
    uint32_t cp, min;

    if (p[0] >= 0xC2 && p[0] <= 0xDF) {
        need = 2, cp = p[0] & 0x1Fu, min = 0x80;
    } else if (p[0] >= 0xE0 && p[0] <= 0xEF) {
        need = 3, cp = p[0] & 0x0Fu, min = 0x800;
    } else if (p[0] >= 0xF0 && p[0] <= 0xF4) {
        need = 4, cp = p[0] & 0x07u, min = 0x10000;
    } else {
        goto invalid;
    }
    if (left < need)
        goto invalid;
    for (size_t i = 1; i < need; i++) {
        if ((p[i] & 0xC0) != 0x80)
            goto invalid;
        cp = cp << 6 | (p[i] & 0x3Fu);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        goto invalid;
    memcpy(r->out, p, need);
    r->out += need;
    r->at += need;
    return 0;

invalid:
    return outbox_error_set(r->err, OUTBOX_ERR_INVALID, "invalid utf-8 in json at offset %zu",
                            r->at);
}

/* Decodes the string starting at the opening quote into the output; NUL-terminates it. */
static int
read_string(struct reader *r, const char **value, size_t *value_len)
{
    char *start = r->out;

    r->at++; /* the opening quote */
    for (;;) {
        unsigned char c;

        if (r->at >= r->length)
            return truncated(r);
        c = r->text[r->at];
        if (c == '"') {
            r->at++;
            break;
        }
        if (c < 0x20)
            return outbox_error_set(r->err, OUTBOX_ERR_INVALID,
                                    "control character in json string at offset %zu", r->at);
        if (c >= 0x80) {
            if (copy_utf8(r) != 0)
                return -1;
            continue;
        }
        if (c != '\\') {
            *r->out++ = (char)c;
            r->at++;
            continue;
        }
        if (r->length - r->at < 2) {
            r->at++;
            return truncated(r);
        }
        c = r->text[r->at + 1];
        r->at += 2;
        switch (c) {
        case '"': *r->out++ = '"'; break;
        case '\\': *r->out++ = '\\'; break;
        case '/': *r->out++ = '/'; break;
        case 'b': *r->out++ = '\b'; break;
        case 'f': *r->out++ = '\f'; break;
        case 'n': *r->out++ = '\n'; break;
        case 'r': *r->out++ = '\r'; break;
        case 't': *r->out++ = '\t'; break;
        case 'u':
            if (read_unicode_escape(r) != 0)
                return -1;
            break;
        default:
            return outbox_error_set(r->err, OUTBOX_ERR_INVALID,
                                    "invalid escape in json at offset %zu", r->at - 2);
        }
    }
    *value = start;
    *value_len = (size_t)(r->out - start);
    *r->out++ = '\0';
    return 0;
}

/* A word for the JSON value starting with c, for messages. */
static const char *
kind_of_value(unsigned char c)
{
    switch (c) {
    case '{': return "an object";
    case '[': return "an array";
    case 't':
    case 'f': return "a boolean";
    case 'n': return "null";
    default: return (c == '-' || (c >= '0' && c <= '9')) ? "a number" : "not json";
    }
}

/* -1 after the truncation message when the text ends at r->at, else 0. */
static int
need_more(struct reader *r)
{
    return r->at >= r->length ? truncated(r) : 0;
}

/* Reads one "key": "value" member at r->at; its strings point into the output. */
static int
read_member(struct reader *r, struct json_member *member)
{
    if (need_more(r) != 0)
        return -1;
    if (r->text[r->at] != '"')
        return outbox_error_set(r->err, OUTBOX_ERR_INVALID, "expected a key in json at offset %zu",
                                r->at);
    if (read_string(r, &member->key, &member->key_len) != 0)
        return -1;
    skip_space(r);
    if (need_more(r) != 0)
        return -1;
    if (r->text[r->at] != ':')
        return outbox_error_set(r->err, OUTBOX_ERR_INVALID, "expected ':' in json at offset %zu",
                                r->at);
    r->at++;
    skip_space(r);
    if (need_more(r) != 0)
        return -1;
    if (r->text[r->at] != '"') {
        char key[65];

        return outbox_error_set(r->err, OUTBOX_ERR_INVALID, "value of '%s' is %s, not a string",
                                outbox_error_quote(key, sizeof(key), member->key),
                                kind_of_value(r->text[r->at]));
    }
    return read_string(r, &member->value, &member->value_len);
}

/* Appends member to object, growing its array (*capacity entries) by doubling. */
static int
add_member(struct json_string_object *object, size_t *capacity, const struct json_member *member,
           struct outbox_error *err)
{
    if (object->count == *capacity) {
        size_t grown = *capacity == 0 ? 8 : *capacity * 2;
        struct json_member *members = realloc(object->members, grown * sizeof(*members));

        if (members == NULL)
            return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        object->members = members;
        *capacity = grown;
    }
    object->members[object->count++] = *member;
    return 0;
}

/* Reads the members after the opening brace, through the closing one. */
static int
read_members(struct reader *r, struct json_string_object *object)
{
    size_t capacity = 0;

    skip_space(r);
    if (r->at < r->length && r->text[r->at] == '}') {
        r->at++;
        return 0;
    }
    for (;;) {
        struct json_member member;

        if (read_member(r, &member) != 0 || add_member(object, &capacity, &member, r->err) != 0)
            return -1;
        skip_space(r);
        if (need_more(r) != 0)
            return -1;
        if (r->text[r->at] == '}') {
            r->at++;
            return 0;
        }
        if (r->text[r->at] != ',')
            return outbox_error_set(r->err, OUTBOX_ERR_INVALID,
                                    "expected ',' or '}' in json at offset %zu", r->at);
        r->at++;
        skip_space(r);
    }
}

int
json_parse_string_object(const char *text, size_t length, struct json_string_object *object,
                         struct outbox_error *err)
{
    struct reader r = {.text = (const unsigned char *)text, .length = length, .err = err};

    memset(object, 0, sizeof(*object));
    /* Decoded strings never grow, and every string costs at least its 2 quotes for its NUL. */
    object->storage = malloc(length + 1);
    if (object->storage == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        goto fail;
    }
    r.out = object->storage;
    skip_space(&r);
    if (need_more(&r) != 0)
        goto fail;
    if (r.text[r.at] != '{') {
        outbox_error_set(err, OUTBOX_ERR_INVALID, "json is %s, not an object",
                         kind_of_value(r.text[r.at]));
        goto fail;
    }
    r.at++;
    if (read_members(&r, object) != 0)
        goto fail;
    skip_space(&r);
    if (r.at != r.length) {
        outbox_error_set(err, OUTBOX_ERR_INVALID, "trailing text after json at offset %zu", r.at);
        goto fail;
    }
    return 0;

fail:
    json_string_object_clear(object);
    return -1;
}

void
json_string_object_clear(struct json_string_object *object)
{
    if (object == NULL)
        return;
    free(object->members);
    free(object->storage);
    memset(object, 0, sizeof(*object));
}
