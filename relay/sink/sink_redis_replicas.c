/*
 * sink_redis_replicas.c - the replica count of a Redis primary, from INFO
 * replication.
 */
#include "sink_redis_replicas.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int
sink_redis_replica_count(redisContext *context)
{
    static const char field[] = "\nconnected_slaves:";
    redisReply *reply = redisCommand(context, "INFO replication");
    int count = SINK_REDIS_REPLICAS_UNKNOWN;
    const char *at;

    if (reply == NULL)
        return SINK_REDIS_REPLICAS_UNKNOWN;
    /* the field starts a line; "role:master" comes first, so search from a newline */
    if (reply->type == REDIS_REPLY_STRING &&
        (at = strstr(reply->str, field)) != NULL) {
        const char *digits = at + strlen(field);
        char *end;
        long value = strtol(digits, &end, 10);

        if (end != digits && value >= 0 && value < 100000)
            count = (int)value;
    }
    freeReplyObject(reply);
    return count;
}

void
sink_redis_replicas_describe(char *text, size_t size, const char *node_name, int replicas)
{
    size_t used = strlen(text);

    if (used + 1 >= size)
        return;
    if (replicas == SINK_REDIS_REPLICAS_UNKNOWN)
        snprintf(text + used, size - used, "%s%s has an unknown number of replicas",
                 used > 0 ? "; " : "", node_name);
    else
        snprintf(text + used, size - used, "%s%s has %d replica%s", used > 0 ? "; " : "",
                 node_name, replicas, replicas == 1 ? "" : "s");
}
