/*
 * sink_redis_script.h - the dedup-and-append script: its text, making a node
 * ready to run it, stream names, and building and reading its calls.
 *
 * Stands on sink_redis_node.c alone; the sentinel, cluster and publish
 * files call it.
 */
#ifndef OUTBOX_SINK_REDIS_SCRIPT_H
#define OUTBOX_SINK_REDIS_SCRIPT_H

#include "sink_redis_node.h"

/* The dedup-and-append script (sink_redis_script.c), loaded on connect. */
extern const char sink_redis_append_script[];

/*
 * Makes a node ready for script calls: connects, authenticates, selects the
 * db, checks it is a master when the sentinels named it, loads the script.
 */
int sink_redis_node_connect(sink *s, struct sink_redis_node *node, struct outbox_error *err);

/* Makes a scratch buffer hold at least size bytes; -1 when out of memory. */
int sink_redis_reserve(char **buffer, size_t *capacity, size_t size);

/* The stream of a message is stream_prefix + this: its routing key, else its queue. */
const char *sink_redis_stream_suffix(const struct sink_message *message);

/* The length of a message's stream name, "<prefix><suffix>". */
size_t sink_redis_stream_length(const sink *s, const struct sink_message *message);

/* Writes a message's stream name into out (stream_length + 1 bytes); its length. */
size_t sink_redis_write_stream_name(const sink *s, const struct sink_message *message, char *out);

/*
 * Appends one script call for the messages of routes[0..n-1] to a node's
 * output buffer (ASKING first when they were redirected with -ASK); -1 when
 * out of memory. The arguments are laid out as sink_redis_append_script reads them:
 * first the keys of every message, then the shared values, then five values
 * a message. Keys and numbers are written into the scratch buffer, the rest
 * points into the messages.
 */
int sink_redis_append_call(sink *s, redisContext *context, const struct sink_message *messages,
                           const struct route *routes, size_t n);

/* Messages in the next call from routes[from]: up to SCRIPT_CHUNK of one slot. */
size_t sink_redis_call_length(const struct route *routes, size_t from, size_t n);

/* Turns the reply element for one message into its outcome. */
void sink_redis_settle_message(sink *s, const struct sink_message *message, const redisReply *reply,
                               struct sink_outcome *outcome);

#endif
