/*
 * sink_redis.c - the Redis Streams sink: one server, a Sentinel-watched
 * primary, or a Redis Cluster; its nodes, connecting, idling, --check and
 * its registry row.
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
#include "sink_redis_internal.h"

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

const char *
sink_redis_prefix_of(const sink *s)
{
    return ((const struct sink_redis *)s->impl)->stream_prefix;
}

void
sink_redis_copy_redis_error(char *out, size_t size, const char *text, size_t len)
{
    const char *tail = strstr(text, " script: ");
    size_t n = strcspn(text, "\r\n");

    if (n > len)
        n = len;
    if (tail != NULL && (size_t)(tail - text) < n)
        n = (size_t)(tail - text);
    while (n > 0 && (text[n - 1] == '.' || text[n - 1] == ' '))
        n--;
    if (n >= size)
        n = size - 1;
    memcpy(out, text, n);
    out[n] = '\0';
}

bool
sink_redis_reply_error_is(const redisReply *reply, const char *prefix)
{
    size_t len = strlen(prefix);

    return reply->type == REDIS_REPLY_ERROR && reply->len >= len &&
           strncmp(reply->str, prefix, len) == 0;
}

const char *
sink_redis_node_label(const sink *s, const struct sink_redis_node *node)
{
    const struct sink_redis *r = s->impl;

    return r->topology == TOPOLOGY_SINGLE ? sink_display_url(s) : node->name;
}

void
sink_redis_node_set_address(struct sink_redis_node *node, const char *host, size_t host_len,
                            int port)
{
    if (host_len >= sizeof(node->host))
        host_len = sizeof(node->host) - 1;
    memcpy(node->host, host, host_len);
    node->host[host_len] = '\0';
    node->port = port;
    if (memchr(node->host, ':', host_len) != NULL)
        snprintf(node->name, sizeof(node->name), "[%s]:%d", node->host, port);
    else
        snprintf(node->name, sizeof(node->name), "%s:%d", node->host, port);
}

void
sink_redis_node_drop(struct sink_redis_node *node)
{
    if (node->context != NULL)
        redisFree(node->context);
    node->context = NULL;
}

void
sink_redis_drop_connection(sink *s)
{
    struct sink_redis *r = s->impl;

    for (size_t i = 0; i < r->node_count; i++)
        sink_redis_node_drop(&r->nodes[i]);
    s->connected = false;
}

int
sink_redis_fail_node(sink *s, struct sink_redis_node *node, int saved_errno, const char *doing,
                     struct outbox_error *err)
{
    bool timed_out = node->context->err == REDIS_ERR_IO &&
                     (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK ||
                      saved_errno == ETIMEDOUT || saved_errno == EINPROGRESS);
    char reason[128];

    sink_redis_copy_redis_error(reason, sizeof(reason), node->context->errstr,
                                strlen(node->context->errstr));
    if (timed_out)
        outbox_error_set(err, OUTBOX_ERR_TIMEOUT, "redis at %s did not answer %s within %d ms",
                         sink_redis_node_label(s, node), doing, s->options.io_timeout_ms);
    else
        outbox_error_set(err, OUTBOX_ERR_CONNECTION, "lost the redis connection to %s %s: %s",
                         sink_redis_node_label(s, node), doing, reason);
    sink_redis_node_drop(node);
    return -1;
}

uint16_t
sink_redis_find_node(struct sink_redis *r, const char *host, size_t host_len, int port)
{
    struct sink_redis_node probe;

    sink_redis_node_set_address(&probe, host, host_len, port);
    for (size_t i = 0; i < r->node_count; i++)
        if (r->nodes[i].port == port && strcmp(r->nodes[i].host, probe.host) == 0)
            return (uint16_t)i;
    if (r->node_count + 1 >= NO_NODE)
        return NO_NODE;
    if (r->node_count == r->node_capacity) {
        size_t capacity = r->node_capacity == 0 ? 8 : 2 * r->node_capacity;
        struct sink_redis_node *bigger = realloc(r->nodes, capacity * sizeof(*bigger));

        if (bigger == NULL)
            return NO_NODE;
        r->nodes = bigger;
        r->node_capacity = capacity;
    }
    probe.context = NULL;
    probe.replicas = SINK_REDIS_REPLICAS_UNKNOWN;
    r->nodes[r->node_count] = probe;
    return (uint16_t)r->node_count++;
}

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
                                            : DEFAULT_DEDUP_WINDOW_MS;
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

/*
 * True when an error reply during connect is worth retrying later (the
 * server is starting, busy, or a replica lost its primary); everything else
 * (credentials, db out of range, missing permissions) is configuration.
 */
