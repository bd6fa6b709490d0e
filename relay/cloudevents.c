/*
 * cloudevents.c - a claimed row's message as a CloudEvent (see cloudevents.h).
 */
#include "cloudevents.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "buffer.h"
#include "error.h"
#include "json.h"

/* The prefix of a row header that sets an attribute. */
#define ROW_PREFIX "ce_"
#define ROW_PREFIX_LEN 3

/* Longest attribute name a producer may set. */
#define NAME_MAX_LENGTH 20

/*
 * Attributes the relay sets itself (or that the format reserves): a row may
 * not set them. type and subject are the producer's to set.
 */
static const char *const RESERVED[] = {
    "specversion", "id",         "source",       "time",     "datacontenttype", "data",
    "traceparent", "tracestate", "partitionkey", "sequence",
};

/* One message's event: its strings, headers and bodies, kept across batches. */
struct event {
    struct buffer text;         /* binary: "<prefix><name>\0<value>\0" per header */
    size_t offsets[SINK_EXTRA_HEADERS_MAX][2];
    struct sink_header headers[SINK_EXTRA_HEADERS_MAX];
    size_t count;
    struct buffer body;         /* structured: the event */
    struct buffer row_headers;  /* the row's headers without its "ce_" ones */
};

struct cloudevents {
    enum cloudevents_mode mode;
    char *source; /* NULL: from the identity */
    struct event **events; /* each allocated once, kept across batches */
    size_t used, capacity;
};

/* One attribute while an event is built. */
struct attribute {
    const char *name;
    const char *value;
    size_t value_len;
};

/* What an event is built from: the message and the attributes the row gave. */
struct draft {
    struct attribute attributes[SINK_EXTRA_HEADERS_MAX];
    size_t count;
    struct json_string_object row;
    bool row_has_attributes; /* the row's headers hold a "ce_" one */
    char time[40];
    char source[STORE_DATABASE_ID_MAX + 16];
};

bool
cloudevents_attribute_name_allowed(const char *name, size_t length)
{
    if (length == 0 || length > NAME_MAX_LENGTH)
        return false;
    for (size_t i = 0; i < length; i++)
        if (!((name[i] >= 'a' && name[i] <= 'z') || (name[i] >= '0' && name[i] <= '9')))
            return false;
    for (size_t i = 0; i < sizeof(RESERVED) / sizeof(RESERVED[0]); i++)
        if (strlen(RESERVED[i]) == length && memcmp(RESERVED[i], name, length) == 0)
            return false;
    return true;
}

cloudevents *
cloudevents_new(int mode, const char *source)
{
    cloudevents *ce;

    if (mode == CLOUDEVENTS_OFF)
        return NULL;
    ce = calloc(1, sizeof(*ce));
    if (ce == NULL)
        return NULL;
    ce->mode = mode == CLOUDEVENTS_STRUCTURED ? CLOUDEVENTS_STRUCTURED : CLOUDEVENTS_BINARY;
    ce->source = source != NULL && source[0] != '\0' ? strdup(source) : NULL;
    if (source != NULL && source[0] != '\0' && ce->source == NULL) {
        cloudevents_free(ce);
        return NULL;
    }
    return ce;
}

void
cloudevents_free(cloudevents *ce)
{
    if (ce == NULL)
        return;
    for (size_t i = 0; i < ce->capacity && ce->events[i] != NULL; i++) {
        buffer_clear(&ce->events[i]->text);
        buffer_clear(&ce->events[i]->body);
        buffer_clear(&ce->events[i]->row_headers);
        free(ce->events[i]);
    }
    free(ce->events);
    free(ce->source);
    free(ce);
}

void
cloudevents_reset(cloudevents *ce)
{
    if (ce != NULL)
        ce->used = 0;
}

/*
 * The next event's storage, emptied; NULL when out of memory. Each event is
 * its own allocation: messages of the batch point into the earlier ones.
 */
static struct event *
next_event(cloudevents *ce)
{
    struct event *e;

    if (ce->used == ce->capacity) {
        size_t capacity = ce->capacity;
        struct event **grown = array_grow(ce->events, &capacity, ce->used, sizeof(*grown));

        if (grown == NULL)
            return NULL;
        ce->events = grown;
        for (; ce->capacity < capacity; ce->capacity++)
            ce->events[ce->capacity] = NULL;
    }
    if (ce->events[ce->used] == NULL && (ce->events[ce->used] = calloc(1, sizeof(*e))) == NULL)
        return NULL;
    e = ce->events[ce->used++];
    e->text.len = e->body.len = e->row_headers.len = 0;
    e->text.failed = e->body.failed = e->row_headers.failed = false;
    e->count = 0;
    return e;
}

