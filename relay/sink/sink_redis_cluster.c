/*
 * sink_redis_cluster.c - a Redis Cluster: the slot map, redirections and
 * the route of each message.
 *
 * The seed nodes of the URL are asked in turn for CLUSTER SLOTS; messages
 * are grouped by slot, every call holds keys of one slot and goes to the
 * master owning it. -MOVED updates that slot and the whole map is read
 * again before the next batch; -ASK resends the call once to the named node
 * after ASKING. Calls for a slot in migration may be answered -TRYAGAIN:
 * they are deferred and their rows published again later. A stream name
 * with a '}' but no hash tag has no dedup record in its slot, so such a
 * message is rejected.
 */
#include "sink_redis_cluster.h"
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

/* Reads CLUSTER SLOTS from nodes[from] (connected) into the slot map. */
static int
read_slot_map(sink *s, uint16_t from, struct outbox_error *err)
{
    struct sink_redis *r = s->impl;
    const char *argv[2] = {"CLUSTER", "SLOTS"};
    redisReply *reply = NULL;
    char from_host[sizeof(r->nodes[0].host)];
    size_t ranges = 0;

    if (sink_redis_setup_command(s, &r->nodes[from], 2, argv, "refused CLUSTER SLOTS", &reply,
                                 err) != 0)
        return -1;
    /* find_node may move r->nodes */
    memcpy(from_host, r->nodes[from].host, sizeof(from_host));
    for (size_t i = 0; reply->type == REDIS_REPLY_ARRAY && i < reply->elements; i++) {
        const redisReply *range = reply->element[i], *master;
        long long first, last, port;
        const char *host;
        size_t host_len;
        uint16_t node;

        if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 ||
            range->element[0]->type != REDIS_REPLY_INTEGER ||
            range->element[1]->type != REDIS_REPLY_INTEGER ||
            range->element[2]->type != REDIS_REPLY_ARRAY || range->element[2]->elements < 2 ||
            range->element[2]->element[0]->type != REDIS_REPLY_STRING ||
            range->element[2]->element[1]->type != REDIS_REPLY_INTEGER)
            continue;
        first = range->element[0]->integer;
        last = range->element[1]->integer;
        master = range->element[2];
        port = master->element[1]->integer;
        host = master->element[0]->str;
        host_len = master->element[0]->len;
        /* an unknown endpoint ("" or "?") is the node that answered */
        if (host_len == 0 || (host_len == 1 && host[0] == '?')) {
            host = from_host;
            host_len = strlen(from_host);
        }
        if (first < 0 || last >= KEYSLOT_COUNT || first > last || port <= 0 || port > 65535)
            continue;
        node = sink_redis_find_node(r, host, host_len, (int)port);
        if (node == NO_NODE) {
            freeReplyObject(reply);
            return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        }
        for (long long slot = first; slot <= last; slot++)
            r->slot_nodes[slot] = node;
        ranges++;
    }
    freeReplyObject(reply);
    if (ranges == 0)
        return outbox_error_set(err, OUTBOX_ERR_CONNECTION,
                                "redis cluster node %s serves no slots yet", r->nodes[from].name);
    r->map_stale = false;
    return 0;
}

bool
sink_redis_node_is_primary(const struct sink_redis *r, uint16_t node)
{
    if (r->topology != TOPOLOGY_CLUSTER)
        return node == 0;
    for (size_t slot = 0; slot < KEYSLOT_COUNT; slot++)
        if (r->slot_nodes[slot] == node)
            return true;
    return false;
}