static bool
connect_error_is_transient(const char *text)
{
    static const char *const transient[] = {"LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN",
                                            "CLUSTERDOWN"};

    for (size_t i = 0; i < sizeof(transient) / sizeof(transient[0]); i++)
        if (strncmp(text, transient[i], strlen(transient[i])) == 0)
            return true;
    return false;
}

int
sink_redis_setup_command(sink *s, struct sink_redis_node *node, int argc, const char **argv,
                         const char *what, redisReply **out, struct outbox_error *err)
{
    redisReply *reply = redisCommandArgv(node->context, argc, argv, NULL);
    char reason[160];

    if (reply == NULL) {
        int saved_errno = errno;

        return sink_redis_fail_node(s, node, saved_errno, "during connect", err);
    }
    if (reply->type == REDIS_REPLY_ERROR) {
        enum outbox_error_code code =
            connect_error_is_transient(reply->str) ? OUTBOX_ERR_CONNECTION : OUTBOX_ERR_CONFIG;

        sink_redis_copy_redis_error(reason, sizeof(reason), reply->str, reply->len);
        if (strncmp(reply->str, "NOAUTH", 6) == 0)
            outbox_error_set(err, code, "redis at %s requires a password: %s",
                             sink_redis_node_label(s, node), reason);
        else
            outbox_error_set(err, code, "redis at %s %s: %s", sink_redis_node_label(s, node), what,
                             reason);
        freeReplyObject(reply);
        sink_redis_node_drop(node);
        return -1;
    }
    if (out != NULL)
        *out = reply;
    else
        freeReplyObject(reply);
    return 0;
}

int
sink_redis_node_open(sink *s, struct sink_redis_node *node, bool authenticate,
                     struct outbox_error *err)
{
    sink_redis_node_drop(node);
    node->context = redisConnectWithTimeout(node->host, node->port,
                                            timeval_from_ms(s->options.connect_timeout_ms));
    if (node->context == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    if (node->context->err != 0) {
        char reason[128];

        sink_redis_copy_redis_error(reason, sizeof(reason), node->context->errstr,
                                    strlen(node->context->errstr));
        outbox_error_set(err, OUTBOX_ERR_CONNECTION, "unable to connect to redis at %s: %s",
                         sink_redis_node_label(s, node), reason);
        sink_redis_node_drop(node);
        return -1;
    }
    if (redisSetTimeout(node->context, timeval_from_ms(s->options.io_timeout_ms)) != REDIS_OK ||
        redisEnableKeepAlive(node->context) != REDIS_OK) {
        outbox_error_set(err, OUTBOX_ERR_CONNECTION,
                         "unable to set socket options on the redis connection to %s",
                         sink_redis_node_label(s, node));
        sink_redis_node_drop(node);
        return -1;
    }
    if (authenticate && s->url.password != NULL) {
        const char *argv[3] = {"AUTH", NULL, NULL};
        int argc = 1;

        if (s->url.user != NULL)
            argv[argc++] = s->url.user;
        argv[argc++] = s->url.password;
        if (sink_redis_setup_command(s, node, argc, argv, "refused the credentials", NULL,
                                     err) != 0)
            return -1;
    }
    return 0;
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

    if (clock_monotonic_ms() - r->last_used_ms < IDLE_PING_MS)
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

static int
sink_redis_replicas_to_wait(const sink *s)
{
    return ((const struct sink_redis *)s->impl)->wait_replicas;
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

/* Each primary and its replicas, as read at the last connect. */
static const char *
sink_redis_replicas(const sink *s)
{
    const struct sink_redis *r = s->impl;

    return r->replicas_text;
}

/* What a sink opened without parsed options uses: the rows' fallbacks. */
static void
sink_redis_config_defaults(void *options)
{
    struct sink_redis_config *config = options;

    config->dedup_window_ms = DEFAULT_DEDUP_WINDOW_MS;
    config->wait_replicas = SINK_REDIS_WAIT_BY_TOPOLOGY;
}


static const struct sink_ops sink_redis_ops = {
    .init = sink_redis_init,
    .connect = sink_redis_connect,
    .publish = sink_redis_publish,
    .idle = sink_redis_idle,
    .check = sink_redis_check,
    .replicas = sink_redis_replicas,
    .replicas_to_wait = sink_redis_replicas_to_wait,
    .disconnect = sink_redis_disconnect,
    .destroy = sink_redis_destroy,
};

/* ---- registry row --------------------------------------------------------- */

/* What a Redis URL's path names. */
struct sink_redis_url_path {
    char *master_name; /* redis+sentinel://: required */
    int db;            /* 0 when none is named; always 0 in a cluster */
};

static void
sink_redis_path_free(void *parsed)
{
    struct sink_redis_url_path *path = parsed;

    if (path != NULL)
        free(path->master_name);
    free(path);
}

/* "/N" into path->db; -1 with an error naming example when N is no database number. */
static int
parse_db(const struct url_scheme *scheme, const char *text, const char *example,
         struct sink_redis_url_path *path, struct outbox_error *err)
{
    long db = url_decimal(text, strlen(text), 0, 1000000);

    if (db < 0)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "%s URL database must be a number, as in %s://host:%d/%s",
                                scheme->name, scheme->name, scheme->default_port, example);
    path->db = (int)db;
    return 0;
}

/* A Sentinel path "/MASTERNAME[/db]". */
static int
parse_master_db(const struct url_scheme *scheme, const char *text,
                struct sink_redis_url_path *path, struct outbox_error *err)
{
    const char *name = text + (*text == '/'), *slash = strchr(name, '/');
    size_t name_len = slash != NULL ? (size_t)(slash - name) : strlen(name);

    if (name_len == 0)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "%s URL needs the master name, as in %s://host:%d/mymaster",
                                scheme->name, scheme->name, scheme->default_port);
    path->master_name = url_percent_decode(name, name_len);
    if (path->master_name == NULL)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "%s URL has a bad escape in the master name", scheme->name);
    if (slash != NULL && slash[1] != '\0')
        return parse_db(scheme, slash + 1, "mymaster/0", path, err);
    return 0;
}

