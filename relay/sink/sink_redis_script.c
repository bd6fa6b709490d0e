/*
 * sink_redis_script.c - the dedup-and-append script, making a node ready
 * to run it (sink_redis_node_connect: credentials, database, role, SCRIPT
 * LOAD), and its calls. Stands on sink_redis_node.c alone.
 *
 * Every message becomes one stream entry, exactly
 *
 *   XADD <stream_prefix><suffix> [MAXLEN ~ N] * job_id <id> queue <queue>
 *        payload <json> headers <json> attempt <n>
 *
 * where the suffix is the row's routing key, else its queue, appended at
 * most once per job per stream within the dedup window. The check and the
 * append are one atomic step in Redis: the script is loaded with SCRIPT
 * LOAD on connect and called with EVALSHA (EVAL with the script text when
 * the server answers NOSCRIPT, e.g. after SCRIPT FLUSH or a failover), one
 * call for up to SCRIPT_CHUNK messages. A job whose dedup record exists is
 * answered with the entry id recorded earlier and counts as accepted, so a
 * relay that died after the append and before marking its row never
 * appends the row a second time.
 *
 * Dedup record: "{<stream>}:outbox-dedup:<job_id>" (the stream's name as
 * hash tag, so the record lives in its stream's slot), or
 * "<stream>:outbox-dedup:<job_id>" when the stream's name holds a hash tag
 * of its own; ":<n>" follows the job id for a row replayed n times, so each
 * replay appends the job once more, and at most once. A plain string whose
 * value is the entry id, written with PX = the window, so Redis expires it
 * by itself and records are independent of each other.
 */
#include "sink_redis_script.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "clock.h"
#include "error.h"
#include "keyslot.h"

/*
 * One call appends up to SCRIPT_CHUNK messages. ARGV[1] is the window in ms,
 * ARGV[2] the maxlen ("0" for none). For message i, KEYS[2i-1] is its
 * stream, KEYS[2i] its dedup record; ARGV[5i-2 .. 5i+2] its job_id, queue,
 * payload, headers and attempt. The reply has one element per message: {entry id, 1}
 * after an append, {earlier entry id, 0} for a duplicate, or the error XADD
 * raised (WRONGTYPE, say), which fails only that message. Nothing is written
 * before XADD succeeds, so a refused append leaves no dedup record behind.
 */
const char sink_redis_append_script[] =
    "local window, maxlen, out = ARGV[1], ARGV[2], {}\n"
    "for i = 1, #KEYS / 2 do\n"
    "  local a = 5 * i - 2\n"
    "  local stream, dedup = KEYS[2 * i - 1], KEYS[2 * i]\n"
    "  local existing = redis.call('GET', dedup)\n"
    "  if existing then\n"
    "    out[i] = {existing, 0}\n"
    "  else\n"
    "    local id\n"
    "    if maxlen ~= '0' then\n"
    "      id = redis.pcall('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'job_id', ARGV[a],\n"
    "                       'queue', ARGV[a + 1], 'payload', ARGV[a + 2],\n"
    "                       'headers', ARGV[a + 3], 'attempt', ARGV[a + 4])\n"
    "    else\n"
    "      id = redis.pcall('XADD', stream, '*', 'job_id', ARGV[a], 'queue', ARGV[a + 1],\n"
    "                       'payload', ARGV[a + 2], 'headers', ARGV[a + 3],\n"
    "                       'attempt', ARGV[a + 4])\n"
    "    end\n"
    "    if type(id) == 'table' then\n"
    "      out[i] = id\n"
    "    else\n"
    "      redis.call('SET', dedup, id, 'PX', window)\n"
    "      out[i] = {id, 1}\n"
    "    end\n"
    "  end\n"
    "end\n"
    "return out\n";


int
sink_redis_reserve(char **buffer, size_t *capacity, size_t size)
{
    char *bigger;

    if (size <= *capacity)
        return 0;
    bigger = realloc(*buffer, size);
    if (bigger == NULL)
        return -1;
    *buffer = bigger;
    *capacity = size;
    return 0;
}

const char *
sink_redis_stream_suffix(const struct sink_message *message)
{
    return message->routing_key != NULL ? message->routing_key : message->queue;
}

size_t
sink_redis_stream_length(const sink *s, const struct sink_message *message)
{
    return strlen(sink_redis_prefix_of(s)) + strlen(sink_redis_stream_suffix(message));
}

