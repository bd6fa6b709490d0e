/*
 * redis_consumer.h - test helpers that read what the relay appended to Redis.
 *
 * Integration tests use these to look at streams the way a consumer would:
 * connect with the same redis:// URL as the relay (password, ACL user, db),
 * count and read whole streams, and remove the keys a test created. They
 * are for tests only: errors print nothing and are reported by return value.
 */
#ifndef OUTBOX_TESTS_REDIS_CONSUMER_H
#define OUTBOX_TESTS_REDIS_CONSUMER_H

#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

/*
 * Connects to a redis:// URL, authenticates and selects its db. Returns
 * NULL on any failure (bad URL, unreachable, refused credentials). Free the
 * context with redisFree().
 */
redisContext *stream_consumer_connect(const char *url);

/*
 * Runs one command given as argv strings and returns its reply (free with
 * freeReplyObject), or NULL when the connection failed.
 */
redisReply *stream_consumer_command(redisContext *context, int argc, const char **argv);

/* The number of entries of a stream (XLEN; 0 when it does not exist), or -1. */
long long stream_consumer_stream_length(redisContext *context, const char *stream);

/* The number of entries XRANGE stream - + returns (reads every page), or -1. */
long long stream_consumer_xrange_count(redisContext *context, const char *stream);

/* One stream entry with the fields the relay writes; strings are owned. */
struct stream_consumer_entry {
    char *id; /* "<ms>-<seq>" */
    int64_t job_id;
    char *queue;
    char *payload;
    char *headers;
    int32_t attempt;
    char *message_id;   /* what consumers deduplicate on */
    size_t field_count; /* field/value pairs in the entry, 6 for a relay entry */
};

struct stream_consumer_stream {
    struct stream_consumer_entry *entries;
    size_t count;
};

/*
 * Reads every entry of a stream in order, in pages of XRANGE COUNT 1000.
 * Fields the relay did not write are counted but not kept; missing ones are
 * NULL / 0. Returns 0, or -1 (stream is then empty).
 */
int stream_consumer_read_stream(redisContext *context, const char *stream, struct stream_consumer_stream *out);
void stream_consumer_stream_clear(struct stream_consumer_stream *stream);

/* The number of keys that start with prefix (SCAN), or -1. */
long long stream_consumer_count_prefix(redisContext *context, const char *prefix);

/* Deletes every key that starts with prefix (SCAN + UNLINK); the count or -1. */
long long stream_consumer_delete_prefix(redisContext *context, const char *prefix);

/*
 * Deletes a test's keys: those of prefix and those of "{" + prefix (the
 * relay's dedup and order records, hash-tagged for a cluster).
 */
void stream_consumer_delete_test_keys(redisContext *context, const char *prefix);

#endif
