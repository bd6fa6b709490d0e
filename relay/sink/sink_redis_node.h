/*
 * sink_redis_node.h - the Redis sink's shared state and its nodes: one
 * server the sink talks to, opening its connection, running a setup
 * command, dropping it, and the error texts all files of the sink use.
 *
 * The ground floor of the sink: sink_redis_node.c calls only the URL rules
 * (sink_redis_url.c); the script, sentinel, cluster, publish and ops-table
 * files stand on it. Only the files of the Redis sink include this header.
 */
#ifndef OUTBOX_SINK_REDIS_NODE_H
#define OUTBOX_SINK_REDIS_NODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "sink_internal.h"
#include "sink_redis_replicas.h"
#include "sink_redis_url.h"
#include "timeouts.h" /* SINK_REDIS_IDLE_PING_MS and the sink's other times */

#define PIPELINE_WINDOW 4096
#define DEDUP_INFIX ":outbox-dedup:"
#define ORDER_INFIX ":outbox-order:"
/* A place in an order (sink_message.place.at): 39 digits. */
#define STREAM_PLACE_DIGITS 39
/* Messages looked back for the place before one (sink_redis_append_call). */
#define PLACE_LOOKBACK 64
/* Redirections (MOVED, ASK) and NOSCRIPT resends followed within one batch. */
#define MAX_ROUNDS 5
/* No node index yet for a slot. */
#define NO_NODE UINT16_MAX


/* Messages per script call: long enough to spread its cost, short enough not to stall Redis. */
#define SCRIPT_CHUNK 100
/*
 * Arguments of one call: command, script, numkeys, 2 shared; a message's 3
 * keys, 11 values and its extra fields' names and values (CloudEvents').
 */
#define SCRIPT_ARGS (3 + 2 + (14 + 2 * (SINK_EXTRA_HEADERS_MAX + 1)) * SCRIPT_CHUNK)

/* How a call is sent. */
enum script_call {
    CALL_EVALSHA, /* by the SHA1 loaded on connect */
    CALL_EVAL,    /* with the script text, after NOSCRIPT */
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

/* Whether a node is opened with the URL's credentials (a Sentinel may take none). */
enum sink_redis_auth { REDIS_AUTHENTICATE, REDIS_NO_AUTH };

/*
 * Opens a TCP connection to a node with the sink's timeouts; authenticates
 * with the URL's credentials when it has some and auth says so.
 */
int sink_redis_node_open(sink *s, struct sink_redis_node *node, enum sink_redis_auth auth,
                         struct outbox_error *err);

#endif
