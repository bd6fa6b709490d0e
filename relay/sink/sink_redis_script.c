/*
 * sink_redis_script.c - the dedup-and-append script, making a node ready
 * to run it (sink_redis_node_connect: credentials, database, role, SCRIPT
 * LOAD), and its calls. Stands on sink_redis_node.c alone.
 *
 * Every message becomes one stream entry, exactly
 *
 *   XADD <stream_prefix><suffix> [MAXLEN ~ N] * job_id <id> queue <queue>
 *        payload <json> headers <json> attempt <n> message_id <message id>
 *        [content-type <type> ce_<attribute> <value> ...]
 *
 * where the suffix is the row's routing key, else its queue, appended at
 * most once per job per stream within the dedup window. The check and the
 * append are one atomic step in Redis: the script is loaded with SCRIPT
 * LOAD on connect and called with EVALSHA (EVAL with the script text when
 * the server answers NOSCRIPT, e.g. after SCRIPT FLUSH or a failover), one
 * call for up to SCRIPT_CHUNK messages. A job found appended before counts
 * as accepted, so a relay that died after the append and before marking
 * its row never appends the row a second time.
 *
 * Dedup record: "{<stream>}:outbox-dedup:<database>:<message_uid>" (the
 * stream's name as hash tag, so the record lives in its stream's slot), or
 * "<stream>:outbox-dedup:..." when the stream's name holds a hash tag of its
 * own: the message id in the form uid (sink.h: dedup_id), unique across
 * databases and their histories whatever form consumers see; ".r<n>" follows
 * for a row replayed n times, so each replay appends the job once more, and
 * at most once. A plain string whose
 * value is the entry id, written with PX = the window, so Redis expires it
 * by itself and records are independent of each other.
 *
 * Order record: a stream queue's rows are published in the order of their
 * partition (sink_message.place_*), so one record per partition and stream
 * says how far they were appended, instead of one record per row (writing
 * that record was half of Redis' work per message):
 * "{<stream>}:outbox-order:<queue>:<database>:<epoch>:<stream epoch>:<partition>"
 * (named like the dedup record; the database's history first, since a
 * partition's places start again lower after a restore or a failover),
 * written with PX = the window. The script below says how
 * it is kept.
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
 * ARGV[2] the maxlen ("0" for none). For message i, KEYS[3i-2] is its
 * stream, KEYS[3i-1] its dedup record, KEYS[3i] its order record (the dedup
 * record again for a message without a place); then, from ARGV[3] on,
 * per message in turn: its job_id, queue, payload, headers, attempt, place
 * ("" for none), the place before it (the previous row of its order
 * published to its stream, "F" and a floor: every row of the order up to
 * there is published or gone, or "" when unknown), its message id, its row's
 * identity ("" for none), the relay's verdict on a check ("" for none), and
 * n, the count of the extra fields (CloudEvents' attributes, 0 without)
 * whose 2n names and values follow, appended after the others.
 *
 * An order record holds two places, 39 digits each, then an identity (after
 * "?" while a check is pending, below): done,
 * every row of the order up to it is in the stream or gone from the order;
 * gap, the highest place appended out of turn (under its own dedup record);
 * the identity (message_uid) of the row at done when a row appended in turn
 * put it there ("" when a floor did, or a record of an earlier release). A
 * message at or before done was appended before. One whose previous row is
 * at or before done comes in turn: it is appended and moves done, with no
 * record of its own (its dedup record is looked at only at or before gap).
 * Any other is appended out of turn, under a dedup record as a message
 * without a place is, and raises gap. A failed append moves nothing, so a
 * row after it is out of turn until the failed one is appended or gone
 * (then the floor passes it).
 *
 * Done is a place of the database's history that published it: a crash
 * that lost commits the stream had published, or a restore to an earlier
 * point, hands those places out again to other rows. So a message with an
 * identity (a row the stream read) is never taken for appended on done
 * alone while done is after its floor: unless the relay's verdict says the
 * database holds the row done names ("ok" and the check), the script
 * answers "V<done><identity>" for it and appends nothing; "gone" and the
 * check drop done (the floor takes its place: the rows after it go out in
 * turn). A floor at or after done needs no check. Once a message asks, the
 * order record says so ("?" before its identity) until a verdict or a floor
 * settles it, and every later message of the order with an identity gets
 * the same answer, in this call or a later one of the same batch: one
 * appended in turn would move done past the rows still asking, onto a row
 * the database may hold, and the answer "ok" would then pass those rows
 * unappended; one appended out of turn would go out before them.
 *
 * The reply has one element per message: 1 after an append, 0 when the job
 * was appended before, the check string, or the error XADD raised
 * (WRONGTYPE, say), which fails only that message. Nothing is recorded
 * before XADD succeeds, so a refused append leaves no record behind.
 */
