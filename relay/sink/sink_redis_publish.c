/*
 * sink_redis_publish.c - publishing a batch: pipelined calls per node,
 * WAIT, and each message's outcome.
 *
 * A batch is pipelined per node: script calls are appended with
 * redisAppendCommandArgv and their replies read in order, with at most
 * PIPELINE_WINDOW messages in flight so the output buffer stays bounded.
 * An error in the reply for one message (WRONGTYPE, or OOM over maxmemory)
 * fails only that message. An error for a whole call (BUSY, LOADING,
 * TRYAGAIN), a broken connection, a timeout, too few replicas for
 * --redis-wait or a cluster slot nobody serves is no message's fault: it
 * defers the messages it touched (SINK_DEFERRED, no attempt spent). A
 * broken connection or a timeout defers every message still without a
 * reply, frees every connection and leaves the sink disconnected; what
 * Redis did append is answered from its dedup record when published again.
 * With --redis-wait N each node's calls of a batch are followed by WAIT N
 * SINK_REDIS_WAIT_TIMEOUT_MS; when fewer replicas acknowledged, the messages of those
 * calls are deferred. Writing to a closed socket raises SIGPIPE: the
 * process must ignore it, as the relay does.
 */
#include "sink_redis_publish.h"
#include "sink_redis_cluster.h"
#include "sink_redis_replicas.h"
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
 * Turns the reply to one script call for routes[0..n-1], sent to node,
 * into their outcomes. A call refused with NOSCRIPT, -MOVED or -ASK did not
 * run: its messages go to r->retries with their new route.
 */
static void
settle_call(sink *s, uint16_t node, const struct sink_message *messages, const struct route *routes,
            size_t n, const redisReply *reply, struct sink_outcome *outcomes, size_t *retry_count)
{
    struct sink_redis *r = s->impl;
    char reason[SINK_REASON_MAX - 64];
    struct route next = routes[0];

    if (reply->type == REDIS_REPLY_ARRAY && reply->elements == n) {
        for (size_t i = 0; i < n; i++)
            sink_redis_settle_message(s, &messages[routes[i].index], reply->element[i],
                                      &outcomes[routes[i].index]);
        return;
    }
    if (reply->type == REDIS_REPLY_ERROR) {
        bool resend = false;

        if (routes[0].call == CALL_EVALSHA && sink_redis_reply_error_is(reply, "NOSCRIPT")) {
            /* the script cache was flushed (SCRIPT FLUSH, restart behind a proxy, failover) */
            next.call = CALL_EVAL;
            resend = true;
        } else if (r->topology == TOPOLOGY_CLUSTER &&
                   (sink_redis_reply_error_is(reply, "MOVED ") ||
                    sink_redis_reply_error_is(reply, "ASK "))) {
            unsigned slot;
            uint16_t target = sink_redis_redirect_target(r, node, reply->str, &slot);

            if (target != NO_NODE) {
                next.node = target;
                next.asking = reply->str[0] == 'A';
                if (!next.asking) {
                    r->slot_nodes[slot] = target;
                    r->map_stale = true;
                }
                resend = true;
            }
        } else if (sink_redis_reply_error_is(reply, "READONLY")) {
            r->demoted = true;
        }
        if (resend) {
            for (size_t i = 0; i < n; i++) {
                r->retries[*retry_count] = routes[i];
                r->retries[*retry_count].node = next.node;
                r->retries[*retry_count].asking = next.asking;
                r->retries[(*retry_count)++].call = next.call;
            }
            return;
        }
        /* the call as a whole was refused (BUSY, LOADING, TRYAGAIN, READONLY) */
        sink_redis_copy_redis_error(reason, sizeof(reason), reply->str, reply->len);
    } else {
        snprintf(reason, sizeof(reason), "an unexpected reply");
    }
    for (size_t i = 0; i < n; i++)
        sink_outcome_set(&outcomes[routes[i].index], SINK_DEFERRED,
                         "redis refused the append to '%s%.100s': %s", sink_redis_prefix_of(s),
                         sink_redis_stream_suffix(&messages[routes[i].index]), reason);
}

/*
 * With --redis-wait N: waits for N replicas of node to acknowledge the
 * writes of the calls just answered; when fewer did, the accepted messages
 * among routes[0..n-1] are deferred. -1 when the connection broke.
 */
static int
wait_replicas(sink *s, uint16_t node, const struct route *routes, size_t n,
              struct sink_outcome *outcomes, struct outbox_error *err)
{
    struct sink_redis *r = s->impl;
    int wanted = ((const struct sink_redis *)s->impl)->wait_replicas;
    char reason[SINK_REASON_MAX - 64];
    redisReply *reply;
    bool any = false;

