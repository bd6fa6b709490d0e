/*
 * redis_consumer.c - test helpers that read streams back from Redis.
 */
#include "redis_consumer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sink.h"
#include "url.h"
#include "sink_redis.h"

redisContext *
stream_consumer_connect(const char *url)
{
    struct broker_url parsed;
    struct outbox_error err;
    struct timeval timeout = {5, 0};
    redisContext *context;
    redisReply *reply;

    if (url == NULL || sink_url_parse(url, &parsed, &err) != 0)
        return NULL;
    if (strcmp(parsed.scheme->name, "redis") != 0) {
        url_clear(&parsed);
        return NULL;
    }
    context = redisConnectWithTimeout(parsed.host, parsed.port, timeout);
    if (context == NULL || context->err != 0 || redisSetTimeout(context, timeout) != REDIS_OK)
        goto fail;
    if (parsed.password != NULL) {
        const char *argv[3] = {"AUTH", NULL, NULL};
        int argc = 1;

        if (parsed.user != NULL)
            argv[argc++] = parsed.user;
        argv[argc++] = parsed.password;
        reply = stream_consumer_command(context, argc, argv);
        if (reply == NULL || reply->type == REDIS_REPLY_ERROR) {
            freeReplyObject(reply);
            goto fail;
        }
        freeReplyObject(reply);
    }
    if (sink_redis_url_db(&parsed) != 0) {
        char db[16];
        const char *argv[2] = {"SELECT", db};

        snprintf(db, sizeof(db), "%d", sink_redis_url_db(&parsed));
        reply = stream_consumer_command(context, 2, argv);
        if (reply == NULL || reply->type == REDIS_REPLY_ERROR) {
            freeReplyObject(reply);
            goto fail;
        }
        freeReplyObject(reply);
    }
    url_clear(&parsed);
    return context;

fail:
    if (context != NULL)
        redisFree(context);
    url_clear(&parsed);
    return NULL;
}

redisReply *
stream_consumer_command(redisContext *context, int argc, const char **argv)
{
    return redisCommandArgv(context, argc, argv, NULL);
}

long long
stream_consumer_stream_length(redisContext *context, const char *stream)
{
    const char *argv[2] = {"XLEN", stream};
    redisReply *reply = stream_consumer_command(context, 2, argv);
    long long length = -1;

    if (reply != NULL && reply->type == REDIS_REPLY_INTEGER)
        length = reply->integer;
    freeReplyObject(reply);
    return length;
}

/* strndup of a reply string. */
static char *
copy_reply_string(const redisReply *reply)
{
    char *copy = malloc(reply->len + 1);

    if (copy != NULL) {
        memcpy(copy, reply->str, reply->len);
        copy[reply->len] = '\0';
    }
    return copy;
}

/* Fills entry from one XRANGE element ([id, [field, value, ...]]); -1 when malformed. */
static int
parse_entry(const redisReply *element, struct stream_consumer_entry *entry)
{
    const redisReply *fields;

    memset(entry, 0, sizeof(*entry));
    if (element->type != REDIS_REPLY_ARRAY || element->elements != 2 ||
        element->element[0]->type != REDIS_REPLY_STRING ||
        element->element[1]->type != REDIS_REPLY_ARRAY)
        return -1;
    entry->id = copy_reply_string(element->element[0]);
    if (entry->id == NULL)
        return -1;
    fields = element->element[1];
    for (size_t i = 0; i + 1 < fields->elements; i += 2) {
        const redisReply *name = fields->element[i], *value = fields->element[i + 1];
        char **slot = NULL;

        entry->field_count++;
        if (name->type != REDIS_REPLY_STRING || value->type != REDIS_REPLY_STRING)
            continue;
        if (strcmp(name->str, "job_id") == 0)
            entry->job_id = strtoll(value->str, NULL, 10);
        else if (strcmp(name->str, "attempt") == 0)
            entry->attempt = (int32_t)strtol(value->str, NULL, 10);
        else if (strcmp(name->str, "queue") == 0)
            slot = &entry->queue;
        else if (strcmp(name->str, "payload") == 0)
            slot = &entry->payload;
        else if (strcmp(name->str, "headers") == 0)
            slot = &entry->headers;
        else if (strcmp(name->str, "message_id") == 0)
            slot = &entry->message_id;
        if (slot != NULL) {
            free(*slot);
            *slot = copy_reply_string(value);
            if (*slot == NULL)
                return -1;
        }
    }
    return 0;
}

static void
entry_clear(struct stream_consumer_entry *entry)
{
    free(entry->id);
    free(entry->queue);
    free(entry->payload);
    free(entry->headers);
    free(entry->message_id);
}