/* created_at as RFC 3339 in UTC with microseconds; "" when it has none. */
static void
format_time(double created_at, char *out, size_t size)
{
    time_t seconds = (time_t)created_at;
    int micros = (int)((created_at - (double)seconds) * 1e6 + 0.5);
    struct tm tm;

    out[0] = '\0';
    if (created_at <= 0 || created_at >= 253402300800.0) /* none, or past year 9999 */
        return;
    if (micros >= 1000000) {
        seconds++;
        micros -= 1000000;
    }
    gmtime_r(&seconds, &tm);
    snprintf(out, size, "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ", tm.tm_year % 10000 + 1900,
             (tm.tm_mon % 12) + 1, tm.tm_mday % 32, tm.tm_hour % 24, tm.tm_min % 60,
             tm.tm_sec % 61, micros % 1000000);
}

/*
 * Adds an attribute to the draft. A NULL or empty value is none; one with a
 * control character, which CloudEvents forbids in a string and which would
 * break a header line, is left out (enqueue refuses such a "ce_" header).
 */
static void
add(struct draft *d, const char *name, const char *value, size_t value_len)
{
    if (value == NULL || value_len == 0 || d->count == SINK_EXTRA_HEADERS_MAX)
        return;
    for (size_t i = 0; i < value_len; i++)
        if ((unsigned char)value[i] < 0x20 || value[i] == 0x7f)
            return;
    d->attributes[d->count++] = (struct attribute){name, value, value_len};
}

/* The value of the row's header key, or NULL. */
static const struct json_member *
row_header(const struct draft *d, const char *key)
{
    for (size_t i = 0; i < d->row.count; i++)
        if (d->row.members[i].key_len == strlen(key) && strcmp(d->row.members[i].key, key) == 0)
            return &d->row.members[i];
    return NULL;
}

/* Adds the row's header key as attribute name, when the row has it. */
static void
add_from_row(struct draft *d, const char *name, const char *key)
{
    const struct json_member *member = row_header(d, key);

    if (member != NULL)
        add(d, name, member->value, strlen(member->value));
}

/*
 * The attributes of message, in the order they are written: the required
 * ones, then the relay's, then the row's own "ce_" ones but type and
 * subject (already placed).
 */
static void
draft_attributes(const cloudevents *ce, const struct store_identity *identity,
                 const struct sink_message *m, struct draft *d)
{
    const struct json_member *type = row_header(d, ROW_PREFIX "type");
    const char *source = ce->source;

    if (source == NULL) {
        snprintf(d->source, sizeof(d->source), "urn:outbox:%s", identity->database_id);
        source = d->source;
    }
    format_time(m->created_at, d->time, sizeof(d->time));
    add(d, "specversion", "1.0", 3);
    add(d, "id", m->message_id, strlen(m->message_id));
    add(d, "source", source, strlen(source));
    if (type != NULL && type->value[0] != '\0')
        add(d, "type", type->value, strlen(type->value));
    else
        add(d, "type", m->queue, strlen(m->queue));
    add(d, "time", d->time, strlen(d->time));
    add_from_row(d, "subject", ROW_PREFIX "subject");
    add_from_row(d, "traceparent", "traceparent");
    add_from_row(d, "tracestate", "tracestate");
    if (m->ordering_key != NULL)
        add(d, "partitionkey", m->ordering_key, strlen(m->ordering_key));
    if (m->place.at != NULL)
        add(d, "sequence", m->place.at, strlen(m->place.at));
    for (size_t i = 0; i < d->row.count; i++) {
        const struct json_member *member = &d->row.members[i];
        const char *name = member->key + ROW_PREFIX_LEN;
        size_t length = member->key_len - ROW_PREFIX_LEN;

        if (member->key_len <= ROW_PREFIX_LEN ||
            memcmp(member->key, ROW_PREFIX, ROW_PREFIX_LEN) != 0)
            continue;
        d->row_has_attributes = true;
        if (strcmp(name, "type") == 0 || strcmp(name, "subject") == 0 ||
            !cloudevents_attribute_name_allowed(name, length))
            continue; /* placed above, or one a row written before the check gave */
        add(d, name, member->value, strlen(member->value));
    }
}

