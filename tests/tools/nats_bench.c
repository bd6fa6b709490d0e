/*
 * nats_bench.c - the NATS JetStream side of `make bench`: the raw async
 * publisher ceiling, and the stream the relay's drain is measured against.
 *
 *   nats_bench stream-create --broker URL --stream NAME --subject S [--duplicate-window SECONDS]
 *   nats_bench stream-delete --broker URL --stream NAME
 *   nats_bench stream-count  --broker URL --stream NAME      prints messages=N
 *   nats_bench publish --broker URL --subject S --count N [--payload-bytes B] [--window W]
 *                      [--msg-id no]
 *
 * publish sends N messages of B bytes (200) of JSON over one connection with
 * js_PublishMsgAsync, at most W (4096, as the relay) without an ack, each
 * with a Nats-Msg-Id of its own (so the server's dedup costs what it costs
 * the relay), waits for every ack, and prints "rate=<msgs/s> messages=<n>".
 * The bench owns its stream: the relay never creates one.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nats/nats.h>

struct arguments {
    const char *command;
    const char *broker;
    const char *stream;
    const char *subject;
    long count;
    long payload_bytes;
    long window;
    bool msg_id; /* a Nats-Msg-Id on every message (the default, as the relay) */
    long duplicate_window; /* stream-create: seconds; 0: the server's default (2 min) */
};

static int
usage(void)
{
    fprintf(stderr, "usage: nats_bench stream-create|stream-delete|stream-count|publish"
                    " --broker URL [--stream NAME] [--subject S] [--count N]"
                    " [--payload-bytes B] [--window W] [--duplicate-window SECONDS]\n");
    return 2;
}

static int
parse(int argc, char **argv, struct arguments *a)
{
    *a = (struct arguments){.payload_bytes = 200, .window = 4096, .msg_id = true};
    if (argc < 2)
        return -1;
    a->command = argv[1];
    for (int i = 2; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--broker") == 0)
            a->broker = argv[i + 1];
        else if (strcmp(argv[i], "--stream") == 0)
            a->stream = argv[i + 1];
        else if (strcmp(argv[i], "--subject") == 0)
            a->subject = argv[i + 1];
        else if (strcmp(argv[i], "--count") == 0)
            a->count = strtol(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--payload-bytes") == 0)
            a->payload_bytes = strtol(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--window") == 0)
            a->window = strtol(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--duplicate-window") == 0)
            a->duplicate_window = strtol(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--msg-id") == 0)
            a->msg_id = strcmp(argv[i + 1], "no") != 0;
        else
            return -1;
    }
    return a->broker != NULL && a->payload_bytes > 2 && a->window > 0 ? 0 : -1;
}

static double
now_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int
stream_command(jsCtx *js, const struct arguments *a)
{
    jsStreamInfo *info = NULL;
    jsErrCode code = 0;
    natsStatus st;

    if (a->stream == NULL)
        return usage();
    if (strcmp(a->command, "stream-create") == 0) {
        jsStreamConfig config;
        const char *subjects[1] = {a->subject};

        if (a->subject == NULL)
            return usage();
        jsStreamConfig_Init(&config);
        config.Name = a->stream;
        config.Subjects = subjects;
        config.SubjectsLen = 1;
        config.Storage = js_FileStorage;
        config.Duplicates = (int64_t)a->duplicate_window * 1000000000; /* nanoseconds */
        st = js_AddStream(&info, js, &config, NULL, &code);
    } else if (strcmp(a->command, "stream-delete") == 0) {
        st = js_DeleteStream(js, a->stream, NULL, &code);
        if (st == NATS_NOT_FOUND)
            st = NATS_OK;
    } else if (strcmp(a->command, "stream-count") == 0) {
        st = js_GetStreamInfo(&info, js, a->stream, NULL, &code);
        if (st == NATS_OK)
            printf("messages=%" PRIu64 "\n", info->State.Msgs);
    } else {
        return usage();
    }
    jsStreamInfo_Destroy(info);
    if (st != NATS_OK) {
        fprintf(stderr, "nats_bench: %s %s: %s (%d)\n", a->command, a->stream,
                natsStatus_GetText(st), (int)code);
        return 1;
    }
    return 0;
}

static int
publish(jsCtx *js, const struct arguments *a)
{
    char *payload = malloc((size_t)a->payload_bytes + 1), id[64];
    jsPubOptions options;
    natsStatus st = NATS_OK;
    double start;
    long sent = 0;

    if (a->subject == NULL || a->count <= 0 || payload == NULL)
        return usage();
    /* {"pad": "xxx..."} of exactly payload_bytes */
    if (a->payload_bytes < 12) {
        free(payload);
        return usage();
    }
    memcpy(payload, "{\"pad\": \"", 9);
    memset(payload + 9, 'x', (size_t)a->payload_bytes - 11);
    memcpy(payload + a->payload_bytes - 2, "\"}", 2);
    payload[a->payload_bytes] = '\0';
    start = now_seconds();
    for (; sent < a->count && st == NATS_OK; sent++) {
        natsMsg *message = NULL;

        snprintf(id, sizeof(id), "ceiling-%d-%.0f-%ld", (int)getpid(), start * 1000, sent);
        st = natsMsg_Create(&message, a->subject, NULL, payload, (int)a->payload_bytes);
        if (st == NATS_OK && a->msg_id)
            st = natsMsgHeader_Set(message, "Nats-Msg-Id", id);
        if (st == NATS_OK)
            st = natsMsgHeader_Set(message, "Content-Type", "application/json");
        if (st == NATS_OK)
            st = js_PublishMsgAsync(js, &message, NULL);
        natsMsg_Destroy(message); /* NULL once the library took it */
    }
    if (st == NATS_OK) {
        jsPubOptions_Init(&options);
        options.MaxWait = 60000;
        st = js_PublishAsyncComplete(js, &options);
    }
    free(payload);
    if (st != NATS_OK) {
        fprintf(stderr, "nats_bench: publish failed after %ld messages: %s\n", sent,
                natsStatus_GetText(st));
        return 1;
    }
    printf("rate=%.0f messages=%ld\n", (double)a->count / (now_seconds() - start), a->count);
    return 0;
}

int
main(int argc, char **argv)
{
    struct arguments a;
    natsConnection *connection = NULL;
    jsOptions js_options;
    jsCtx *js = NULL;
    natsStatus st;
    int rc;

    if (parse(argc, argv, &a) != 0)
        return usage();
    st = natsConnection_ConnectTo(&connection, a.broker);
    if (st != NATS_OK) {
        fprintf(stderr, "nats_bench: unable to connect: %s\n", natsStatus_GetText(st));
        return 1;
    }
    jsOptions_Init(&js_options);
    js_options.PublishAsync.MaxPending = a.window;
    js_options.PublishAsync.StallWait = 10000;
    st = natsConnection_JetStream(&js, connection, &js_options);
    if (st != NATS_OK) {
        fprintf(stderr, "nats_bench: no jetstream context: %s\n", natsStatus_GetText(st));
        natsConnection_Destroy(connection);
        return 1;
    }
    rc = strcmp(a.command, "publish") == 0 ? publish(js, &a) : stream_command(js, &a);
    jsCtx_Destroy(js);
    natsConnection_Close(connection);
    natsConnection_Destroy(connection);
    return rc;
}
