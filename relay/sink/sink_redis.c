/*
 * sink_redis.c - the Redis Streams sink: one server, a Sentinel-watched
 * primary, or a Redis Cluster.
 *
 * Every message becomes one stream entry, exactly
 *
 *   XADD <stream_prefix><suffix> [MAXLEN ~ N] * job_id <id> queue <queue>
 *        payload <json> headers <json> attempt <n>
 *
 * where the suffix is the row's routing key, else its queue (stream_suffix()),
 * and is appended at most once per job per stream within the dedup window.
 * The check and the append are one atomic step in Redis: APPEND_SCRIPT below
 * is loaded with SCRIPT LOAD on connect and called with EVALSHA (EVAL with
 * the script text when the server answers NOSCRIPT, e.g. after SCRIPT FLUSH
 * or a failover; EVAL also caches it again), one call for up to
 * SCRIPT_CHUNK messages, which costs Redis about a third less than a call
 * per message. A job whose dedup record exists is answered with the entry id
 * recorded earlier and counts as accepted, so a relay that died after the
 * append and before marking its row never appends the row a second time
 * when the row is claimed again.
 *
 * Dedup key layout: "{<stream>}:outbox-dedup:<job_id>" - the stream's name
 * as the hash tag, so that the record lives in its stream's hash slot - or,
 * when the stream's name holds a hash tag of its own ("{app}.orders"),
 * "<stream>:outbox-dedup:<job_id>", which shares that tag; for a row an
 * operator replayed n times (outboxctl replay) ":<n>" follows the job id, so
 * each replay appends the job once more, and at most once. A plain string
 * whose value is the entry id ("1764474000000-0"), written with PX = the
 * window (24 h when the option is 0), so Redis expires it by itself and there
 * is nothing to trim, and each record is independent of every other (no
 * shared set to scan or trim inside the script). Memory, measured on Redis
 * 7.0 (jemalloc): MEMORY USAGE of one record of stream "orders" is 104 bytes,
 * and with the main and expires dictionaries 100 000 records raise
 * used_memory by 16.5 MB: about 165 bytes per job, so the cost is rate x
 * window x 165 B (1 000 jobs/s over the default 24 h window: ~14 GB). The
 * window needs only to outlast the time a row can stay appended but not
 * marked (lease plus retries), so busy deployments should shorten it. The
 * stream entries cost what their payloads cost, bounded by MAXLEN ~ when set.
 *
 * Topologies, picked once from the URL scheme:
 * - redis://: one server.
 * - redis+sentinel://: the sentinels are asked in turn (SENTINEL
 *   get-master-addr-by-name, authenticated with the URL's credentials when a
 *   sentinel requires them) for the current primary, which must answer ROLE
 *   as a master. A -READONLY reply (the primary was demoted) or a lost
 *   connection defers the calls concerned and leaves the sink disconnected, so
 *   the next connect asks the sentinels again: a demoted primary never keeps
 *   receiving appends.
 * - redis+cluster://: the seed nodes are asked in turn for CLUSTER SLOTS;
 *   messages are grouped by slot, every call holds keys of one slot and goes
 *   to the master owning it. -MOVED updates that slot and the whole map is
 *   read again before the next batch; -ASK resends the call once to the
 *   named node after ASKING. Calls for a slot in migration may be answered
 *   -TRYAGAIN: they are deferred and their rows published again later.
 *
 * With --redis-wait N every node's script calls of a batch are followed by
 * WAIT N WAIT_TIMEOUT_MS; when fewer than N replicas acknowledged, every
 * message of those calls is deferred (nothing is marked, no attempt is
 * spent; the rows are published again and answered from their dedup
 * records, which then have had time to replicate).
 *
 * A batch is pipelined per node: script calls are appended with
 * redisAppendCommandArgv and their replies read in order, with at most
 * PIPELINE_WINDOW messages in flight so the output buffer stays bounded for
 * huge batches. An error in the reply for one message (WRONGTYPE, or OOM over
 * maxmemory) fails only that message. An error for a whole call (BUSY,
 * LOADING, TRYAGAIN), a broken connection, a timeout, too few replicas for
 * --redis-wait or a cluster slot nobody serves is no message's fault: it
 * defers the messages it touched (SINK_DEFERRED, given back without
 * spending an attempt). A broken connection or a timeout defers every
 * message still without a reply, frees every connection and leaves the sink
 * disconnected; the messages of such a batch
 * that Redis did append are answered from their dedup records when published
 * again. Writing to a closed socket raises SIGPIPE: the process must ignore
 * it, as the relay does.
 */