/* redis://: "[/db]"; redis+sentinel://: "/MASTERNAME[/db]"; redis+cluster://: nothing. */
static int
sink_redis_parse_path(const struct url_scheme *scheme, const char *text, void **parsed,
                      struct outbox_error *err)
{
    struct sink_redis_url_path *path = calloc(1, sizeof(*path));

    if (path == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    *parsed = path;
    switch ((enum topology)scheme->variant) {
    case TOPOLOGY_SINGLE:
        return *text == '/' && text[1] != '\0' ? parse_db(scheme, text + 1, "0", path, err) : 0;
    case TOPOLOGY_SENTINEL:
        return parse_master_db(scheme, text, path, err);
    case TOPOLOGY_CLUSTER:
        if (*text == '/' && text[1] != '\0')
            return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                    "%s URL takes no database: only database 0 is served",
                                    scheme->name);
        return 0;
    }
    return 0;
}

int
sink_redis_url_db(const struct broker_url *url)
{
    if (url->scheme == NULL || url->scheme->parse_path != sink_redis_parse_path || url->path == NULL)
        return 0;
    return ((const struct sink_redis_url_path *)url->path)->db;
}

const char *
sink_redis_url_master(const struct broker_url *url)
{
    if (url->scheme == NULL || url->scheme->parse_path != sink_redis_parse_path || url->path == NULL)
        return NULL;
    return ((const struct sink_redis_url_path *)url->path)->master_name;
}

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
     "Redis: mark a row only once N replicas acknowledged its append (WAIT N 1000); -1: 1 with"
     " Sentinel or Cluster (0 there risks losing rows in a failover), 0 with redis://",
     OPTION_FROM_ENVIRONMENT, 0},
};

const struct sink_type sink_redis_type = {
    .kind = "redis",
    .schemes = sink_redis_schemes,
    .options = sink_redis_options,
    .option_count = sizeof(sink_redis_options) / sizeof(sink_redis_options[0]),
    .config_size = sizeof(struct sink_redis_config),
    .config_defaults = sink_redis_config_defaults,
    .ops = &sink_redis_ops,
};