size_t
sink_redis_write_stream_name(const sink *s, const struct sink_message *message, char *out)
{
    const char *suffix = sink_redis_stream_suffix(message);
    size_t prefix_len = strlen(sink_redis_prefix_of(s)), suffix_len = strlen(suffix);

    memcpy(out, sink_redis_prefix_of(s), prefix_len);
    memcpy(out + prefix_len, suffix, suffix_len);
    out[prefix_len + suffix_len] = '\0';
    return prefix_len + suffix_len;
}

/*
 * Writes the dedup record name of a message for its stream into out (room
 * for stream_len + sizeof(DEDUP_INFIX) + 35 bytes) and returns its length:
 * the stream's name as hash tag, or the name as is when it holds a tag of
 * its own (or cannot be a tag: it holds a '}'); ":<replay>" after the job id
 * for a replayed row.
 */
static size_t
write_dedup_name(const char *stream, size_t stream_len, const struct sink_message *message,
                 char *out)
{
    size_t tag_start, tag_len, n = 0;
    bool wrap = !keyslot_tag(stream, stream_len, &tag_start, &tag_len) &&
                memchr(stream, '}', stream_len) == NULL;

    if (wrap)
        out[n++] = '{';
    memcpy(out + n, stream, stream_len);
    n += stream_len;
    if (wrap)
        out[n++] = '}';
    memcpy(out + n, DEDUP_INFIX, sizeof(DEDUP_INFIX) - 1);
    n += sizeof(DEDUP_INFIX) - 1;
    if (message->replay > 0)
        n += (size_t)sprintf(out + n, "%" PRId64 ":%" PRId32, message->job_id, message->replay);
    else
        n += (size_t)sprintf(out + n, "%" PRId64, message->job_id);
    return n;
}

/* Bytes of scratch one message takes in sink_redis_append_call(). */
static size_t
scratch_size(const sink *s, const struct sink_message *message)
{
    size_t stream_len = sink_redis_stream_length(s, message);

    /* stream, dedup record (with ":<replay>"), job id, attempt, with NULs */
    return (stream_len + 1) + (stream_len + sizeof(DEDUP_INFIX) + 35) + 21 + 12;
}

/* Prints value into the scratch at *at and makes it the next argument. */
static void
add_number(struct sink_redis *r, int *argc, size_t *at, long long value)
{
    int len = sprintf(r->keys + *at, "%lld", value);

    r->argv[*argc] = r->keys + *at;
    r->argvlen[(*argc)++] = (size_t)len;
    *at += (size_t)len + 1;
}

/* Makes the next argument point to text. */
static void
add_text(struct sink_redis *r, int *argc, const char *text, size_t len)
{
    r->argv[*argc] = text;
    r->argvlen[(*argc)++] = len;
}

int
sink_redis_append_call(sink *s, redisContext *context, const struct sink_message *messages,
                       const struct route *routes, size_t n)
{
    struct sink_redis *r = s->impl;
    size_t need = 0, at = 0;
    int argc = 0;
    char numkeys[24]; /* a size_t in decimal */

    for (size_t i = 0; i < n; i++)
        need += scratch_size(s, &messages[routes[i].index]);
    if (sink_redis_reserve(&r->keys, &r->keys_capacity, need) != 0)
        return -1;
    if (routes[0].asking && redisAppendCommand(context, "ASKING") != REDIS_OK)
        return -1;
    snprintf(numkeys, sizeof(numkeys), "%zu", 2 * n);
    if (routes[0].call == CALL_EVALSHA)
        add_text(r, &argc, "EVALSHA", 7);
    else
        add_text(r, &argc, "EVAL", 4);
    if (routes[0].call == CALL_EVALSHA)
        add_text(r, &argc, r->sha, 40);
    else
        add_text(r, &argc, sink_redis_append_script, sizeof(sink_redis_append_script) - 1);
    add_text(r, &argc, numkeys, strlen(numkeys));

    for (size_t i = 0; i < n; i++) {
        const struct sink_message *m = &messages[routes[i].index];
        char *stream = r->keys + at;
        size_t stream_len = sink_redis_write_stream_name(s, m, stream), len;

        add_text(r, &argc, stream, stream_len);
        at += stream_len + 1;
        len = write_dedup_name(stream, stream_len, m, r->keys + at);
        add_text(r, &argc, r->keys + at, len);
        at += len + 1;
    }
    add_text(r, &argc, r->window_ms, strlen(r->window_ms));
    add_text(r, &argc, r->maxlen, strlen(r->maxlen));
    for (size_t i = 0; i < n; i++) {
        const struct sink_message *m = &messages[routes[i].index];
        const char *headers = m->headers != NULL ? m->headers : "{}";

        add_number(r, &argc, &at, (long long)m->job_id);
        add_text(r, &argc, m->queue, strlen(m->queue));
        if (m->payload != NULL)
            add_text(r, &argc, m->payload, m->payload_len);
        else
            add_text(r, &argc, "null", 4);
        add_text(r, &argc, headers, strlen(headers));
        add_number(r, &argc, &at, (long long)m->attempt);
    }
    return redisAppendCommandArgv(context, argc, r->argv, r->argvlen) == REDIS_OK ? 0 : -1;
}

