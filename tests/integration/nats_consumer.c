/*
 * nats_consumer.c - creating test streams and reading them back (see nats_consumer.h).
 */
#include "nats_consumer.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nats/nats.h>

#define SUBSCRIPTIONS_MAX 4

struct nats_consumer {
    natsConnection *connection;
    jsCtx *js;
    natsSubscription *subscriptions[SUBSCRIPTIONS_MAX];
    size_t subscription_count;
    const char *reply_text[SUBSCRIPTIONS_MAX];
    pthread_mutex_t lock;
    bool lock_made;
    long long received;
};

/* A core subscriber's handler: counts the message, answers it when asked to. */
static void
on_core_message(natsConnection *connection, natsSubscription *subscription, natsMsg *message,
                void *closure)
{
    nats_consumer *c = closure;

    pthread_mutex_lock(&c->lock);
    c->received++;
    pthread_mutex_unlock(&c->lock);
    for (size_t i = 0; i < c->subscription_count; i++)
        if (c->subscriptions[i] == subscription && c->reply_text[i] != NULL &&
            natsMsg_GetReply(message) != NULL)
            natsConnection_PublishString(connection, natsMsg_GetReply(message), c->reply_text[i]);
    natsMsg_Destroy(message);
}

int
nats_consumer_subscribe(nats_consumer *c, const char *subject, const char *reply_text)
{
    size_t i = c->subscription_count;

    if (i == SUBSCRIPTIONS_MAX || (!c->lock_made && pthread_mutex_init(&c->lock, NULL) != 0))
        return -1;
    c->lock_made = true;
    c->reply_text[i] = reply_text;
    c->subscription_count++; /* before the first message can arrive */
    if (natsConnection_Subscribe(&c->subscriptions[i], c->connection, subject, on_core_message,
                                 c) != NATS_OK ||
        natsConnection_Flush(c->connection) != NATS_OK)
        return -1;
    return 0;
}

long long
nats_consumer_received(nats_consumer *c)
{
    long long received;

    if (!c->lock_made)
        return 0;
    pthread_mutex_lock(&c->lock);
    received = c->received;
    pthread_mutex_unlock(&c->lock);
    return received;
}

nats_consumer *
nats_consumer_connect(const char *url)
{
    nats_consumer *c = calloc(1, sizeof(*c));

    if (c == NULL)
        return NULL;
    if (natsConnection_ConnectTo(&c->connection, url) != NATS_OK ||
        natsConnection_JetStream(&c->js, c->connection, NULL) != NATS_OK) {
        nats_consumer_free(c);
        return NULL;
    }
    return c;
}

nats_consumer *
nats_consumer_connect_creds(const char *url, const char *creds)
{
    nats_consumer *c = calloc(1, sizeof(*c));
    natsOptions *options = NULL;
    natsStatus st;

    if (c == NULL)
        return NULL;
    st = natsOptions_Create(&options);
    if (st == NATS_OK)
        st = natsOptions_SetURL(options, url);
    if (st == NATS_OK)
        st = natsOptions_SetUserCredentialsFromFiles(options, creds, NULL);
    if (st == NATS_OK)
        st = natsConnection_Connect(&c->connection, options);
    /* libnats before 3.8 drops a signature whose first byte is zero: 1 login in 256 */
    for (int tries = 1; st == NATS_CONNECTION_AUTH_FAILED && tries < 4; tries++)
        st = natsConnection_Connect(&c->connection, options);
    natsOptions_Destroy(options);
    if (st != NATS_OK || natsConnection_JetStream(&c->js, c->connection, NULL) != NATS_OK) {
        nats_consumer_free(c);
        return NULL;
    }
    return c;
}

void
nats_consumer_free(nats_consumer *c)
{
    if (c == NULL)
        return;
    for (size_t i = 0; i < c->subscription_count; i++) {
        natsSubscription_Unsubscribe(c->subscriptions[i]);
        natsSubscription_Destroy(c->subscriptions[i]);
    }
    jsCtx_Destroy(c->js);
    if (c->connection != NULL) {
        natsConnection_Close(c->connection);
        natsConnection_Destroy(c->connection);
    }
    if (c->lock_made)
        pthread_mutex_destroy(&c->lock);
    free(c);
}