#include "sink_internal.h"
#include "sink_redis.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "clock.h"
#include "error.h"
#include "keyslot.h"
#include "sink_redis_replicas.h"

#define DEFAULT_DEDUP_WINDOW_MS (24LL * 60 * 60 * 1000)
#define PIPELINE_WINDOW 4096
#define IDLE_PING_MS 1000 /* ping when idle this long */
#define DEDUP_INFIX ":outbox-dedup:"
/* How long WAIT waits for the replicas before the calls it follows fail. */
#define WAIT_TIMEOUT_MS 1000
/* Redirections (MOVED, ASK) and NOSCRIPT resends followed within one batch. */
#define MAX_ROUNDS 5
/* No node index yet for a slot. */
#define NO_NODE UINT16_MAX

/*
 * One call appends up to SCRIPT_CHUNK messages. ARGV[1] is the window in ms,
 * ARGV[2] the maxlen ("0" for none). For message i, KEYS[2i-1] is its
 * stream, KEYS[2i] its dedup record; ARGV[5i-2 .. 5i+2] its job_id, queue,
 * payload, headers and attempt. The reply has one element per message: {entry id, 1}
 * after an append, {earlier entry id, 0} for a duplicate, or the error XADD
 * raised (WRONGTYPE, say), which fails only that message. Nothing is written
 * before XADD succeeds, so a refused append leaves no dedup record behind.
 */
static const char APPEND_SCRIPT[] =
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


/* Messages per script call: long enough to spread its cost, short enough not to stall Redis. */
#define SCRIPT_CHUNK 100
/* Arguments of one call: command, script, numkeys, 2 shared, 2 keys and 5 values a message. */
#define SCRIPT_ARGS (3 + 2 + 7 * SCRIPT_CHUNK)

/* How a call is sent. */
enum script_call {
    CALL_EVALSHA, /* by the SHA1 loaded on connect */
    CALL_EVAL,    /* with the script text, after NOSCRIPT */
};

/* What the URL scheme asks for. */
enum topology {
    TOPOLOGY_SINGLE,   /* redis://: one server */
    TOPOLOGY_SENTINEL, /* redis+sentinel://: the primary the sentinels name */
    TOPOLOGY_CLUSTER,  /* redis+cluster://: the masters of a Redis Cluster */
};

/* One server the sink talks to. */
struct sink_redis_node {
    char host[256];
    int port;
    char name[300];        /* "host:port", for messages */
    redisContext *context; /* NULL while disconnected */
    int replicas;          /* connected replicas at the last connect or short WAIT */
};

/* One message on its way, in a publish round. */
struct route {
    size_t index;  /* into the batch */
    unsigned slot; /* its stream's hash slot (cluster) */
    uint16_t node; /* index in nodes */
    bool asking;   /* send ASKING first (after -ASK) */
    enum script_call call;
};

struct sink_redis {
    enum topology topology;
    struct sink_redis_node *nodes; /* single, sentinel: nodes[0]; cluster: every master seen */
    size_t node_count;
    size_t node_capacity;
    uint16_t *slot_nodes;         /* cluster: the node owning each slot, NO_NODE when unknown */
    bool map_stale;               /* cluster: a MOVED was followed, read the map again */
    bool demoted;                 /* a call was answered -READONLY: ask the sentinels again */
    char sha[41];                 /* SHA1 of APPEND_SCRIPT, from SCRIPT LOAD */
    char window_ms[24];           /* ARGV[1] */
    char maxlen[24];              /* ARGV[2] */
    long long window;             /* the dedup window in ms */
    char *keys; /* scratch: stream, dedup keys, job id, attempt per message of a call */
    size_t keys_capacity;
    char *name; /* scratch: one stream name */
    size_t name_capacity;
    struct route *routes; /* this batch's messages on their way */
    struct route *retries;
    size_t route_capacity;
    const char *argv[SCRIPT_ARGS];
    size_t argvlen[SCRIPT_ARGS];
    long long last_used_ms; /* monotonic time of the last reply */
    char replicas_text[512]; /* each primary and its replicas, read at connect */
    char *stream_prefix;     /* --stream-prefix, "" for none */
    int wait_replicas;       /* --redis-wait, its default resolved by the topology */
};

/* ---- helpers ------------------------------------------------------------------ */

/* --stream-prefix, "" for none. */
static const char *
prefix_of(const sink *s)
{
    return ((const struct sink_redis *)s->impl)->stream_prefix;
}