size_t
sink_redis_call_length(const struct route *routes, size_t from, size_t n)
{
    size_t length = 1;

    while (from + length < n && length < SCRIPT_CHUNK &&
           routes[from + length].slot == routes[from].slot)
        length++;
    return length;
}

void
sink_redis_settle_message(sink *s, const struct sink_message *message, const redisReply *reply,
                          struct sink_outcome *outcome)
{
    char reason[SINK_REASON_MAX - 64];

    if (reply->type == REDIS_REPLY_ERROR) {
        sink_redis_copy_redis_error(reason, sizeof(reason), reply->str, reply->len);
        sink_outcome_set(outcome, SINK_FAILED, "redis refused the append to '%s%.100s': %s",
                         sink_redis_prefix_of(s), sink_redis_stream_suffix(message), reason);
        return;
    }
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 2 &&
        reply->element[0]->type == REDIS_REPLY_STRING &&
        reply->element[1]->type == REDIS_REPLY_INTEGER) {
        sink_outcome_set(outcome, SINK_ACCEPTED, NULL);
        return;
    }
    sink_outcome_set(outcome, SINK_FAILED, "redis answered the append with an unexpected reply");
}

int
sink_redis_node_connect(sink *s, struct sink_redis_node *node, struct outbox_error *err)
{
    struct sink_redis *r = s->impl;
    redisReply *reply = NULL;
    char db[16];

    if (sink_redis_node_open(s, node, true, err) != 0)
        return -1;
    if (sink_redis_url_db(&s->url) != 0 && r->topology != TOPOLOGY_CLUSTER) {
        const char *argv[2] = {"SELECT", db};

        snprintf(db, sizeof(db), "%d", sink_redis_url_db(&s->url));
        if (sink_redis_setup_command(s, node, 2, argv, "refused to select the database", NULL,
                                     err) != 0)
            return -1;
    }
    if (r->topology == TOPOLOGY_SENTINEL) {
        const char *argv[1] = {"ROLE"};
        bool master;

        if (sink_redis_setup_command(s, node, 1, argv, "refused ROLE", &reply, err) != 0)
            return -1;
        master = reply->type == REDIS_REPLY_ARRAY && reply->elements > 0 &&
                 reply->element[0]->type == REDIS_REPLY_STRING &&
                 strcmp(reply->element[0]->str, "master") == 0;
        freeReplyObject(reply);
        if (!master) {
            sink_redis_node_drop(node);
            return outbox_error_set(err, OUTBOX_ERR_CONNECTION,
                                    "redis at %s, named primary by a sentinel, is not a master",
                                    node->name);
        }
    }
    {
        const char *argv[3] = {"SCRIPT", "LOAD", sink_redis_append_script};

        if (sink_redis_setup_command(s, node, 3, argv, "refused to load the append script", &reply,
                                     err) != 0)
            return -1;
    }
    if (reply->type != REDIS_REPLY_STRING || reply->len != 40) {
        freeReplyObject(reply);
        sink_redis_node_drop(node);
        return outbox_error_set(err, OUTBOX_ERR_BROKER,
                                "redis at %s answered SCRIPT LOAD with something other than a sha1",
                                sink_redis_node_label(s, node));
    }
    memcpy(r->sha, reply->str, 40);
    r->sha[40] = '\0';
    freeReplyObject(reply);
    return 0;
}