int
nats_consumer_create_stream(nats_consumer *c, const char *name,
                            const struct nats_consumer_stream_options *options)
{
    jsStreamConfig config;
    jsStreamInfo *info = NULL;
    const char *subjects[1] = {options->subject};
    jsErrCode code = 0;
    natsStatus st;

    jsStreamConfig_Init(&config);
    config.Name = name;
    config.Subjects = subjects;
    config.SubjectsLen = 1;
    config.Storage = options->memory ? js_MemoryStorage : js_FileStorage;
    if (options->max_msgs > 0)
        config.MaxMsgs = options->max_msgs;
    if (options->discard_new)
        config.Discard = js_DiscardNew;
    if (options->duplicates_ms > 0)
        config.Duplicates = options->duplicates_ms * 1000000;
    config.Replicas = options->replicas > 0 ? options->replicas : 1;
    st = js_AddStream(&info, c->js, &config, NULL, &code);
    jsStreamInfo_Destroy(info);
    if (st != NATS_OK)
        fprintf(stderr, "nats_consumer: unable to create stream %s: %s (%d)\n", name,
                natsStatus_GetText(st), (int)code);
    return st == NATS_OK ? 0 : -1;
}

void
nats_consumer_delete_stream(nats_consumer *c, const char *name)
{
    jsErrCode code = 0;

    js_DeleteStream(c->js, name, NULL, &code);
}

long long
nats_consumer_stream_count(nats_consumer *c, const char *stream)
{
    jsStreamInfo *info = NULL;
    jsErrCode code = 0;
    long long count;

    if (js_GetStreamInfo(&info, c->js, stream, NULL, &code) != NATS_OK)
        return -1;
    count = (long long)info->State.Msgs;
    jsStreamInfo_Destroy(info);
    return count;
}

int
nats_consumer_stream_leader(nats_consumer *c, const char *stream, char *out, size_t size)
{
    jsStreamInfo *info = NULL;
    jsErrCode code = 0;
    int rc = -1;

    if (js_GetStreamInfo(&info, c->js, stream, NULL, &code) != NATS_OK)
        return -1;
    if (info->Cluster != NULL && info->Cluster->Leader != NULL && info->Cluster->Leader[0] != '\0') {
        snprintf(out, size, "%s", info->Cluster->Leader);
        rc = 0;
    }
    jsStreamInfo_Destroy(info);
    return rc;
}

/* Every header of message as "Name: value\n" lines, malloc'd. */
static char *
header_lines(natsMsg *message)
{
    const char **keys = NULL;
    int count = 0;
    size_t size = 1, used = 0;
    char *out;

    if (natsMsgHeader_Keys(message, &keys, &count) != NATS_OK)
        count = 0;
    for (int i = 0; i < count; i++) {
        const char *value = "";

        natsMsgHeader_Get(message, keys[i], &value);
        size += strlen(keys[i]) + strlen(value) + 3;
    }
    out = malloc(size);
    if (out != NULL) {
        out[0] = '\0';
        for (int i = 0; i < count; i++) {
            const char *value = "";

            natsMsgHeader_Get(message, keys[i], &value);
            used += (size_t)snprintf(out + used, size - used, "%s: %s\n", keys[i], value);
        }
    }
    free((void *)keys);
    return out;
}

int
nats_consumer_read(nats_consumer *c, const char *stream, struct nats_consumer_message **messages,
                   size_t *count)
{
    jsStreamInfo *info = NULL;
    jsErrCode code = 0;
    uint64_t first, last;
    size_t n = 0;

    *messages = NULL;
    *count = 0;
    if (js_GetStreamInfo(&info, c->js, stream, NULL, &code) != NATS_OK)
        return -1;
    first = info->State.FirstSeq;
    last = info->State.LastSeq;
    if (info->State.Msgs > 0) {
        *messages = calloc(info->State.Msgs, sizeof(**messages));
        if (*messages == NULL) {
            jsStreamInfo_Destroy(info);
            return -1;
        }
    }
    for (uint64_t seq = first; info->State.Msgs > 0 && seq <= last && n < info->State.Msgs; seq++) {
        natsMsg *message = NULL;
        struct nats_consumer_message *out = &(*messages)[n];
        const char *id = NULL;

        if (js_GetMsg(&message, c->js, stream, seq, NULL, &code) != NATS_OK)
            continue; /* deleted */
        out->sequence = seq;
        out->subject = strdup(natsMsg_GetSubject(message));
        out->body = strndup(natsMsg_GetData(message), (size_t)natsMsg_GetDataLength(message));
        out->headers = header_lines(message);
        out->job_id = -1;
        if (natsMsgHeader_Get(message, "Nats-Msg-Id", &id) == NATS_OK && id != NULL)
            out->msg_id = strdup(id);
        if (natsMsgHeader_Get(message, "Outbox-Job-Id", &id) == NATS_OK && id != NULL)
            out->job_id = strtoll(id, NULL, 10);
        natsMsg_Destroy(message);
        n++;
    }
    *count = n;
    jsStreamInfo_Destroy(info);
    return 0;
}

void
nats_consumer_messages_free(struct nats_consumer_message *messages, size_t count)
{
    for (size_t i = 0; messages != NULL && i < count; i++) {
        free(messages[i].subject);
        free(messages[i].msg_id);
        free(messages[i].body);
        free(messages[i].headers);
    }
    free(messages);
}