const char sink_redis_append_script[] =
    "local window, maxlen, out, orders, changed = ARGV[1], ARGV[2], {}, {}, {}\n"
    "local none = string.rep('0', 39)\n"
    "local function touch(order)\n"
    "  if not order.dirty then\n"
    "    order.dirty = true\n"
    "    changed[#changed + 1] = order\n"
    "  end\n"
    "end\n"
    "local function load(key)\n"
    "  local order = orders[key]\n"
    "  if not order then\n"
    "    local v = redis.call('GET', key)\n"
    "    order = {key = key, done = none, gap = none, uid = ''}\n"
    "    if v and #v >= 78 then\n"
    "      order.done, order.gap, order.uid = string.sub(v, 1, 39), string.sub(v, 40, 78),\n"
    "                                         string.sub(v, 79)\n"
    "      if string.sub(order.uid, 1, 1) == '?' then\n"
    "        order.asking, order.uid = true, string.sub(order.uid, 2)\n"
    "      end\n"
    "    end\n"
    "    orders[key] = order\n"
    "  end\n"
    "  return order\n"
    "end\n"
    "local a = 3\n"
    "for i = 1, #KEYS / 3 do\n"
    "  local extra = tonumber(ARGV[a + 10])\n"
    "  local stream, dedup, place = KEYS[3 * i - 2], KEYS[3 * i - 1], ARGV[a + 5]\n"
    "  local uid, verdict = ARGV[a + 8], ARGV[a + 9]\n"
    "  local order, in_turn, seen, ask = nil, false, false, false\n"
    "  if place ~= '' then\n"
    "    order = load(KEYS[3 * i])\n"
    "    if verdict ~= '' and not order.ok then\n"
    "      local check = order.done .. order.uid\n"
    "      if verdict == 'ok' .. check then\n"
    "        if order.asking then touch(order) end\n"
    "        order.ok, order.asking = true, false\n"
    "      elseif verdict == 'gone' .. check then\n"
    "        order.ok, order.asking, order.done, order.uid = true, false, none, ''\n"
    "        touch(order)\n"
    "      end\n"
    "    end\n"
    "    local before = ARGV[a + 6]\n"
    "    if string.sub(before, 1, 1) == 'F' then\n"
    "      before = string.sub(before, 2)\n"
    "      if before >= order.done then\n"
    "        if order.asking then touch(order) end\n"
    "        order.ok, order.asking = true, false\n"
    "      end\n"
    "      if before > order.done then\n"
    "        order.done, order.uid = before, ''\n"
    "        touch(order)\n"
    "      end\n"
    "    end\n"
    "    ask = uid ~= '' and not order.ok and (order.asking or place <= order.done)\n"
    "    seen = place <= order.done\n"
    "    in_turn = before ~= '' and before <= order.done\n"
    "  end\n"
    "  if ask then\n"
    "    if not order.asking then\n"
    "      order.asking = true\n"
    "      touch(order)\n"
    "    end\n"
    "    out[i] = 'V' .. order.done .. order.uid\n"
    "  else\n"
    "    if not seen and (not in_turn or place <= order.gap) then\n"
    "      seen = redis.call('GET', dedup) ~= false\n"
    "      if seen and in_turn then\n"
    "        order.done, order.uid = place, uid\n"
    "        touch(order)\n"
    "      end\n"
    "    end\n"
    "    if seen then\n"
    "      out[i] = 0\n"
    "    else\n"
    "      local id\n"
    "      if extra > 0 and maxlen ~= '0' then\n"
    "        id = redis.pcall('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'job_id', ARGV[a],\n"
    "                         'queue', ARGV[a + 1], 'payload', ARGV[a + 2],\n"
    "                         'headers', ARGV[a + 3], 'attempt', ARGV[a + 4],\n"
    "                         'message_id', ARGV[a + 7], unpack(ARGV, a + 11, a + 10 + 2 * extra))\n"
    "      elseif extra > 0 then\n"
    "        id = redis.pcall('XADD', stream, '*', 'job_id', ARGV[a], 'queue', ARGV[a + 1],\n"
    "                         'payload', ARGV[a + 2], 'headers', ARGV[a + 3],\n"
    "                         'attempt', ARGV[a + 4], 'message_id', ARGV[a + 7],\n"
    "                         unpack(ARGV, a + 11, a + 10 + 2 * extra))\n"
    "      elseif maxlen ~= '0' then\n"
    "        id = redis.pcall('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'job_id', ARGV[a],\n"
    "                         'queue', ARGV[a + 1], 'payload', ARGV[a + 2],\n"
    "                         'headers', ARGV[a + 3], 'attempt', ARGV[a + 4],\n"
    "                         'message_id', ARGV[a + 7])\n"
    "      else\n"
    "        id = redis.pcall('XADD', stream, '*', 'job_id', ARGV[a], 'queue', ARGV[a + 1],\n"
    "                         'payload', ARGV[a + 2], 'headers', ARGV[a + 3],\n"
    "                         'attempt', ARGV[a + 4], 'message_id', ARGV[a + 7])\n"
    "      end\n"
    "      if type(id) == 'table' then\n"
    "        out[i] = id\n"
    "      else\n"
    "        out[i] = 1\n"
    "        if in_turn then\n"
    "          order.done, order.uid = place, uid\n"
    "        else\n"
    "          redis.call('SET', dedup, id, 'PX', window)\n"
    "          if order and place > order.gap then order.gap = place end\n"
    "        end\n"
    "        if order then touch(order) end\n"
    "      end\n"
    "    end\n"
    "  end\n"
    "  a = a + 11 + 2 * extra\n"
    "end\n"
    "for _, order in ipairs(changed) do\n"
    "  redis.call('SET', order.key, order.done .. order.gap .. (order.asking and '?' or '') ..\n"
    "             order.uid, 'PX', window)\n"
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
 * Writes the start of a record name of stream into out and returns its
 * length: the stream's name as hash tag, or the name as is when it holds a
 * tag of its own (or cannot be a tag: it holds a '}'), so the record lives
 * in its stream's slot.
 */
