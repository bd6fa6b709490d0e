/*
 * sink_redis.c - the Redis Streams sink: one server, a Sentinel-watched
 * primary, or a Redis Cluster; its ops table (connecting, idling, --check)
 * and its registry row. The top of the sink: its nodes are in
 * sink_redis_node.c, the URL path rules in sink_redis_url.c, and no file of
 * the sink calls back here.
 *
 * Every message becomes one stream entry, appended at most once per job
 * within the dedup window (sink_redis_script.c); a batch is pipelined per
 * node (sink_redis_publish.c). The topology is picked once from the URL
 * scheme:
 * - redis://: one server.
 * - redis+sentinel://: the primary the sentinels name
 *   (sink_redis_sentinel.c).
 * - redis+cluster://: the masters of a Redis Cluster, each stream's calls
 *   going to the owner of its slot (sink_redis_cluster.c).
 * Every node connects with the URL's credentials and database (not in a
 * cluster) and loads the script. A node that breaks is dropped with every
 * other: the sink is then disconnected and the next sink_connect() starts
 * over (asking the sentinels, or reading the slot map, again).
 */
#include "sink_redis.h"
#include "sink_redis_cluster.h"
#include "sink_redis_node.h"
#include "sink_redis_publish.h"
#include "sink_redis_replicas.h"
#include "sink_redis_script.h"
#include "sink_redis_sentinel.h"

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

static int
sink_redis_init(sink *s, const void *options, struct outbox_error *err)
{
    const struct sink_redis_config *config = options;
    struct sink_redis *r = calloc(1, sizeof(*r));
    const char *prefix = config->stream_prefix != NULL ? config->stream_prefix : "";
    size_t tag_start, tag_len;

    if (r == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    s->impl = r;
    r->stream_prefix = strdup(prefix);
    if (r->stream_prefix == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    if (config->stream_maxlen < 0)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "stream max length must not be negative");
    if (config->wait_replicas < SINK_REDIS_WAIT_BY_TOPOLOGY)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "replicas to wait for must not be negative");
    r->wait_replicas = config->wait_replicas;
    /* a primary that Sentinel or Cluster can fail over loses what no replica has */
    if (r->wait_replicas == SINK_REDIS_WAIT_BY_TOPOLOGY)
        r->wait_replicas = s->url.scheme->variant == TOPOLOGY_SINGLE ? 0 : 1;
    r->window = config->dedup_window_ms > 0 ? (long long)config->dedup_window_ms
                                            : SINK_REDIS_DEDUP_WINDOW_DEFAULT_MS;
    snprintf(r->window_ms, sizeof(r->window_ms), "%lld", r->window);
    snprintf(r->maxlen, sizeof(r->maxlen), "%" PRId64, config->stream_maxlen);
    switch ((enum topology)s->url.scheme->variant) {
    case TOPOLOGY_SENTINEL:
        r->topology = TOPOLOGY_SENTINEL;
        /* nodes[0]: the primary, once a sentinel named it */
        if (sink_redis_find_node(r, "", 0, 0) != 0)
            return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        break;
    case TOPOLOGY_CLUSTER:
        r->topology = TOPOLOGY_CLUSTER;
        /* a stream name with a '}' but no hash tag has no dedup name in its slot */
        if (strchr(prefix, '}') != NULL &&
            !keyslot_tag(prefix, strlen(prefix), &tag_start, &tag_len))
            return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                    "a stream prefix with '}' must hold a hash tag such as"
                                    " '{app}:' in a redis cluster");
        r->slot_nodes = malloc(KEYSLOT_COUNT * sizeof(*r->slot_nodes));
        if (r->slot_nodes == NULL)
            return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        for (size_t i = 0; i < KEYSLOT_COUNT; i++)
            r->slot_nodes[i] = NO_NODE;
        break;
    case TOPOLOGY_SINGLE:
        r->topology = TOPOLOGY_SINGLE;
        if (sink_redis_find_node(r, s->url.host, strlen(s->url.host), s->url.port) != 0)
            return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        break;
    }
    return 0;
}

/* Connects to the one server of a redis:// URL. */
static int
connect_single(sink *s, struct outbox_error *err)
{
    struct sink_redis *r = s->impl;

    return sink_redis_node_connect(s, &r->nodes[0], err);
}

/*
 * Reads how many replicas each primary in use has, into its node and
 * replicas_text: the start-up line and --check show them.
 */
