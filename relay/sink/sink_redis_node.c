/*
 * sink_redis_node.c - the servers the Redis sink talks to: their addresses,
 * opening a connection with the sink's timeouts and credentials, setup
 * commands, dropping a broken node, and the error texts every file shares.
 *
 * Rules: a node that breaks is dropped here and the caller decides what
 * follows; this file calls only the URL rules, never the script, sentinel,
 * cluster or publish files, so they can all stand on it.
 */
#include "sink_redis_node.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "clock.h"
#include "error.h"

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
sink_redis_node_open(sink *s, struct sink_redis_node *node, enum sink_redis_auth auth,
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
    if (auth == REDIS_AUTHENTICATE && s->url.password != NULL) {
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