    for (size_t i = 0; i < n && !any; i++)
        any = outcomes[routes[i].index].status == SINK_ACCEPTED;
    if (wanted <= 0 || !any)
        return 0;
    reply = redisCommand(r->nodes[node].context, "WAIT %d %d", wanted, SINK_REDIS_WAIT_TIMEOUT_MS);
    if (reply == NULL) {
        int saved_errno = errno;

        snprintf(reason, sizeof(reason), "no reply from redis to WAIT");
        for (size_t i = 0; i < n; i++)
            if (outcomes[routes[i].index].status == SINK_ACCEPTED)
                sink_outcome_set(&outcomes[routes[i].index], SINK_DEFERRED, "%s", reason);
        return sink_redis_fail_node(s, &r->nodes[node], saved_errno, "a WAIT", err);
    }
    if (reply->type == REDIS_REPLY_INTEGER && reply->integer >= wanted) {
        freeReplyObject(reply);
        return 0;
    }
    if (reply->type == REDIS_REPLY_INTEGER &&
        (r->nodes[node].replicas = sink_redis_replica_count(r->nodes[node].context)) >= 0 &&
        r->nodes[node].replicas < wanted)
        snprintf(reason, sizeof(reason),
                 "redis primary %.80s has %d replica%s, fewer than --redis-wait %d: rows"
                 " wait for one",
                 r->nodes[node].name, r->nodes[node].replicas,
                 r->nodes[node].replicas == 1 ? "" : "s", wanted);
    else if (reply->type == REDIS_REPLY_INTEGER)
        snprintf(reason, sizeof(reason),
                 "only %lld of %d redis replicas acknowledged the append within %d ms",
                 reply->integer, wanted, SINK_REDIS_WAIT_TIMEOUT_MS);
    else if (reply->type == REDIS_REPLY_ERROR)
        sink_redis_copy_redis_error(reason, sizeof(reason), reply->str, reply->len);
    else
        snprintf(reason, sizeof(reason), "an unexpected reply to WAIT");
    freeReplyObject(reply);
    for (size_t i = 0; i < n; i++)
        if (outcomes[routes[i].index].status == SINK_ACCEPTED)
            sink_outcome_set(&outcomes[routes[i].index], SINK_DEFERRED, "%s", reason);
    return 0;
}

/*
 * One pipelined pass over routes[0..n-1], all for one node with the same
 * call and ASKING flag, at most PIPELINE_WINDOW messages in flight, then
 * WAIT when asked for. On a broken connection every message of the pass
 * without a reply is deferred, the node's context dropped and -1 returned.
 */
static int
pipeline_pass(sink *s, uint16_t node, const struct sink_message *messages,
              const struct route *routes, size_t n, struct sink_outcome *outcomes,
              size_t *retry_count, struct outbox_error *err)
{
    struct sink_redis *r = s->impl;
    size_t sent = 0, received = 0;
    bool asking = routes[0].asking;

    while (received < n) {
        redisContext *context = r->nodes[node].context;
        redisReply *reply = NULL;
        size_t length;

        while (sent < n && sent - received < PIPELINE_WINDOW) {
            length = sink_redis_call_length(routes, sent, n);
            if (sink_redis_append_call(s, context, messages, routes + sent, length) != 0) {
                for (size_t i = received; i < n; i++)
                    sink_outcome_set(&outcomes[routes[i].index], SINK_DEFERRED,
                                     "out of memory while publishing to redis");
                outbox_error_set(err, OUTBOX_ERR_INTERNAL,
                                 "out of memory while publishing to redis");
                sink_redis_node_drop(&r->nodes[node]);
                return -1;
            }
            sent += length;
        }
        if (asking && redisGetReply(context, (void **)&reply) == REDIS_OK && reply != NULL) {
            freeReplyObject(reply); /* +OK to ASKING; the call's own reply says the rest */
            reply = NULL;
        }
        if (redisGetReply(context, (void **)&reply) != REDIS_OK || reply == NULL) {
            int saved_errno = errno;

            for (size_t i = received; i < n; i++)
                sink_outcome_set(&outcomes[routes[i].index], SINK_DEFERRED,
                                 "no reply from redis: %s",
                                 context->errstr[0] != '\0' ? context->errstr : "connection lost");
            return sink_redis_fail_node(s, &r->nodes[node], saved_errno, "while publishing", err);
        }
        length = sink_redis_call_length(routes, received, n);
        settle_call(s, node, messages, routes + received, length, reply, outcomes, retry_count);
        freeReplyObject(reply);
        received += length;
    }
    return wait_replicas(s, node, routes, n, outcomes, err);
}