int
stream_consumer_read_stream(redisContext *context, const char *stream, struct stream_consumer_stream *out)
{
    char start[64] = "-";
    size_t capacity = 0;

    out->entries = NULL;
    out->count = 0;
    for (;;) {
        const char *argv[6] = {"XRANGE", stream, start, "+", "COUNT", "1000"};
        redisReply *reply = stream_consumer_command(context, 6, argv);

        if (reply == NULL || reply->type != REDIS_REPLY_ARRAY) {
            freeReplyObject(reply);
            goto fail;
        }
        if (reply->elements == 0) {
            freeReplyObject(reply);
            return 0;
        }
        if (out->count + reply->elements > capacity) {
            size_t bigger = (out->count + reply->elements) * 2;
            struct stream_consumer_entry *grown = realloc(out->entries, bigger * sizeof(*grown));

            if (grown == NULL) {
                freeReplyObject(reply);
                goto fail;
            }
            out->entries = grown;
            capacity = bigger;
        }
        for (size_t i = 0; i < reply->elements; i++) {
            if (parse_entry(reply->element[i], &out->entries[out->count]) != 0) {
                entry_clear(&out->entries[out->count]);
                freeReplyObject(reply);
                goto fail;
            }
            out->count++;
        }
        /* the next page starts after the last id read (exclusive range, Redis 6.2+) */
        snprintf(start, sizeof(start), "(%s", out->entries[out->count - 1].id);
        freeReplyObject(reply);
    }

fail:
    stream_consumer_stream_clear(out);
    return -1;
}

void
stream_consumer_stream_clear(struct stream_consumer_stream *stream)
{
    if (stream == NULL)
        return;
    for (size_t i = 0; i < stream->count; i++)
        entry_clear(&stream->entries[i]);
    free(stream->entries);
    stream->entries = NULL;
    stream->count = 0;
}

long long
stream_consumer_xrange_count(redisContext *context, const char *stream)
{
    struct stream_consumer_stream entries;
    long long count;

    if (stream_consumer_read_stream(context, stream, &entries) != 0)
        return -1;
    count = (long long)entries.count;
    stream_consumer_stream_clear(&entries);
    return count;
}

/* A SCAN pattern matching the keys that start with prefix (glob characters escaped); NULL: no memory. */
static char *
prefix_pattern(const char *prefix)
{
    char *pattern = malloc(2 * strlen(prefix) + 2);
    size_t n = 0;

    if (pattern == NULL)
        return NULL;
    for (const char *p = prefix; *p != '\0'; p++) {
        if (strchr("*?[]\\", *p) != NULL)
            pattern[n++] = '\\';
        pattern[n++] = *p;
    }
    pattern[n++] = '*';
    pattern[n] = '\0';
    return pattern;
}

/*
 * SCANs the keys that start with prefix; with unlink, UNLINKs each page of
 * them. The number of keys found (or unlinked), -1 on an error.
 */
static long long
scan_prefix(redisContext *context, const char *prefix, bool unlink)
{
    char cursor[32] = "0";
    char *pattern = prefix_pattern(prefix);
    long long total = 0;

    if (pattern == NULL)
        return -1;
    do {
        const char *argv[6] = {"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"};
        redisReply *reply = stream_consumer_command(context, 6, argv);
        const redisReply *keys;

        if (reply == NULL || reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
            reply->element[0]->type != REDIS_REPLY_STRING) {
            freeReplyObject(reply);
            free(pattern);
            return -1;
        }
        snprintf(cursor, sizeof(cursor), "%s", reply->element[0]->str);
        keys = reply->element[1];
        if (!unlink) {
            total += (long long)keys->elements;
        } else if (keys->elements > 0) {
            const char **argv_unlink = malloc((keys->elements + 1) * sizeof(*argv_unlink));
            redisReply *unlinked;

            if (argv_unlink == NULL) {
                freeReplyObject(reply);
                free(pattern);
                return -1;
            }
            argv_unlink[0] = "UNLINK";
            for (size_t i = 0; i < keys->elements; i++)
                argv_unlink[i + 1] = keys->element[i]->str;
            unlinked = stream_consumer_command(context, (int)keys->elements + 1, argv_unlink);
            if (unlinked != NULL && unlinked->type == REDIS_REPLY_INTEGER)
                total += unlinked->integer;
            freeReplyObject(unlinked);
            free(argv_unlink);
        }
        freeReplyObject(reply);
    } while (strcmp(cursor, "0") != 0);
    free(pattern);
    return total;
}

long long
stream_consumer_count_prefix(redisContext *context, const char *prefix)
{
    return scan_prefix(context, prefix, false);
}

long long
stream_consumer_delete_prefix(redisContext *context, const char *prefix)
{
    return scan_prefix(context, prefix, true);
}

void
stream_consumer_delete_test_keys(redisContext *context, const char *prefix)
{
    char tagged[256];

    scan_prefix(context, prefix, true);
    snprintf(tagged, sizeof(tagged), "{%s", prefix);
    scan_prefix(context, tagged, true);
}