static struct timeval
timeval_from_ms(int ms)
{
    struct timeval tv;

    tv.tv_sec = ms / 1000;
    tv.tv_usec = (ms % 1000) * 1000;
    return tv;
}

/*
 * Copies a Redis error text for a message: the first line, without the
 * " script: <sha>, on @user_script:N." tail that Redis 7 adds to errors
 * raised inside a script, and without a trailing period.
 */
static void
copy_redis_error(char *out, size_t size, const char *text, size_t len)
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

/* True when a reply is an error starting with the word prefix. */
static bool
reply_error_is(const redisReply *reply, const char *prefix)
{
    size_t len = strlen(prefix);

    return reply->type == REDIS_REPLY_ERROR && reply->len >= len &&
           strncmp(reply->str, prefix, len) == 0;
}

/* What messages call a node: the display URL for one server, else "host:port". */
static const char *
node_label(const sink *s, const struct sink_redis_node *node)
{
    const struct sink_redis *r = s->impl;

    return r->topology == TOPOLOGY_SINGLE ? sink_display_url(s) : node->name;
}

static void
node_set_address(struct sink_redis_node *node, const char *host, size_t host_len, int port)
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

/* Frees one node's context. */
static void
node_drop(struct sink_redis_node *node)
{
    if (node->context != NULL)
        redisFree(node->context);
    node->context = NULL;
}

/* Frees every context and marks the sink disconnected. */
static void
drop_connection(sink *s)
{
    struct sink_redis *r = s->impl;

    for (size_t i = 0; i < r->node_count; i++)
        node_drop(&r->nodes[i]);
    s->connected = false;
}

/*
 * Fills err after an I/O failure on a node's context (saved_errno is errno
 * right after the failing call): a read or write timeout is
 * OUTBOX_ERR_TIMEOUT, anything else OUTBOX_ERR_CONNECTION. Drops the
 * node's context; returns -1.
 */
static int
fail_node(sink *s, struct sink_redis_node *node, int saved_errno, const char *doing,
          struct outbox_error *err)
{
    bool timed_out = node->context->err == REDIS_ERR_IO &&
                     (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK ||
                      saved_errno == ETIMEDOUT || saved_errno == EINPROGRESS);
    char reason[128];

    copy_redis_error(reason, sizeof(reason), node->context->errstr, strlen(node->context->errstr));
    if (timed_out)
        outbox_error_set(err, OUTBOX_ERR_TIMEOUT, "redis at %s did not answer %s within %d ms",
                         node_label(s, node), doing, s->options.io_timeout_ms);
    else
        outbox_error_set(err, OUTBOX_ERR_CONNECTION, "lost the redis connection to %s %s: %s",
                         node_label(s, node), doing, reason);
    node_drop(node);
    return -1;
}

/*
 * The index of the node at host:port, added when new; NO_NODE when out of
 * memory or when the sink knows too many nodes already.
 */