/* Orders routes by node, ASKING, call, slot, then batch order (which keeps each stream's order). */
static int
compare_routes(const void *a, const void *b)
{
    const struct route *x = a, *y = b;

    if (x->node != y->node)
        return x->node < y->node ? -1 : 1;
    if (x->asking != y->asking)
        return x->asking ? 1 : -1;
    if (x->call != y->call)
        return x->call < y->call ? -1 : 1;
    if (x->slot != y->slot)
        return x->slot < y->slot ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* Makes routes and retries hold count entries; -1 when out of memory. */
static int
reserve_routes(struct sink_redis *r, size_t count)
{
    struct route *routes, *retries;

    if (count <= r->route_capacity)
        return 0;
    routes = realloc(r->routes, count * sizeof(*routes));
    if (routes == NULL)
        return -1;
    r->routes = routes;
    retries = realloc(r->retries, count * sizeof(*retries));
    if (retries == NULL)
        return -1;
    r->retries = retries;
    r->route_capacity = count;
    return 0;
}

/*
 * Sends the routed messages, node by node, in rounds: a round's NOSCRIPT,
 * -MOVED and -ASK answers are sent again in the next one. Returns -1 when a
 * connection broke (err says which).
 */
static int
send_rounds(sink *s, const struct sink_message *messages, size_t n, struct sink_outcome *outcomes,
            struct outbox_error *err)
{
    struct sink_redis *r = s->impl;
    int rc = 0;

    for (int round = 0; round < MAX_ROUNDS && n > 0; round++) {
        size_t retry_count = 0;
        struct route *swap;

        qsort(r->routes, n, sizeof(*r->routes), compare_routes);
        for (size_t from = 0, to; from < n; from = to) {
            uint16_t node = r->routes[from].node;
            struct outbox_error node_err;

            for (to = from + 1; to < n && r->routes[to].node == node &&
                                r->routes[to].asking == r->routes[from].asking &&
                                r->routes[to].call == r->routes[from].call;
                 to++)
                ;
            if (r->nodes[node].context == NULL &&
                sink_redis_node_connect(s, &r->nodes[node], &node_err) != 0) {
                for (size_t i = from; i < to; i++)
                    sink_outcome_set(&outcomes[r->routes[i].index], SINK_DEFERRED, "%s",
                                     node_err.message);
            } else if (pipeline_pass(s, node, messages, r->routes + from, to - from, outcomes,
                                     &retry_count, &node_err) == 0) {
                continue;
            }
            if (rc == 0)
                *err = node_err;
            rc = -1;
        }
        swap = r->routes;
        r->routes = r->retries;
        r->retries = swap;
        n = retry_count;
    }
    for (size_t i = 0; i < n; i++)
        sink_outcome_set(&outcomes[r->routes[i].index], SINK_DEFERRED,
                         "redis redirected the append more than %d times", MAX_ROUNDS - 1);
    return rc;
}

int
sink_redis_publish(sink *s, const struct sink_message *messages, size_t count,
                   struct sink_outcome *outcomes, struct outbox_error *err)
{
    struct sink_redis *r = s->impl;
    size_t limit = (size_t)s->options.max_message_bytes, longest = 0, sendable_count = 0, routed;
    size_t *sendable;
    int rc;

    if (count == 0)
        return 0;
    sendable = malloc(count * sizeof(*sendable));
    for (size_t i = 0; i < count; i++)
        if (sink_redis_stream_length(s, &messages[i]) > longest)
            longest = sink_redis_stream_length(s, &messages[i]);
    if (sendable == NULL || reserve_routes(r, count) != 0 ||
        sink_redis_reserve(&r->name, &r->name_capacity, longest + 1) != 0) {
        free(sendable);
        for (size_t i = 0; i < count; i++)
            sink_outcome_set(&outcomes[i], SINK_DEFERRED,
                             "out of memory while publishing to redis");
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    }
    for (size_t i = 0; i < count; i++) {
        if (messages[i].payload_len > limit) {
            /* never sent: it would be refused the same way on every attempt */
            sink_outcome_set(&outcomes[i], SINK_REJECTED,
                             "message of %zu bytes exceeds the limit of %zu bytes",
                             messages[i].payload_len, limit);
            continue;
        }
        sink_redis_write_stream_name(s, &messages[i], r->name);
        if (strstr(r->name, DEDUP_INFIX) != NULL || strstr(r->name, ORDER_INFIX) != NULL) {
            /* such a stream could take the name of a record and pass a job off as appended */
            sink_outcome_set(&outcomes[i], SINK_REJECTED,
                             "stream '%.100s' is reserved: names holding '" DEDUP_INFIX
                             "' or '" ORDER_INFIX "' are the relay's records",
                             r->name);
            continue;
        }
        sink_outcome_set(&outcomes[i], SINK_DEFERRED, "no reply from redis");
        sendable[sendable_count++] = i;
    }
    if (r->topology == TOPOLOGY_CLUSTER && r->map_stale)
        sink_redis_refresh_slot_map(s);
    routed = sink_redis_route_messages(s, messages, sendable, sendable_count, outcomes);
    free(sendable);
    rc = send_rounds(s, messages, routed, outcomes, err);
    if (rc == 0 && r->demoted) {
        outbox_error_set(err, OUTBOX_ERR_CONNECTION,
                         "redis at %s answered READONLY: it is no longer the primary",
                         sink_redis_node_label(s, &r->nodes[0]));
        rc = -1;
    }
    if (rc != 0) {
        sink_redis_drop_connection(s);
        return -1;
    }
    r->last_used_ms = clock_monotonic_ms();
    return 0;
}
