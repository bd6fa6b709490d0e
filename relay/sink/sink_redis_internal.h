/*
 * sink_redis_internal.h - what the files of the Redis sink share: its
 * state, a node, a message's route, and the functions one file offers
 * the others.
 *
 * The Redis sink is split by job: sink_redis.c (nodes, connecting,
 * idle, --check, the registry row), sink_redis_sentinel.c (finding the
 * primary), sink_redis_cluster.c (the slot map, redirections, routing),
 * sink_redis_script.c (the dedup-and-append script and its calls) and
 * sink_redis_publish.c (pipelining a batch, WAIT, outcomes). Only these
 * files include this header; the rest of the relay sees sink.h alone.
 */
#ifndef OUTBOX_SINK_REDIS_INTERNAL_H
#define OUTBOX_SINK_REDIS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "sink_internal.h"
#include "sink_redis.h"
#include "sink_redis_replicas.h"

#define DEFAULT_DEDUP_WINDOW_MS (24LL * 60 * 60 * 1000)
#define PIPELINE_WINDOW 4096
#define IDLE_PING_MS 1000 /* ping when idle this long */
#define DEDUP_INFIX ":outbox-dedup:"
/* How long WAIT waits for the replicas before the calls it follows are deferred. */
#define WAIT_TIMEOUT_MS 1000
/* Redirections (MOVED, ASK) and NOSCRIPT resends followed within one batch. */
#define MAX_ROUNDS 5
/* No node index yet for a slot. */
#define NO_NODE UINT16_MAX


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
    char sha[41];                 /* SHA1 of sink_redis_append_script, from SCRIPT LOAD */
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


/* The dedup-and-append script (sink_redis_script.c), loaded on connect. */
extern const char sink_redis_append_script[];

/* ---- sink_redis.c: nodes and connections */

/* --stream-prefix, "" for none. */
const char *sink_redis_prefix_of(const sink *s);

/*
 * Copies a Redis error text for a message: the first line, without the
 * " script: <sha>, on @user_script:N." tail that Redis 7 adds to errors
 * raised inside a script, and without a trailing period.
 */
void sink_redis_copy_redis_error(char *out, size_t size, const char *text, size_t len);

/* True when a reply is an error starting with the word prefix. */
bool sink_redis_reply_error_is(const redisReply *reply, const char *prefix);

/* What messages call a node: the display URL for one server, else "host:port". */
const char *sink_redis_node_label(const sink *s, const struct sink_redis_node *node);

void sink_redis_node_set_address(struct sink_redis_node *node, const char *host, size_t host_len,
                                 int port);

/* Frees one node's context. */
void sink_redis_node_drop(struct sink_redis_node *node);

/* Frees every context and marks the sink disconnected. */
void sink_redis_drop_connection(sink *s);

/*
 * Fills err after an I/O failure on a node's context (saved_errno is errno
 * right after the failing call): a read or write timeout is
 * OUTBOX_ERR_TIMEOUT, anything else OUTBOX_ERR_CONNECTION. Drops the
 * node's context; returns -1.
 */
int sink_redis_fail_node(sink *s, struct sink_redis_node *node, int saved_errno, const char *doing,
                         struct outbox_error *err);

/*
 * The index of the node at host:port, added when new; NO_NODE when out of
 * memory or when the sink knows too many nodes already.
 */
uint16_t sink_redis_find_node(struct sink_redis *r, const char *host, size_t host_len, int port);

/*
 * Runs one setup command on a node and checks its reply is not an error.
 * what names the step for the message ("refused the credentials"). The
 * reply is returned in *out when out is not NULL, else freed. On failure
 * the node's context is dropped.
 */
int sink_redis_setup_command(sink *s, struct sink_redis_node *node, int argc, const char **argv,
                             const char *what, redisReply **out, struct outbox_error *err);

/*
 * Opens a TCP connection to a node with the sink's timeouts; authenticates
 * with the URL's credentials when it has some and authenticate is set.
 */
int sink_redis_node_open(sink *s, struct sink_redis_node *node, bool authenticate,
                         struct outbox_error *err);

/*
 * Makes a node ready for script calls: connects, authenticates, selects the
 * db, checks it is a master when the sentinels named it, loads the script.
 */
int sink_redis_node_connect(sink *s, struct sink_redis_node *node, struct outbox_error *err);

/* ---- sink_redis_sentinel.c */

/*
 * Asks the sentinels in turn for the primary and connects to it. The error
 * is OUTBOX_ERR_CONFIG only when no attempt failed in a way worth retrying
 * (every sentinel refused the credentials or does not know the master).
 */
int sink_redis_connect_sentinel(sink *s, struct outbox_error *err);

/* ---- sink_redis_cluster.c */

/* Whether node i receives appends: the one server, the primary, or a master owning a slot. */
bool sink_redis_node_is_primary(const struct sink_redis *r, uint16_t node);

/*
 * Asks the seed nodes in turn for the slot map, then connects to every
 * master. Configuration errors as connect_sentinel.
 */
int sink_redis_connect_cluster(sink *s, struct outbox_error *err);

/*
 * Reads a -MOVED or -ASK redirection ("MOVED 3999 127.0.0.1:6381") into the
 * index of the node it names; an empty host is the node that answered.
 * NO_NODE when the text is not one, or out of memory.
 */
uint16_t sink_redis_redirect_target(struct sink_redis *r, uint16_t from, const char *text,
                                    unsigned *slot);

/* Cluster: reads the slot map again from any connected node after a MOVED. */
void sink_redis_refresh_slot_map(sink *s);

/*
 * Routes the messages of the batch to send: their slot and node. A message
 * whose slot has no known owner is deferred at once; in a cluster, one whose
 * stream name holds a '}' but no hash tag (a routing key can) is rejected,
 * since no dedup record could share its slot. Returns how many were routed.
 */
size_t sink_redis_route_messages(sink *s, const struct sink_message *messages,
                                 const size_t *sendable, size_t count,
                                 struct sink_outcome *outcomes);

/* ---- sink_redis_script.c */

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

/* ---- sink_redis_publish.c */

int sink_redis_publish(sink *s, const struct sink_message *messages, size_t count,
                       struct sink_outcome *outcomes, struct outbox_error *err);

#endif