/* The row's headers without its "ce_" ones, as a JSON object, into e->row_headers. */
static void
write_row_headers(const struct draft *d, struct event *e)
{
    bool first = true;

    buffer_putc(&e->row_headers, '{');
    for (size_t i = 0; i < d->row.count; i++) {
        const struct json_member *member = &d->row.members[i];

        if (member->key_len > ROW_PREFIX_LEN &&
            memcmp(member->key, ROW_PREFIX, ROW_PREFIX_LEN) == 0)
            continue;
        if (!first)
            buffer_putc(&e->row_headers, ',');
        first = false;
        json_put_string(&e->row_headers, member->key, member->key_len, 0);
        buffer_putc(&e->row_headers, ':');
        json_put_string(&e->row_headers, member->value, member->value_len, 0);
    }
    buffer_putc(&e->row_headers, '}');
}

/* Binary mode: the attributes as headers named with the prefix; the payload stays the body. */
static int
write_binary(const char *prefix, const struct draft *d, struct event *e, struct sink_message *m)
{
    for (size_t i = 0; i < d->count; i++) {
        e->offsets[i][0] = e->text.len;
        buffer_puts(&e->text, prefix);
        buffer_puts(&e->text, d->attributes[i].name);
        buffer_putc(&e->text, '\0');
        e->offsets[i][1] = e->text.len;
        buffer_append(&e->text, d->attributes[i].value, d->attributes[i].value_len);
        buffer_putc(&e->text, '\0');
    }
    if (e->text.failed)
        return -1;
    for (size_t i = 0; i < d->count; i++)
        e->headers[i] = (struct sink_header){e->text.data + e->offsets[i][0],
                                             e->text.data + e->offsets[i][1]};
    e->count = d->count;
    m->extra_headers = e->headers;
    m->extra_header_count = e->count;
    m->content_type = "application/json";
    return 0;
}

/* Structured mode: the event as the body, the payload as its data. */
static int
write_structured(const struct draft *d, struct event *e, struct sink_message *m)
{
    buffer_putc(&e->body, '{');
    for (size_t i = 0; i < d->count; i++) {
        json_put_text(&e->body, d->attributes[i].name, 0);
        buffer_putc(&e->body, ':');
        json_put_string(&e->body, d->attributes[i].value, d->attributes[i].value_len, 0);
        buffer_putc(&e->body, ',');
    }
    buffer_puts(&e->body, "\"datacontenttype\":\"application/json\",\"data\":");
    if (m->payload != NULL && m->payload_len > 0)
        buffer_append(&e->body, m->payload, m->payload_len);
    else
        buffer_puts(&e->body, "null");
    buffer_putc(&e->body, '}');
    if (e->body.failed)
        return -1;
    m->payload = e->body.data;
    m->payload_len = e->body.len;
    m->content_type = CLOUDEVENTS_STRUCTURED_TYPE;
    return 0;
}

int
cloudevents_apply(cloudevents *ce, const char *prefix, const struct store_identity *identity,
                  struct sink_message *message)
{
    struct draft d = {.count = 0};
    struct sink_message m = *message;
    struct outbox_error parse_error;
    struct event *e;
    int rc = -1;

    if (ce == NULL)
        return 0;
    e = next_event(ce);
    if (e == NULL)
        return -1;
    /* headers a sink would refuse stay for the sink to refuse, as without CloudEvents */
    if (m.headers != NULL &&
        json_parse_string_object(m.headers, strlen(m.headers), &d.row, &parse_error) != 0)
        memset(&d.row, 0, sizeof(d.row));
    draft_attributes(ce, identity, &m, &d);
    if (d.row_has_attributes) {
        write_row_headers(&d, e);
        if (e->row_headers.failed)
            goto done;
        m.headers = e->row_headers.data;
    }
    if ((ce->mode == CLOUDEVENTS_BINARY ? write_binary(prefix, &d, e, &m)
                                        : write_structured(&d, e, &m)) != 0)
        goto done;
    *message = m;
    rc = 0;
done:
    json_string_object_clear(&d.row);
    return rc;
}