static uint16_t
find_node(struct sink_redis *r, const char *host, size_t host_len, int port)
{
    struct sink_redis_node probe;

    node_set_address(&probe, host, host_len, port);
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

/* ---- connecting ----------------------------------------------------------------- */

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
        if (find_node(r, "", 0, 0) != 0)
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
        if (find_node(r, s->url.host, strlen(s->url.host), s->url.port) != 0)
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

/*
 * Runs one setup command on a node and checks its reply is not an error.
 * what names the step for the message ("refused the credentials"). The
 * reply is returned in *out when out is not NULL, else freed. On failure
 * the node's context is dropped.
 */
static int
setup_command(sink *s, struct sink_redis_node *node, int argc, const char **argv, const char *what,
              redisReply **out, struct outbox_error *err)
{
    redisReply *reply = redisCommandArgv(node->context, argc, argv, NULL);
    char reason[160];

    if (reply == NULL) {
        int saved_errno = errno;

        return fail_node(s, node, saved_errno, "during connect", err);
    }
    if (reply->type == REDIS_REPLY_ERROR) {
        enum outbox_error_code code =
            connect_error_is_transient(reply->str) ? OUTBOX_ERR_CONNECTION : OUTBOX_ERR_CONFIG;

        copy_redis_error(reason, sizeof(reason), reply->str, reply->len);
        if (strncmp(reply->str, "NOAUTH", 6) == 0)
            outbox_error_set(err, code, "redis at %s requires a password: %s", node_label(s, node),
                             reason);
        else
            outbox_error_set(err, code, "redis at %s %s: %s", node_label(s, node), what, reason);
        freeReplyObject(reply);
        node_drop(node);
        return -1;
    }
    if (out != NULL)
        *out = reply;
    else
        freeReplyObject(reply);
    return 0;
}

/*
 * Opens a TCP connection to a node with the sink's timeouts; authenticates
 * with the URL's credentials when it has some and authenticate is set.
 */
static int
node_open(sink *s, struct sink_redis_node *node, bool authenticate, struct outbox_error *err)
{
    node_drop(node);
    node->context = redisConnectWithTimeout(node->host, node->port,
                                            timeval_from_ms(s->options.connect_timeout_ms));
    if (node->context == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    if (node->context->err != 0) {
        char reason[128];

        copy_redis_error(reason, sizeof(reason), node->context->errstr,
                         strlen(node->context->errstr));
        outbox_error_set(err, OUTBOX_ERR_CONNECTION, "unable to connect to redis at %s: %s",
                         node_label(s, node), reason);
        node_drop(node);
        return -1;
    }
    if (redisSetTimeout(node->context, timeval_from_ms(s->options.io_timeout_ms)) != REDIS_OK ||
        redisEnableKeepAlive(node->context) != REDIS_OK) {
        outbox_error_set(err, OUTBOX_ERR_CONNECTION,
                         "unable to set socket options on the redis connection to %s",
                         node_label(s, node));
        node_drop(node);
        return -1;
    }
    if (authenticate && s->url.password != NULL) {
        const char *argv[3] = {"AUTH", NULL, NULL};
        int argc = 1;

        if (s->url.user != NULL)
            argv[argc++] = s->url.user;
        argv[argc++] = s->url.password;
        if (setup_command(s, node, argc, argv, "refused the credentials", NULL, err) != 0)
            return -1;
    }
    return 0;
}

/*
 * Makes a node ready for script calls: connects, authenticates, selects the
 * db, checks it is a master when the sentinels named it, loads the script.
 */
static int
node_connect(sink *s, struct sink_redis_node *node, struct outbox_error *err)
{
    struct sink_redis *r = s->impl;
    redisReply *reply = NULL;
    char db[16];

    if (node_open(s, node, true, err) != 0)
        return -1;
    if (s->url.db != 0 && r->topology != TOPOLOGY_CLUSTER) {
        const char *argv[2] = {"SELECT", db};

        snprintf(db, sizeof(db), "%d", s->url.db);
        if (setup_command(s, node, 2, argv, "refused to select the database", NULL, err) != 0)
            return -1;
    }
    if (r->topology == TOPOLOGY_SENTINEL) {
        const char *argv[1] = {"ROLE"};
        bool master;

        if (setup_command(s, node, 1, argv, "refused ROLE", &reply, err) != 0)
            return -1;
        master = reply->type == REDIS_REPLY_ARRAY && reply->elements > 0 &&
                 reply->element[0]->type == REDIS_REPLY_STRING &&
                 strcmp(reply->element[0]->str, "master") == 0;
        freeReplyObject(reply);
        if (!master) {
            node_drop(node);
            return outbox_error_set(err, OUTBOX_ERR_CONNECTION,
                                    "redis at %s, named primary by a sentinel, is not a master",
                                    node->name);
        }
    }
    {
        const char *argv[3] = {"SCRIPT", "LOAD", APPEND_SCRIPT};

        if (setup_command(s, node, 3, argv, "refused to load the append script", &reply, err) != 0)
            return -1;
    }
    if (reply->type != REDIS_REPLY_STRING || reply->len != 40) {
        freeReplyObject(reply);
        node_drop(node);
        return outbox_error_set(err, OUTBOX_ERR_BROKER,
                                "redis at %s answered SCRIPT LOAD with something other than a sha1",
                                node_label(s, node));
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

    return node_connect(s, &r->nodes[0], err);
}

/*
 * Asks one sentinel (endpoint) for the primary's address into *primary.
 * Returns 0; -1 with err. *unknown is set when the sentinel answered but
 * does not know the master name.
 */
static int
ask_sentinel(sink *s, const struct url_endpoint *endpoint, struct sink_redis_node *primary,
             bool *unknown, struct outbox_error *err)
{
    struct sink_redis_node sentinel = {0};
    redisReply *reply = NULL;
    const char *argv[3] = {"SENTINEL", "get-master-addr-by-name", s->url.master_name};
    int rc = -1;

    *unknown = false;
    node_set_address(&sentinel, endpoint->host, strlen(endpoint->host), endpoint->port);
    if (node_open(s, &sentinel, true, err) != 0) {
        /* a sentinel without a password refuses AUTH: carry on without it */
        if (err->code != OUTBOX_ERR_CONFIG || strstr(err->message, "without any password") == NULL)
            return -1;
        if (node_open(s, &sentinel, false, err) != 0)
            return -1;
    }
    if (setup_command(s, &sentinel, 3, argv, "refused SENTINEL get-master-addr-by-name", &reply,
                      err) != 0)
        return -1;
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 2 &&
        reply->element[0]->type == REDIS_REPLY_STRING &&
        reply->element[1]->type == REDIS_REPLY_STRING) {
        int port = atoi(reply->element[1]->str);

        if (port > 0 && port <= 65535) {
            node_set_address(primary, reply->element[0]->str, reply->element[0]->len, port);
            rc = 0;
        } else {
            outbox_error_set(err, OUTBOX_ERR_BROKER, "sentinel at %s named a bad primary port",
                             sentinel.name);
        }
    } else {
        *unknown = true;
        outbox_error_set(err, OUTBOX_ERR_CONFIG, "sentinel at %s does not know master '%.100s'",
                         sentinel.name, s->url.master_name);
    }
    freeReplyObject(reply);
    node_drop(&sentinel);
    return rc;
}

/*
 * Asks the sentinels in turn for the primary and connects to it. The error
 * is OUTBOX_ERR_CONFIG only when no attempt failed in a way worth retrying
 * (every sentinel refused the credentials or does not know the master).
 */
static int
connect_sentinel(sink *s, struct outbox_error *err)
{
    struct sink_redis *r = s->impl;
    bool transient = false;

    outbox_error_set(err, OUTBOX_ERR_CONNECTION, "no sentinel listed");
    for (size_t i = 0; i < s->url.endpoint_count; i++) {
        struct sink_redis_node primary = {0};
        bool unknown;

        if (ask_sentinel(s, &s->url.endpoints[i], &primary, &unknown, err) != 0) {
            transient = transient || outbox_error_is_transient(err);
            continue;
        }
        node_drop(&r->nodes[0]);
        r->nodes[0] = primary;
        if (node_connect(s, &r->nodes[0], err) == 0)
            return 0;
        transient = transient || outbox_error_is_transient(err);
    }
    if (transient)
        err->code = OUTBOX_ERR_CONNECTION;
    return -1;
}

/* Reads CLUSTER SLOTS from nodes[from] (connected) into the slot map. */
static int
read_slot_map(sink *s, uint16_t from, struct outbox_error *err)
{
    struct sink_redis *r = s->impl;
    const char *argv[2] = {"CLUSTER", "SLOTS"};
    redisReply *reply = NULL;
    char from_host[sizeof(r->nodes[0].host)];
    size_t ranges = 0;

    if (setup_command(s, &r->nodes[from], 2, argv, "refused CLUSTER SLOTS", &reply, err) != 0)
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
        node = find_node(r, host, host_len, (int)port);
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

/* Whether node i receives appends: the one server, the primary, or a master owning a slot. */
static bool
node_is_primary(const struct sink_redis *r, uint16_t node)
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
            rc = node_connect(s, &r->nodes[i], err);
    free(owns);
    return rc;
}

/*
 * Asks the seed nodes in turn for the slot map, then connects to every
 * master. Configuration errors as connect_sentinel.
 */
static int
connect_cluster(sink *s, struct outbox_error *err)
{
    struct sink_redis *r = s->impl;
    bool transient = false;

    outbox_error_set(err, OUTBOX_ERR_CONNECTION, "no cluster node listed");
    for (size_t i = 0; i < s->url.endpoint_count; i++) {
        const struct url_endpoint *seed = &s->url.endpoints[i];
        uint16_t node = find_node(r, seed->host, strlen(seed->host), seed->port);

        if (node == NO_NODE)
            return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        if (node_open(s, &r->nodes[node], true, err) == 0 && read_slot_map(s, node, err) == 0 &&
            connect_masters(s, err) == 0)
            return 0;
        transient = transient || outbox_error_is_transient(err);
        drop_connection(s);
    }
    if (transient)
        err->code = OUTBOX_ERR_CONNECTION;
    return -1;
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

        if (node->context == NULL || !node_is_primary(r, (uint16_t)i))
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

    drop_connection(s);
    r->demoted = false;
    switch (r->topology) {
    case TOPOLOGY_SENTINEL:
        rc = connect_sentinel(s, err);
        break;
    case TOPOLOGY_CLUSTER:
        rc = connect_cluster(s, err);
        break;
    default:
        rc = connect_single(s, err);
        break;
    }
    if (rc != 0) {
        drop_connection(s);
        return -1;
    }
    r->last_used_ms = clock_monotonic_ms();
    s->connected = true;
    read_replicas(s);
    return 0;
}

/* ---- publishing ----------------------------------------------------------------- */

/* Makes a scratch buffer hold at least size bytes; -1 when out of memory. */
static int
reserve(char **buffer, size_t *capacity, size_t size)
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

/* The stream of a message is stream_prefix + this: its routing key, else its queue. */
static const char *
stream_suffix(const struct sink_message *message)
{
    return message->routing_key != NULL ? message->routing_key : message->queue;
}

/* The length of a message's stream name, "<prefix><suffix>". */
static size_t
stream_length(const sink *s, const struct sink_message *message)
{
    return strlen(prefix_of(s)) + strlen(stream_suffix(message));
}

/* Writes a message's stream name into out (stream_length + 1 bytes); its length. */
static size_t
write_stream_name(const sink *s, const struct sink_message *message, char *out)
{
    const char *suffix = stream_suffix(message);
    size_t prefix_len = strlen(prefix_of(s)), suffix_len = strlen(suffix);

    memcpy(out, prefix_of(s), prefix_len);
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

/* Bytes of scratch one message takes in append_call(). */
static size_t
scratch_size(const sink *s, const struct sink_message *message)
{
    size_t stream_len = stream_length(s, message);

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

/*
 * Appends one script call for the messages of routes[0..n-1] to a node's
 * output buffer (ASKING first when they were redirected with -ASK); -1 when
 * out of memory. The arguments are laid out as APPEND_SCRIPT reads them:
 * first the keys of every message, then the shared values, then five values
 * a message. Keys and numbers are written into the scratch buffer, the rest
 * points into the messages.
 */
static int
append_call(sink *s, redisContext *context, const struct sink_message *messages,
            const struct route *routes, size_t n)
{
    struct sink_redis *r = s->impl;
    size_t need = 0, at = 0;
    int argc = 0;
    char numkeys[24]; /* a size_t in decimal */

    for (size_t i = 0; i < n; i++)
        need += scratch_size(s, &messages[routes[i].index]);
    if (reserve(&r->keys, &r->keys_capacity, need) != 0)
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
        add_text(r, &argc, APPEND_SCRIPT, sizeof(APPEND_SCRIPT) - 1);
    add_text(r, &argc, numkeys, strlen(numkeys));

    for (size_t i = 0; i < n; i++) {
        const struct sink_message *m = &messages[routes[i].index];
        char *stream = r->keys + at;
        size_t stream_len = write_stream_name(s, m, stream), len;

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

/* Messages in the next call from routes[from]: up to SCRIPT_CHUNK of one slot. */
static size_t
call_length(const struct route *routes, size_t from, size_t n)
{
    size_t length = 1;

    while (from + length < n && length < SCRIPT_CHUNK &&
           routes[from + length].slot == routes[from].slot)
        length++;
    return length;
}

/* Turns the reply element for one message into its outcome. */
static void
settle_message(sink *s, const struct sink_message *message, const redisReply *reply,
               struct sink_outcome *outcome)
{
    char reason[SINK_REASON_MAX - 64];

    if (reply->type == REDIS_REPLY_ERROR) {
        copy_redis_error(reason, sizeof(reason), reply->str, reply->len);
        sink_outcome_set(outcome, SINK_FAILED, "redis refused the append to '%s%.100s': %s",
                         prefix_of(s), stream_suffix(message), reason);
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

/*
 * Reads a -MOVED or -ASK redirection ("MOVED 3999 127.0.0.1:6381") into the
 * index of the node it names; an empty host is the node that answered.
 * NO_NODE when the text is not one, or out of memory.
 */
static uint16_t
redirect_target(struct sink_redis *r, uint16_t from, const char *text, unsigned *slot)
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
        return find_node(r, from_host, strlen(from_host), (int)port);
    }
    return find_node(r, address, (size_t)(colon - address), (int)port);
}

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
            settle_message(s, &messages[routes[i].index], reply->element[i],
                           &outcomes[routes[i].index]);
        return;
    }
    if (reply->type == REDIS_REPLY_ERROR) {
        bool resend = false;

        if (routes[0].call == CALL_EVALSHA && reply_error_is(reply, "NOSCRIPT")) {
            /* the script cache was flushed (SCRIPT FLUSH, restart behind a proxy, failover) */
            next.call = CALL_EVAL;
            resend = true;
        } else if (r->topology == TOPOLOGY_CLUSTER &&
                   (reply_error_is(reply, "MOVED ") || reply_error_is(reply, "ASK "))) {
            unsigned slot;
            uint16_t target = redirect_target(r, node, reply->str, &slot);

            if (target != NO_NODE) {
                next.node = target;
                next.asking = reply->str[0] == 'A';
                if (!next.asking) {
                    r->slot_nodes[slot] = target;
                    r->map_stale = true;
                }
                resend = true;
            }
        } else if (reply_error_is(reply, "READONLY")) {
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
        copy_redis_error(reason, sizeof(reason), reply->str, reply->len);
    } else {
        snprintf(reason, sizeof(reason), "an unexpected reply");
    }
    for (size_t i = 0; i < n; i++)
        sink_outcome_set(&outcomes[routes[i].index], SINK_DEFERRED,
                         "redis refused the append to '%s%.100s': %s", prefix_of(s),
                         stream_suffix(&messages[routes[i].index]), reason);
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
    reply = redisCommand(r->nodes[node].context, "WAIT %d %d", wanted, WAIT_TIMEOUT_MS);
    if (reply == NULL) {
        int saved_errno = errno;

        snprintf(reason, sizeof(reason), "no reply from redis to WAIT");
        for (size_t i = 0; i < n; i++)
            if (outcomes[routes[i].index].status == SINK_ACCEPTED)
                sink_outcome_set(&outcomes[routes[i].index], SINK_DEFERRED, "%s", reason);
        return fail_node(s, &r->nodes[node], saved_errno, "a WAIT", err);
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
                 reply->integer, wanted, WAIT_TIMEOUT_MS);
    else if (reply->type == REDIS_REPLY_ERROR)
        copy_redis_error(reason, sizeof(reason), reply->str, reply->len);
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
            length = call_length(routes, sent, n);
            if (append_call(s, context, messages, routes + sent, length) != 0) {
                for (size_t i = received; i < n; i++)
                    sink_outcome_set(&outcomes[routes[i].index], SINK_DEFERRED,
                                     "out of memory while publishing to redis");
                outbox_error_set(err, OUTBOX_ERR_INTERNAL,
                                 "out of memory while publishing to redis");
                node_drop(&r->nodes[node]);
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
            return fail_node(s, &r->nodes[node], saved_errno, "while publishing", err);
        }
        length = call_length(routes, received, n);
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

/* Cluster: reads the slot map again from any connected node after a MOVED. */
static void
refresh_slot_map(sink *s)
{
    struct sink_redis *r = s->impl;
    struct outbox_error ignored;

    for (size_t i = 0; i < r->node_count && r->map_stale; i++)
        if (r->nodes[i].context != NULL)
            (void)read_slot_map(s, (uint16_t)i, &ignored);
}

/*
 * Routes the messages of the batch to send: their slot and node. A message
 * whose slot has no known owner is deferred at once; in a cluster, one whose
 * stream name holds a '}' but no hash tag (a routing key can) is rejected,
 * since no dedup record could share its slot. Returns how many were routed.
 */
static size_t
route_messages(sink *s, const struct sink_message *messages, const size_t *sendable, size_t count,
               struct sink_outcome *outcomes)
{
    struct sink_redis *r = s->impl;
    size_t routed = 0;

    for (size_t i = 0; i < count; i++) {
        const struct sink_message *m = &messages[sendable[i]];
        struct route route = {.index = sendable[i], .call = CALL_EVALSHA};

        if (r->topology == TOPOLOGY_CLUSTER) {
            size_t len = write_stream_name(s, m, r->name), tag_start, tag_len;

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
                node_connect(s, &r->nodes[node], &node_err) != 0) {
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

static int
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
        if (stream_length(s, &messages[i]) > longest)
            longest = stream_length(s, &messages[i]);
    if (sendable == NULL || reserve_routes(r, count) != 0 ||
        reserve(&r->name, &r->name_capacity, longest + 1) != 0) {
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
        sink_outcome_set(&outcomes[i], SINK_DEFERRED, "no reply from redis");
        sendable[sendable_count++] = i;
    }
    if (r->topology == TOPOLOGY_CLUSTER && r->map_stale)
        refresh_slot_map(s);
    routed = route_messages(s, messages, sendable, sendable_count, outcomes);
    free(sendable);
    rc = send_rounds(s, messages, routed, outcomes, err);
    if (rc == 0 && r->demoted) {
        outbox_error_set(err, OUTBOX_ERR_CONNECTION,
                         "redis at %s answered READONLY: it is no longer the primary",
                         node_label(s, &r->nodes[0]));
        rc = -1;
    }
    if (rc != 0) {
        drop_connection(s);
        return -1;
    }
    r->last_used_ms = clock_monotonic_ms();
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

            fail_node(s, node, saved_errno, "a ping", err);
            drop_connection(s);
            return -1;
        }
        if (reply->type == REDIS_REPLY_ERROR) {
            char reason[160];

            copy_redis_error(reason, sizeof(reason), reply->str, reply->len);
            freeReplyObject(reply);
            outbox_error_set(err, OUTBOX_ERR_BROKER, "redis at %s failed a ping: %s",
                             node_label(s, node), reason);
            drop_connection(s);
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
    drop_connection(s);
}

static void
sink_redis_destroy(sink *s)
{
    struct sink_redis *r = s->impl;

    if (r == NULL)
        return;
    for (size_t i = 0; i < r->node_count; i++)
        node_drop(&r->nodes[i]);
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
        if (node->context == NULL || !node_is_primary(r, (uint16_t)i) ||
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

static const struct url_scheme sink_redis_scheme = {
    .name = "redis",
    .usage = "redis://[:pass@]host:port[/db]",
    .default_port = 6379,
    .max_endpoints = 1,
    .path = URL_PATH_DB,
    .one_endpoint_hint = "use redis+sentinel:// or redis+cluster:// for several",
    .variant = TOPOLOGY_SINGLE,
};

static const struct url_scheme sink_redis_sentinel_scheme = {
    .name = "redis+sentinel",
    .usage = "redis+sentinel://[user:pass@]s1:p1,s2:p2/MASTER[/db]",
    .default_port = 26379,
    .max_endpoints = URL_MAX_ENDPOINTS,
    .path = URL_PATH_MASTER_DB,
    .variant = TOPOLOGY_SENTINEL,
};

static const struct url_scheme sink_redis_cluster_scheme = {
    .name = "redis+cluster",
    .usage = "redis+cluster://[user:pass@]h1:p1,...",
    .default_port = 6379,
    .max_endpoints = URL_MAX_ENDPOINTS,
    .path = URL_PATH_NONE,
    .variant = TOPOLOGY_CLUSTER,
};

static const struct url_scheme *const sink_redis_schemes[] = {
    &sink_redis_scheme, &sink_redis_sentinel_scheme, &sink_redis_cluster_scheme, NULL};

static const struct option_spec sink_redis_options[] = {
    {"stream-prefix", "P", OPTION_STRING, OPTION_FIELD(struct sink_redis_config, stream_prefix), "", 0,
     0, NULL, "Redis stream key = P + the row's routing key, else its queue",
     OPTION_FROM_ENVIRONMENT, 0},
    {"dedup-window", "DURATION", OPTION_MILLIS, OPTION_FIELD(struct sink_redis_config, dedup_window_ms),
     "24h", 1, 31536000000.0, NULL,
     "Redis: a job is appended at most once per stream within this window", OPTION_FROM_ENVIRONMENT,
     0},
    {"stream-maxlen", "N", OPTION_INT64, OPTION_FIELD(struct sink_redis_config, stream_maxlen), "0", 0,
     1e15, NULL, "Redis: trim each stream to about N entries (MAXLEN ~); 0 never trims",
     OPTION_FROM_ENVIRONMENT, 0},
    {"redis-wait", "N", OPTION_INT, OPTION_FIELD(struct sink_redis_config, wait_replicas), "-1",
     SINK_REDIS_WAIT_BY_TOPOLOGY, 100, NULL,
     "Redis: mark a row only once N replicas acknowledged its append (WAIT N 1000); -1: 1 with"
     " Sentinel or Cluster (0 there risks losing rows in a failover), 0 with redis://",
     OPTION_FROM_ENVIRONMENT, 0},
};

/* What a sink opened without parsed options uses: the rows' fallbacks. */
static void
sink_redis_config_defaults(void *options)
{
    struct sink_redis_config *config = options;

    config->dedup_window_ms = DEFAULT_DEDUP_WINDOW_MS;
    config->wait_replicas = SINK_REDIS_WAIT_BY_TOPOLOGY;
}

const struct sink_type sink_redis_type = {
    .kind = "redis",
    .schemes = sink_redis_schemes,
    .options = sink_redis_options,
    .option_count = sizeof(sink_redis_options) / sizeof(sink_redis_options[0]),
    .config_size = sizeof(struct sink_redis_config),
    .config_defaults = sink_redis_config_defaults,
    .ops = &sink_redis_ops,
};