static void
read_replicas(sink *s)
{
    struct sink_redis *r = s->impl;

    r->replicas_text[0] = '\0';
    for (size_t i = 0; i < r->node_count; i++) {
        struct sink_redis_node *node = &r->nodes[i];

        if (node->context == NULL || !sink_redis_node_is_primary(r, (uint16_t)i))
            continue;
        node->replicas = sink_redis_replica_count(node->context);
        sink_redis_replicas_describe(r->replicas_text, sizeof(r->replicas_text), node->name,
                                     node->replicas);
    }
}

static int
sink_redis_connect(sink *s, struct outbox_error *err)
{
    struct sink_redis *r = s->impl;
    int rc;

    sink_redis_drop_connection(s);
    r->demoted = false;
    switch (r->topology) {
    case TOPOLOGY_SENTINEL:
        rc = sink_redis_connect_sentinel(s, err);
        break;
    case TOPOLOGY_CLUSTER:
        rc = sink_redis_connect_cluster(s, err);
        break;
    default:
        rc = connect_single(s, err);
        break;
    }
    if (rc != 0) {
        sink_redis_drop_connection(s);
        return -1;
    }
    r->last_used_ms = clock_monotonic_ms();
    s->connected = true;
    read_replicas(s);
    return 0;
}

static int
sink_redis_idle(sink *s, struct outbox_error *err)
{
    struct sink_redis *r = s->impl;

    if (clock_monotonic_ms() - r->last_used_ms < SINK_REDIS_IDLE_PING_MS)
        return 0;
    for (size_t i = 0; i < r->node_count; i++) {
        struct sink_redis_node *node = &r->nodes[i];
        redisReply *reply;

        if (node->context == NULL)
            continue;
        reply = redisCommand(node->context, "PING");
        if (reply == NULL) {
            int saved_errno = errno;

            sink_redis_fail_node(s, node, saved_errno, "a ping", err);
            sink_redis_drop_connection(s);
            return -1;
        }
        if (reply->type == REDIS_REPLY_ERROR) {
            char reason[160];

            sink_redis_copy_redis_error(reason, sizeof(reason), reply->str, reply->len);
            freeReplyObject(reply);
            outbox_error_set(err, OUTBOX_ERR_BROKER, "redis at %s failed a ping: %s",
                             sink_redis_node_label(s, node), reason);
            sink_redis_drop_connection(s);
            return -1;
        }
        freeReplyObject(reply);
    }
    r->last_used_ms = clock_monotonic_ms();
    return 0;
}

static void
sink_redis_disconnect(sink *s)
{
    sink_redis_drop_connection(s);
}

static void
sink_redis_destroy(sink *s)
{
    struct sink_redis *r = s->impl;

    if (r == NULL)
        return;
    for (size_t i = 0; i < r->node_count; i++)
        sink_redis_node_drop(&r->nodes[i]);
    free(r->nodes);
    free(r->slot_nodes);
    free(r->keys);
    free(r->name);
    free(r->routes);
    free(r->retries);
    free(r->stream_prefix);
    free(r);
    s->impl = NULL;
}

/*
 * --check: every primary whose INFO answers has at least --redis-wait
 * replicas, else no append would ever be marked.
 */
static int
sink_redis_check(sink *s, struct outbox_error *err)
{
    struct sink_redis *r = s->impl;
    int wanted = ((const struct sink_redis *)s->impl)->wait_replicas;

    read_replicas(s);
    for (size_t i = 0; i < r->node_count && wanted > 0; i++) {
        const struct sink_redis_node *node = &r->nodes[i];

        /* unknown (an ACL user without INFO): WAIT still decides, row by row */
        if (node->context == NULL || !sink_redis_node_is_primary(r, (uint16_t)i) ||
            node->replicas == SINK_REDIS_REPLICAS_UNKNOWN || node->replicas >= wanted)
            continue;
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "redis primary %s has %d replica%s, fewer than --redis-wait %d:"
                                " no row would be marked (add a replica, or pass --redis-wait 0,"
                                " which risks losing acknowledged appends in a failover)",
                                node->name, node->replicas, node->replicas == 1 ? "" : "s",
                                wanted);
    }
    return 0;
}

/* Each primary and its replicas, as read at the last connect, and --redis-wait. */
static void
sink_redis_replication(const sink *s, struct sink_replication *replication)
{
    const struct sink_redis *r = s->impl;

    replication->replicas = r->replicas_text;
    replication->wait = r->wait_replicas;
    replication->wait_option = "--redis-wait";
    replication->wait_field = "redis_wait";
}

