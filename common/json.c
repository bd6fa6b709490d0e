/*
 * json.c - the programs' one JSON reader and writer (see json.h).
 */
#include "json.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

static void
skip_space(struct json_reader *r)
{
    while (r->at < r->length && (r->text[r->at] == ' ' || r->text[r->at] == '\t' ||
                                 r->text[r->at] == '\n' || r->text[r->at] == '\r'))
        r->at++;
}

/* -1 with the standard message for running off the end. */
static int
truncated(struct json_reader *r)
{
    return outbox_error_set(r->err, OUTBOX_ERR_INVALID, "unexpected end of json at offset %zu",
                            r->at);
}

/* Reads 4 hex digits at r->at into *value. */
static int
read_hex4(struct json_reader *r, uint32_t *value)
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
put_utf8(struct json_reader *r, uint32_t cp)
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
read_unicode_escape(struct json_reader *r)
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

size_t
json_utf8_length(const unsigned char *s, size_t n)
{
    size_t need;
    uint32_t cp, min;

    if (s[0] < 0x80)
        return 1;
    if (s[0] >= 0xC2 && s[0] <= 0xDF)
        need = 2, cp = s[0] & 0x1Fu, min = 0x80;
    else if (s[0] >= 0xE0 && s[0] <= 0xEF)
        need = 3, cp = s[0] & 0x0Fu, min = 0x800;
    else if (s[0] >= 0xF0 && s[0] <= 0xF4)
        need = 4, cp = s[0] & 0x07u, min = 0x10000;
    else
        return 0;
    if (n < need)
        return 0;
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3Fu);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return need;
}

/* Copies one raw UTF-8 sequence starting at r->at after checking it is well formed. */
static int
copy_utf8(struct json_reader *r)
{
    size_t need = json_utf8_length(r->text + r->at, r->length - r->at);

    if (need == 0)
        return outbox_error_set(r->err, OUTBOX_ERR_INVALID, "invalid utf-8 in json at offset %zu",
                                r->at);
    memcpy(r->out, r->text + r->at, need);
    r->out += need;
    r->at += need;
    return 0;
}

/* Decodes the escape at r->at (its backslash) into the output. */
static int
read_escape(struct json_reader *r)
{
    unsigned char c;

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
    case 'u': return read_unicode_escape(r);
    default:
        return outbox_error_set(r->err, OUTBOX_ERR_INVALID, "invalid escape in json at offset %zu",
                                r->at - 2);
    }
    return 0;
}

const char *
json_value_kind(const struct json_reader *r)
{
    unsigned char c = r->at < r->length ? r->text[r->at] : '\0';

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
need_more(struct json_reader *r)
{
    return r->at >= r->length ? truncated(r) : 0;
}

int
json_read_string(struct json_reader *r, const char **value, size_t *value_len)
{
    char *start = r->out;

    skip_space(r);
    if (need_more(r) != 0)
        return -1;
    if (r->text[r->at] != '"')
        return outbox_error_set(r->err, OUTBOX_ERR_INVALID,
                                "value is %s, not a string, in json at offset %zu",
                                json_value_kind(r), r->at);
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
        if (read_escape(r) != 0)
            return -1;
    }
    *value = start;
    *value_len = (size_t)(r->out - start);
    *r->out++ = '\0';
    return 0;
}

/* Reads a "key": prefix at r->at, the key decoded into storage; r->at is then at the value. */
static int
read_key(struct json_reader *r, const char **key, size_t *key_len)
{
    if (need_more(r) != 0)
        return -1;
    if (r->text[r->at] != '"')
        return outbox_error_set(r->err, OUTBOX_ERR_INVALID, "expected a key in json at offset %zu",
                                r->at);
    if (json_read_string(r, key, key_len) != 0)
        return -1;
    skip_space(r);
    if (need_more(r) != 0)
        return -1;
    if (r->text[r->at] != ':')
        return outbox_error_set(r->err, OUTBOX_ERR_INVALID, "expected ':' in json at offset %zu",
                                r->at);
    r->at++;
    skip_space(r);
    return need_more(r);
}

/*
 * Reads the items after an opening bracket or brace through the closing
 * one, close, each with read_one, separated by commas.
 */
static int
read_sequence(struct json_reader *r, char close, json_item_reader read_one, void *arg)
{
    skip_space(r);
    if (r->at < r->length && r->text[r->at] == (unsigned char)close) {
        r->at++;
        return 0;
    }
    for (;;) {
        if (read_one(r, arg) != 0)
            return -1;
        skip_space(r);
        if (need_more(r) != 0)
            return -1;
        if (r->text[r->at] == (unsigned char)close) {
            r->at++;
            return 0;
        }
        if (r->text[r->at] != ',')
            return outbox_error_set(r->err, OUTBOX_ERR_INVALID,
                                    "expected ',' or '%c' in json at offset %zu", close, r->at);
        r->at++;
        skip_space(r);
    }
}

/* The caller's member reader and its argument, for read_one_member. */
struct member_reader {
    json_member_reader read_value;
    void *arg;
};

/* Reads one "key": value member of an object. */
static int
read_one_member(struct json_reader *r, void *arg)
{
    struct member_reader *member = arg;
    const char *key;
    size_t key_len;

    if (read_key(r, &key, &key_len) != 0)
        return -1;
    return member->read_value(r, key, key_len, member->arg);
}

