/*
 * fuzz_json.c - json_parse_string_object, the AMQP sink's header decoder,
 * on arbitrary bytes (not NUL-terminated: the length is the input size).
 *
 * Invariants: 0 or -1; -1 with OUTBOX_ERR_INVALID or OUTBOX_ERR_INTERNAL,
 * a non-empty one-line message and an empty object; on 0 every key and
 * value is NUL-terminated at its length and valid UTF-8, and the members
 * written back as JSON decode again to the same members.
 */
#include <stdbool.h>

#include "fuzz_common.h"
#include "json.h"

/* True when [s, s+len) is valid UTF-8 (no overlongs, surrogates or values above U+10FFFF). */
static bool
utf8_valid(const unsigned char *s, size_t len)
{
    size_t i = 0;

    while (i < len) {
        unsigned char c = s[i];
        size_t extra;
        uint32_t cp;

        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xc2 && c <= 0xdf)
            extra = 1, cp = c & 0x1f;
        else if (c >= 0xe0 && c <= 0xef)
            extra = 2, cp = c & 0x0f;
        else if (c >= 0xf0 && c <= 0xf4)
            extra = 3, cp = c & 0x07;
        else
            return false;
        if (extra >= len - i)
            return false;
        for (size_t k = 1; k <= extra; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return false;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        if ((extra == 2 && cp < 0x800) || (extra == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += extra + 1;
    }
    return true;
}

/* Appends a JSON string for [s, s+len) to out at *n (out has room for 6 bytes per byte + 2). */
static void
encode_string(char *out, size_t *n, const char *s, size_t len)
{
    out[(*n)++] = '"';
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];

        if (c == '"' || c == '\\') {
            out[(*n)++] = '\\';
            out[(*n)++] = (char)c;
        } else if (c < 0x20) {
            *n += (size_t)sprintf(out + *n, "\\u%04x", c);
        } else {
            out[(*n)++] = (char)c;
        }
    }
    out[(*n)++] = '"';
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct json_string_object object, again;
    struct outbox_error err;
    size_t room = 2, n = 0;
    char *json;
    int rc;

    /* libFuzzer's buffer is exactly size bytes: ASan sees any read past the length */
    memset(&err, 0, sizeof(err));
    rc = json_parse_string_object((const char *)data, size, &object, &err);
    FUZZ_CHECK(rc == 0 || rc == -1, "json_parse_string_object returned %d", rc);
    if (rc != 0) {
        FUZZ_CHECK(err.code == OUTBOX_ERR_INVALID || err.code == OUTBOX_ERR_INTERNAL, "code %d",
                   (int)err.code);
        fuzz_check_message(&err, "(json)");
        FUZZ_CHECK(object.members == NULL && object.count == 0 && object.storage == NULL,
                   "object not empty after a failure");
        json_string_object_clear(&object);
        return 0;
    }
    for (size_t i = 0; i < object.count; i++) {
        const struct json_member *m = &object.members[i];

        FUZZ_CHECK(m->key[m->key_len] == '\0' && m->value[m->value_len] == '\0',
                   "member %zu not NUL-terminated", i);
        FUZZ_CHECK(utf8_valid((const unsigned char *)m->key, m->key_len) &&
                       utf8_valid((const unsigned char *)m->value, m->value_len),
                   "member %zu is not valid UTF-8", i);
        room += 6 * (m->key_len + m->value_len) + 8;
    }

    json = malloc(room);
    if (json == NULL)
        abort();
    json[n++] = '{';
    for (size_t i = 0; i < object.count; i++) {
        if (i > 0)
            json[n++] = ',';
        encode_string(json, &n, object.members[i].key, object.members[i].key_len);
        json[n++] = ':';
        encode_string(json, &n, object.members[i].value, object.members[i].value_len);
    }
    json[n++] = '}';
    rc = json_parse_string_object(json, n, &again, &err);
    FUZZ_CHECK(rc == 0, "re-encoded object '%.*s' refused: %s", (int)n, json, err.message);
    FUZZ_CHECK(again.count == object.count, "re-encoded object has %zu members, not %zu",
               again.count, object.count);
    for (size_t i = 0; i < object.count; i++) {
        const struct json_member *a = &object.members[i], *b = &again.members[i];

        FUZZ_CHECK(a->key_len == b->key_len && a->value_len == b->value_len &&
                       memcmp(a->key, b->key, a->key_len) == 0 &&
                       memcmp(a->value, b->value, a->value_len) == 0,
                   "member %zu differs after re-encoding", i);
    }
    json_string_object_clear(&again);
    json_string_object_clear(&object);
    free(json);
    return 0;
}