/* What a sink opened without parsed options uses: the rows' fallbacks. */
static void
sink_redis_config_defaults(void *options)
{
    struct sink_redis_config *config = options;

    config->dedup_window_ms = SINK_REDIS_DEDUP_WINDOW_DEFAULT_MS;
    config->wait_replicas = SINK_REDIS_WAIT_BY_TOPOLOGY;
}

static const struct sink_ops sink_redis_ops = {
    .init = sink_redis_init,
    .connect = sink_redis_connect,
    .publish = sink_redis_publish,
    .idle = sink_redis_idle,
    .check = sink_redis_check,
    .replication = sink_redis_replication,
    .disconnect = sink_redis_disconnect,
    .destroy = sink_redis_destroy,
};

/* ---- registry row --------------------------------------------------------- */

static const struct url_scheme sink_redis_scheme = {
    .name = "redis",
    .usage = "redis://[:pass@]host:port[/db]",
    .default_port = 6379,
    .max_endpoints = 1,
    .parse_path = sink_redis_parse_path,
    .path_free = sink_redis_path_free,
    .one_endpoint_hint = "use redis+sentinel:// or redis+cluster:// for several",
    .variant = TOPOLOGY_SINGLE,
};

static const struct url_scheme sink_redis_sentinel_scheme = {
    .name = "redis+sentinel",
    .usage = "redis+sentinel://[user:pass@]s1:p1,s2:p2/MASTER[/db]",
    .default_port = 26379,
    .max_endpoints = URL_MAX_ENDPOINTS,
    .parse_path = sink_redis_parse_path,
    .path_free = sink_redis_path_free,
    .variant = TOPOLOGY_SENTINEL,
};

static const struct url_scheme sink_redis_cluster_scheme = {
    .name = "redis+cluster",
    .usage = "redis+cluster://[user:pass@]h1:p1,...",
    .default_port = 6379,
    .max_endpoints = URL_MAX_ENDPOINTS,
    .parse_path = sink_redis_parse_path,
    .path_free = sink_redis_path_free,
    .variant = TOPOLOGY_CLUSTER,
};

static const struct url_scheme *const sink_redis_schemes[] = {
    &sink_redis_scheme, &sink_redis_sentinel_scheme, &sink_redis_cluster_scheme, NULL};

#define CONFIG_FIELD(f) OPTION_FIELD(struct sink_redis_config, f)

static const struct option_spec sink_redis_options[] = {
    {"stream-prefix", "P", OPTION_STRING, CONFIG_FIELD(stream_prefix), "", 0,
     0, NULL, "Redis stream key = P + the row's routing key, else its queue",
     OPTION_FROM_ENVIRONMENT, 0},
    {"dedup-window", "DURATION", OPTION_MILLIS, CONFIG_FIELD(dedup_window_ms),
     "24h", 1, 31536000000.0, NULL,
     "Redis: a job is appended at most once per stream within this window", OPTION_FROM_ENVIRONMENT,
     0},
    {"stream-maxlen", "N", OPTION_INT64, CONFIG_FIELD(stream_maxlen), "0", 0,
     1e15, NULL, "Redis: trim each stream to about N entries (MAXLEN ~); 0 never trims",
     OPTION_FROM_ENVIRONMENT, 0},
    {"redis-wait", "N", OPTION_INT, CONFIG_FIELD(wait_replicas), "-1",
     SINK_REDIS_WAIT_BY_TOPOLOGY, 100, NULL,
     "Redis: mark a row only once N replicas acknowledged its append (WAIT N "
     TIMEOUT_TEXT(SINK_REDIS_WAIT_TIMEOUT_MS) "); -1: 1 with"
     " Sentinel or Cluster (0 there risks losing rows in a failover), 0 with redis://",
     OPTION_FROM_ENVIRONMENT, 0},
};

const struct sink_type sink_redis_type = {
    .kind = "redis",
    .product = "Redis Streams",
    .schemes = sink_redis_schemes,
    .cloudevents_prefix = "ce_", /* no binding: named as the Kafka binding's headers */
    .options = sink_redis_options,
    .option_count = sizeof(sink_redis_options) / sizeof(sink_redis_options[0]),
    .config_size = sizeof(struct sink_redis_config),
    .config_defaults = sink_redis_config_defaults,
    .ops = &sink_redis_ops,
};