int
json_reader_init(struct json_reader *r, const char *text, size_t length, struct outbox_error *err)
{
    memset(r, 0, sizeof(*r));
    r->text = (const unsigned char *)text;
    r->length = length;
    r->err = err;
    /* Decoded strings never grow, and every string costs at least its 2 quotes for its NUL. */
    r->storage = malloc(length + 1);
    if (r->storage == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    r->out = r->storage;
    return 0;
}

void
json_reader_clear(struct json_reader *r)
{
    free(r->storage);
    r->storage = r->out = NULL;
}

int
json_read_object(struct json_reader *r, json_member_reader read_value, void *arg)
{
    struct member_reader member = {read_value, arg};

    skip_space(r);
    if (need_more(r) != 0)
        return -1;
    if (r->text[r->at] != '{')
        return outbox_error_set(r->err, OUTBOX_ERR_INVALID, "json is %s, not an object",
                                json_value_kind(r));
    r->at++;
    if (read_sequence(r, '}', read_one_member, &member) != 0)
        return -1;
    skip_space(r);
    if (r->at != r->length)
        return outbox_error_set(r->err, OUTBOX_ERR_INVALID,
                                "trailing text after json at offset %zu", r->at);
    return 0;
}

int
json_read_array(struct json_reader *r, json_item_reader read_item, void *arg)
{
    skip_space(r);
    if (need_more(r) != 0)
        return -1;
    if (r->text[r->at] != '[')
        return outbox_error_set(r->err, OUTBOX_ERR_INVALID, "json value is %s, not an array",
                                json_value_kind(r));
    r->at++;
    return read_sequence(r, ']', read_item, arg);
}

int
json_read_integer(struct json_reader *r, int64_t *value)
{
    char digits[24];
    size_t n = 0;
    char *end;

    skip_space(r);
    while (r->at + n < r->length && n < sizeof(digits) - 1 &&
           ((r->text[r->at + n] >= '0' && r->text[r->at + n] <= '9') ||
            (n == 0 && r->text[r->at + n] == '-')))
        n++;
    memcpy(digits, r->text + r->at, n);
    digits[n] = '\0';
    errno = 0;
    *value = strtoll(digits, &end, 10);
    if (n == 0 || *end != '\0' || errno != 0)
        return outbox_error_set(r->err, OUTBOX_ERR_INVALID,
                                "expected an integer in json at offset %zu", r->at);
    r->at += n;
    return 0;
}

/* True, past it, when the text at r->at is the literal word. */
static bool
read_literal(struct json_reader *r, const char *word)
{
    size_t n = strlen(word);

    if (r->length - r->at < n || memcmp(r->text + r->at, word, n) != 0)
        return false;
    r->at += n;
    return true;
}

int
json_read_bool(struct json_reader *r, bool *value)
{
    skip_space(r);
    if (read_literal(r, "true"))
        *value = true;
    else if (read_literal(r, "false"))
        *value = false;
    else
        return outbox_error_set(r->err, OUTBOX_ERR_INVALID,
                                "expected true or false in json at offset %zu", r->at);
    return 0;
}

bool
json_read_null(struct json_reader *r)
{
    skip_space(r);
    return read_literal(r, "null");
}

/* ---- an object of string values ---- */

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

/* The string object's member reader: the value must be a string. */
static int
read_string_member(struct json_reader *r, const char *key, size_t key_len, void *arg)
{
    struct json_string_object *object = arg;
    struct json_member member = {.key = key, .key_len = key_len};

    if (r->text[r->at] != '"') {
        char quoted[65];

        return outbox_error_set(r->err, OUTBOX_ERR_INVALID, "value of '%s' is %s, not a string",
                                outbox_error_quote(quoted, sizeof(quoted), key),
                                json_value_kind(r));
    }
    if (json_read_string(r, &member.value, &member.value_len) != 0)
        return -1;
    return add_member(object, &object->capacity, &member, r->err);
}

int
json_parse_string_object(const char *text, size_t length, struct json_string_object *object,
                         struct outbox_error *err)
{
    struct json_reader r;

    memset(object, 0, sizeof(*object));
    if (json_reader_init(&r, text, length, err) != 0)
        return -1;
    object->storage = r.storage;
    r.storage = NULL;
    if (json_read_object(&r, read_string_member, object) != 0) {
        json_string_object_clear(object);
        return -1;
    }
    return 0;
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

/* ---- writing ---- */

void
json_put_string(struct buffer *out, const char *text, size_t length, unsigned flags)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;

    buffer_putc(out, '"');
    while (i < length) {
        unsigned char c = s[i];
        size_t len = 1;
        bool html = (flags & JSON_HTML_SAFE) && (c == '<' || c == '>' || c == '&');

        if (c == '"' || c == '\\') {
            buffer_putc(out, '\\');
            buffer_putc(out, (char)c);
        } else if (c == '\n' || c == '\t' || c == '\r') {
            buffer_puts(out, c == '\n' ? "\\n" : c == '\t' ? "\\t" : "\\r");
        } else if (c < 0x20 || c == 0x7f || html) {
            buffer_puts(out, "\\u00");
            buffer_putc(out, hex[c >> 4]);
            buffer_putc(out, hex[c & 0xf]);
        } else if ((len = json_utf8_length(s + i, length - i)) == 0) {
            buffer_puts(out, "\\ufffd"); /* invalid UTF-8: one replacement per byte */
            len = 1;
        } else {
            buffer_append(out, text + i, len);
        }
        i += len;
    }
    buffer_putc(out, '"');
}

void
json_put_text(struct buffer *out, const char *text, unsigned flags)
{
    if (text == NULL)
        buffer_puts(out, "null");
    else
        json_put_string(out, text, strlen(text), flags);
}
