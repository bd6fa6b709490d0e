/*
 * sink_redis_sentinel.c - finding the primary of a redis+sentinel:// URL.
 *
 * The sentinels are asked in turn (SENTINEL get-master-addr-by-name,
 * authenticated with the URL's credentials when a sentinel requires them)
 * for the current primary, which must answer ROLE as a master. A -READONLY
 * reply (the primary was demoted) or a lost connection defers the calls
 * concerned and leaves the sink disconnected, so the next connect asks the
 * sentinels again: a demoted primary never keeps receiving appends.
 */
#include "sink_redis_sentinel.h"
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
    const char *argv[3] = {"SENTINEL", "get-master-addr-by-name", sink_redis_url_master(&s->url)};
    int rc = -1;

    *unknown = false;
    sink_redis_node_set_address(&sentinel, endpoint->host, strlen(endpoint->host), endpoint->port);
    if (sink_redis_node_open(s, &sentinel, REDIS_AUTHENTICATE, err) != 0) {
        /* a sentinel without a password refuses AUTH: carry on without it */
        if (err->code != OUTBOX_ERR_CONFIG || strstr(err->message, "without any password") == NULL)
            return -1;
        if (sink_redis_node_open(s, &sentinel, REDIS_NO_AUTH, err) != 0)
            return -1;
    }
    if (sink_redis_setup_command(s, &sentinel, 3, argv, "refused SENTINEL get-master-addr-by-name",
                                 &reply,
                      err) != 0)
        return -1;
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 2 &&
        reply->element[0]->type == REDIS_REPLY_STRING &&
        reply->element[1]->type == REDIS_REPLY_STRING) {
        int port = atoi(reply->element[1]->str);

        if (port > 0 && port <= 65535) {
            sink_redis_node_set_address(primary, reply->element[0]->str, reply->element[0]->len,
                                        port);
            rc = 0;
        } else {
            outbox_error_set(err, OUTBOX_ERR_BROKER, "sentinel at %s named a bad primary port",
                             sentinel.name);
        }
    } else {
        *unknown = true;
        outbox_error_set(err, OUTBOX_ERR_CONFIG, "sentinel at %s does not know master '%.100s'",
                         sentinel.name, sink_redis_url_master(&s->url));
    }
    freeReplyObject(reply);
    sink_redis_node_drop(&sentinel);
    return rc;
}

int
sink_redis_connect_sentinel(sink *s, struct outbox_error *err)
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
        sink_redis_node_drop(&r->nodes[0]);
        r->nodes[0] = primary;
        if (sink_redis_node_connect(s, &r->nodes[0], err) == 0)
            return 0;
        transient = transient || outbox_error_is_transient(err);
    }
    if (transient)
        err->code = OUTBOX_ERR_CONNECTION;
    return -1;
}