static size_t
write_record_prefix(const char *stream, size_t stream_len, char *out)
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
    return n;
}

/* The dedup record of a message in stream: "<prefix>:outbox-dedup:<full message id>". */
static size_t
write_dedup_name(const char *stream, size_t stream_len, const struct sink_message *message,
                 char *out)
{
    size_t n = write_record_prefix(stream, stream_len, out);

    n += (size_t)sprintf(out + n, "%s%s", DEDUP_INFIX, message->dedup_id);
    return n;
}

/*
 * The order record of a message with a place in stream:
 * "<prefix>:outbox-order:<queue>:<history>:<order>".
 */
static size_t
write_order_name(const char *stream, size_t stream_len, const struct sink_message *message,
                 char *out)
{
    size_t n = write_record_prefix(stream, stream_len, out);

    n += (size_t)sprintf(out + n, "%s%s:%s:%s", ORDER_INFIX, message->queue, message->history,
                         message->place.order);
    return n;
}

/* Bytes of scratch one message takes in sink_redis_append_call(). */
static size_t
scratch_size(const sink *s, const struct sink_message *message)
{
    size_t stream_len = sink_redis_stream_length(s, message), size;

    /* stream, dedup record, job id, attempt, extra field count, with NULs */
    size = (stream_len + 1) + (stream_len + sizeof(DEDUP_INFIX) + strlen(message->dedup_id) + 3) +
           21 + 12 + 21;
    if (message->place.order != NULL) /* order record, "F" and a floor */
        size += stream_len + sizeof(ORDER_INFIX) + strlen(message->queue) +
                strlen(message->history) + strlen(message->place.order) + 5 + 1 +
                STREAM_PLACE_DIGITS + 1;
    return size;
}