/* Connects every master that owns a slot and has no connection. */
static int
connect_masters(sink *s, struct outbox_error *err)
{
    struct sink_redis *r = s->impl;
    bool *owns = calloc(r->node_count, sizeof(*owns));
    int rc = 0;

    if (owns == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    for (size_t slot = 0; slot < KEYSLOT_COUNT; slot++)
        if (r->slot_nodes[slot] != NO_NODE)
            owns[r->slot_nodes[slot]] = true;
    for (size_t i = 0; i < r->node_count && rc == 0; i++)
        if (owns[i] && r->nodes[i].context == NULL)
            rc = sink_redis_node_connect(s, &r->nodes[i], err);
    free(owns);
    return rc;
}

int
sink_redis_connect_cluster(sink *s, struct outbox_error *err)
{
    struct sink_redis *r = s->impl;
    bool transient = false;

    outbox_error_set(err, OUTBOX_ERR_CONNECTION, "no cluster node listed");
    for (size_t i = 0; i < s->url.endpoint_count; i++) {
        const struct url_endpoint *seed = &s->url.endpoints[i];
        uint16_t node = sink_redis_find_node(r, seed->host, strlen(seed->host), seed->port);

        if (node == NO_NODE)
            return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        if (sink_redis_node_open(s, &r->nodes[node], REDIS_AUTHENTICATE, err) == 0 &&
            read_slot_map(s, node, err) == 0 && connect_masters(s, err) == 0)
            return 0;
        transient = transient || outbox_error_is_transient(err);
        sink_redis_drop_connection(s);
    }
    if (transient)
        err->code = OUTBOX_ERR_CONNECTION;
    return -1;
}

uint16_t
sink_redis_redirect_target(struct sink_redis *r, uint16_t from, const char *text, unsigned *slot)
{
    const char *space = strchr(text, ' '), *address, *colon;
    char from_host[sizeof(r->nodes[0].host)];
    long port;

    if (space == NULL)
        return NO_NODE;
    *slot = (unsigned)strtoul(space + 1, NULL, 10);
    address = strchr(space + 1, ' ');
    if (address == NULL || *slot >= KEYSLOT_COUNT)
        return NO_NODE;
    address++;
    colon = strrchr(address, ':');
    if (colon == NULL)
        return NO_NODE;
    port = strtol(colon + 1, NULL, 10);
    if (port <= 0 || port > 65535)
        return NO_NODE;
    if (colon == address) {
        memcpy(from_host, r->nodes[from].host, sizeof(from_host));
        return sink_redis_find_node(r, from_host, strlen(from_host), (int)port);
    }
    return sink_redis_find_node(r, address, (size_t)(colon - address), (int)port);
}

void
sink_redis_refresh_slot_map(sink *s)
{
    struct sink_redis *r = s->impl;
    struct outbox_error ignored;

    for (size_t i = 0; i < r->node_count && r->map_stale; i++)
        if (r->nodes[i].context != NULL)
            (void)read_slot_map(s, (uint16_t)i, &ignored);
}

size_t
sink_redis_route_messages(sink *s, const struct sink_message *messages, const size_t *sendable,
                          size_t count, struct sink_outcome *outcomes)
{
    struct sink_redis *r = s->impl;
    size_t routed = 0;

    for (size_t i = 0; i < count; i++) {
        const struct sink_message *m = &messages[sendable[i]];
        struct route route = {.index = sendable[i], .call = CALL_EVALSHA};

        if (r->topology == TOPOLOGY_CLUSTER) {
            size_t len = sink_redis_write_stream_name(s, m, r->name), tag_start, tag_len;

            if (memchr(r->name, '}', len) != NULL &&
                !keyslot_tag(r->name, len, &tag_start, &tag_len)) {
                /* a routing key with '}': no dedup record name can share the stream's slot */
                sink_outcome_set(&outcomes[sendable[i]], SINK_REJECTED,
                                 "stream '%.100s' holds a '}' without a hash tag: in a redis"
                                 " cluster its dedup record cannot share its slot",
                                 r->name);
                continue;
            }
            route.slot = keyslot_of(r->name, len);
            route.node = r->slot_nodes[route.slot];
            if (route.node == NO_NODE) {
                sink_outcome_set(&outcomes[sendable[i]], SINK_DEFERRED,
                                 "no redis cluster node serves slot %u", route.slot);
                r->map_stale = true;
                continue;
            }
        }
        r->routes[routed++] = route;
    }
    return routed;
}