/* Whether messages a and b share an order, a floor and a stream. */
static bool
same_order(const struct sink_message *a, const struct sink_message *b)
{
    return a->place.order != NULL && a->place.floor != NULL &&
           strcmp(a->place.order, b->place.order) == 0 &&
           strcmp(a->place.floor, b->place.floor) == 0 && strcmp(a->queue, b->queue) == 0 &&
           strcmp(sink_redis_stream_suffix(a), sink_redis_stream_suffix(b)) == 0;
}

/*
 * The place before messages[index] in its order and stream, for the
 * script. With a floor the messages of an order are its rows right after
 * the floor, in order (sink.h): the place of the nearest earlier message of
 * the order and stream in the batch, else "F" and the floor (into
 * floor_out). Without a floor, or when none is found within PLACE_LOOKBACK
 * messages, "": unknown, the message goes out of turn.
 */
static const char *
place_before(const struct sink_message *messages, size_t index, char *floor_out)
{
    const struct sink_message *m = &messages[index];
    size_t lowest = index > PLACE_LOOKBACK ? index - PLACE_LOOKBACK : 0;

    if (m->place.floor == NULL)
        return "";
    for (size_t j = index; j > lowest; j--)
        if (same_order(&messages[j - 1], m))
            return messages[j - 1].place.at;
    if (lowest > 0)
        return "";
    floor_out[0] = 'F';
    snprintf(floor_out + 1, STREAM_PLACE_DIGITS + 1, "%s", m->place.floor);
    return floor_out;
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

/* Makes the next argument text, or "" for NULL. */
static void
add_optional(struct sink_redis *r, int *argc, const char *text)
{
    add_text(r, argc, text != NULL ? text : "", text != NULL ? strlen(text) : 0);
}

/*
 * The script's keys for the n routed messages, written into r->keys from
 * its start: per message its stream, its dedup record and its order record
 * (the dedup record again when it has none). Returns the bytes of r->keys
 * used.
 */
static size_t
add_keys(sink *s, const struct sink_message *messages, const struct route *routes, size_t n,
         int *argc)
{
    struct sink_redis *r = s->impl;
    size_t at = 0;

    for (size_t i = 0; i < n; i++) {
        const struct sink_message *m = &messages[routes[i].index];
        char *stream = r->keys + at, *dedup;
        size_t stream_len = sink_redis_stream_length(s, m), dedup_len, len;

        sink_redis_write_stream_name(s, m, stream);
        add_text(r, argc, stream, stream_len);
        at += stream_len + 1;
        dedup = r->keys + at;
        dedup_len = write_dedup_name(stream, stream_len, m, dedup);
        add_text(r, argc, dedup, dedup_len);
        at += dedup_len + 1;
        if (m->place.order == NULL) {
            add_text(r, argc, dedup, dedup_len); /* no order record */
            continue;
        }
        len = write_order_name(stream, stream_len, m, r->keys + at);
        add_text(r, argc, r->keys + at, len);
        at += len + 1;
    }
    return at;
}

/*
 * A message's extra fields for the script: their count, then each name and
 * value; CloudEvents' content-type first when it has one.
 */
static void
add_extra_fields(struct sink_redis *r, int *argc, size_t *at, const struct sink_message *m)
{
    add_number(r, argc, at, (long long)(m->extra_header_count + (m->content_type != NULL)));
    if (m->content_type != NULL) {
        add_text(r, argc, "content-type", 12);
        add_text(r, argc, m->content_type, strlen(m->content_type));
    }
    for (size_t h = 0; h < m->extra_header_count; h++) {
        add_text(r, argc, m->extra_headers[h].name, strlen(m->extra_headers[h].name));
        add_text(r, argc, m->extra_headers[h].value, strlen(m->extra_headers[h].value));
    }
}

/*
 * The script's arguments past the keys, per message: job id, queue,
 * payload, headers, attempt, place and the place before it, message id,
 * the row's identity and the relay's verdict on a check.
 * Numbers and places go into r->keys from at on.
 */
static void
add_arguments(sink *s, const struct sink_message *messages, const struct route *routes,
              size_t n, int *argc, size_t at)
{
    struct sink_redis *r = s->impl;

    for (size_t i = 0; i < n; i++) {
        const struct sink_message *m = &messages[routes[i].index];
        const char *headers = m->headers != NULL ? m->headers : "{}", *before;

        add_number(r, argc, &at, (long long)m->job_id);
        add_text(r, argc, m->queue, strlen(m->queue));
        if (m->payload != NULL)
            add_text(r, argc, m->payload, m->payload_len);
        else
            add_text(r, argc, "null", 4);
        add_text(r, argc, headers, strlen(headers));
        add_number(r, argc, &at, (long long)m->attempt);
        if (m->place.order == NULL) {
            add_text(r, argc, "", 0);
            add_text(r, argc, "", 0);
        } else {
            add_text(r, argc, m->place.at, strlen(m->place.at));
            before = place_before(messages, routes[i].index, r->keys + at);
            add_text(r, argc, before, strlen(before));
            if (before == r->keys + at)
                at += STREAM_PLACE_DIGITS + 2;
        }
        add_text(r, argc, m->message_id, strlen(m->message_id));
        add_optional(r, argc, m->place.order != NULL ? m->place.uid : NULL);
        add_optional(r, argc, m->place.order != NULL ? m->place.verdict : NULL);
        add_extra_fields(r, argc, &at, m);
    }
}

int
sink_redis_append_call(sink *s, redisContext *context, const struct sink_message *messages,
                       const struct route *routes, size_t n)
{
    struct sink_redis *r = s->impl;
    size_t need = 0, at;
    int argc = 0;
    char numkeys[24]; /* a size_t in decimal */

    for (size_t i = 0; i < n; i++)
        need += scratch_size(s, &messages[routes[i].index]);
    if (sink_redis_reserve(&r->keys, &r->keys_capacity, need) != 0)
        return -1;
    if (routes[0].asking && redisAppendCommand(context, "ASKING") != REDIS_OK)
        return -1;
    snprintf(numkeys, sizeof(numkeys), "%zu", 3 * n);
    if (routes[0].call == CALL_EVALSHA)
        add_text(r, &argc, "EVALSHA", 7);
    else
        add_text(r, &argc, "EVAL", 4);
    if (routes[0].call == CALL_EVALSHA)
        add_text(r, &argc, r->sha, 40);
    else
        add_text(r, &argc, sink_redis_append_script, sizeof(sink_redis_append_script) - 1);
    add_text(r, &argc, numkeys, strlen(numkeys));

    at = add_keys(s, messages, routes, n, &argc);
    add_text(r, &argc, r->window_ms, strlen(r->window_ms));
    add_text(r, &argc, r->maxlen, strlen(r->maxlen));
    add_arguments(s, messages, routes, n, &argc, at);
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
    if (reply->type == REDIS_REPLY_INTEGER) {
        sink_outcome_set(outcome, SINK_ACCEPTED, NULL);
        return;
    }
    if (reply->type == REDIS_REPLY_STRING && reply->len > STREAM_PLACE_DIGITS &&
        reply->len < SINK_CHECK_SIZE && reply->str[0] == 'V') {
        sink_outcome_set(outcome, SINK_DEFERRED,
                         "the order record of '%s%.100s' names a row to check in the database",
                         sink_redis_prefix_of(s), sink_redis_stream_suffix(message));
        memcpy(outcome->check, reply->str + 1, reply->len - 1);
        outcome->check[reply->len - 1] = '\0';
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

    if (sink_redis_node_open(s, node, REDIS_AUTHENTICATE, err) != 0)
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
