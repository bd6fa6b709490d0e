/*
 * outbox_consumer - reads what the relay published, for the demo and benchmark.
 *
 *   outbox_consumer --broker URL --queue Q [--expect N] [--idle-timeout SECONDS]
 *                   [--declare] [--bind EXCHANGE:PATTERN] [--show]
 *                   [--stream-prefix P] [--ids-file PATH]
 *                   [--inbox DATABASE_URL [--consumer NAME]]
 *
 * AMQP: consumes queue Q (declared durable first with --declare, then exits
 * at once when only --declare is asked with --expect 0). --bind declares a
 * durable topic exchange and binds Q to it with PATTERN; --show prints the
 * exchange, routing key and traceparent header of every message. Redis: reads stream
 * P+Q from the beginning. Counts messages and distinct message ids, stops
 * after --expect distinct ids or --idle-timeout seconds without a message,
 * and prints: received, unique, duplicates, seconds, rate. --ids-file writes
 * every distinct id, one per line, for the caller to compare with the
 * database.
 *
 * With --inbox, each message is also processed the way a consumer with
 * side effects in PostgreSQL would: one transaction accepts the message id
 * in the inbox (outbox_inbox_accept, consumer NAME, default "shipping") and,
 * only the first time, inserts a row into demo.shipments; a duplicate
 * delivery commits nothing. Prints processed and skipped counts too.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <hiredis.h>

#include <libpq-fe.h>

#include "outbox.h"
#include "sink.h"
#include "url.h"
#include "sink_amqp.h"
#include "sink_redis.h"

/* An open-addressing set of positive ids. */
struct id_set {
    long long *slots;
    size_t capacity;
    size_t count;
};

static bool
id_set_add(struct id_set *set, long long id)
{
    size_t i;

    if ((set->count + 1) * 2 > set->capacity) {
        struct id_set bigger = {.capacity = set->capacity ? set->capacity * 2 : 1024};

        bigger.slots = calloc(bigger.capacity, sizeof(*bigger.slots));
        for (size_t j = 0; j < set->capacity; j++)
            if (set->slots[j] != 0)
                id_set_add(&bigger, set->slots[j]);
        free(set->slots);
        *set = bigger;
    }
    for (i = (size_t)id * 2654435761u % set->capacity; set->slots[i] != 0;
         i = (i + 1) % set->capacity)
        if (set->slots[i] == id)
            return false;
    set->slots[i] = id;
    set->count++;
    return true;
}

static double
now_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct options {
    const char *inbox_url;
    const char *consumer;
    const char *broker;
    const char *queue;
    const char *stream_prefix;
    const char *ids_file;
    long expect;
    double idle_timeout;
    bool declare;
    const char *bind; /* "exchange:pattern" */
    bool show;
};

struct tally {
    struct id_set ids;
    long received;
    double first;
    double last;
    /* --inbox */
    PGconn *inbox;
    const char *consumer;
    long processed; /* accepted: the side effect committed with the inbox record */
    long skipped;   /* already accepted: nothing done */
    bool inbox_failed;
};

/* Runs sql on the inbox connection; false (with a message) when it fails. */
static bool
inbox_exec(struct tally *t, const char *sql)
{
    PGresult *result = PQexec(t->inbox, sql);
    bool ok = PQresultStatus(result) == PGRES_COMMAND_OK;

    if (!ok)
        fprintf(stderr, "outbox_consumer: %s: %s", sql, PQerrorMessage(t->inbox));
    PQclear(result);
    return ok;
}

/* One message through the inbox: the side effect at most once per message id. */
static void
inbox_process(struct tally *t, long long id)
{
    struct outbox_error err;
    char text[32], sql[128];
    bool accepted = false;

    if (t->inbox_failed || !inbox_exec(t, "BEGIN")) {
        t->inbox_failed = true;
        return;
    }
    snprintf(text, sizeof(text), "%lld", id);
    if (outbox_inbox_accept(t->inbox, t->consumer, text, &accepted, &err) != 0) {
        fprintf(stderr, "outbox_consumer: %s\n", err.message);
        t->inbox_failed = true;
        PQclear(PQexec(t->inbox, "ROLLBACK"));
        return;
    }
    snprintf(sql, sizeof(sql), "INSERT INTO demo.shipments (message_id) VALUES ('%lld')", id);
    if ((accepted && !inbox_exec(t, sql)) || !inbox_exec(t, "COMMIT")) {
        t->inbox_failed = true;
        PQclear(PQexec(t->inbox, "ROLLBACK"));
        return;
    }
    if (accepted)
        t->processed++;
    else
        t->skipped++;
}

static void
record(struct tally *t, long long id)
{
    double now = now_seconds();

    if (t->received++ == 0)
        t->first = now;
    t->last = now;
    id_set_add(&t->ids, id);
    if (t->inbox != NULL)
        inbox_process(t, id);
}

static int
amqp_ok(amqp_rpc_reply_t reply, const char *what)
{
    if (reply.reply_type == AMQP_RESPONSE_NORMAL)
        return 0;
    fprintf(stderr, "outbox_consumer: %s failed (reply type %d)\n", what, reply.reply_type);
    return -1;
}

/* Prints where one message came from and the trace it carries. */
static void
show_message(const char *id, const amqp_envelope_t *envelope)
{
    const amqp_table_t *headers = &envelope->message.properties.headers;
    int trace_len = 0;
    const char *trace = "";

    if (envelope->message.properties._flags & AMQP_BASIC_HEADERS_FLAG)
        for (int h = 0; h < headers->num_entries; h++)
            if (headers->entries[h].key.len == 11 &&
                memcmp(headers->entries[h].key.bytes, "traceparent", 11) == 0 &&
                headers->entries[h].value.kind == AMQP_FIELD_KIND_UTF8) {
                trace = headers->entries[h].value.value.bytes.bytes;
                trace_len = (int)headers->entries[h].value.value.bytes.len;
            }
    printf("message_id=%s exchange=%.*s routing_key=%.*s traceparent=%.*s\n", id,
           (int)envelope->exchange.len, (const char *)envelope->exchange.bytes,
           (int)envelope->routing_key.len, (const char *)envelope->routing_key.bytes, trace_len,
           trace);
}

static int
consume_amqp(const struct options *o, const struct broker_url *url, struct tally *t)
{
    amqp_connection_state_t conn = amqp_new_connection();
    amqp_socket_t *socket = amqp_tcp_socket_new(conn);
    amqp_bytes_t queue = amqp_cstring_bytes(o->queue);
    double idle_since = now_seconds();
    int rc = -1;

    if (socket == NULL || amqp_socket_open(socket, url->host, url->port) != AMQP_STATUS_OK) {
        fprintf(stderr, "outbox_consumer: cannot reach %s:%d\n", url->host, url->port);
        amqp_destroy_connection(conn);
        return -1;
    }
    if (amqp_ok(amqp_login(conn, sink_amqp_url_vhost(url), 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, url->user,
                           url->password),
                "login") != 0)
        goto out;
    amqp_channel_open(conn, 1);
    if (amqp_ok(amqp_get_rpc_reply(conn), "channel.open") != 0)
        goto out;
    if (o->declare) {
        amqp_queue_declare(conn, 1, queue, 0, 1, 0, 0, amqp_empty_table);
        if (amqp_ok(amqp_get_rpc_reply(conn), "queue.declare") != 0)
            goto out;
        if (o->bind != NULL && strchr(o->bind, ':') != NULL) {
            const char *colon = strchr(o->bind, ':');
            amqp_bytes_t exchange = {.len = (size_t)(colon - o->bind), .bytes = (void *)o->bind};

            amqp_exchange_declare(conn, 1, exchange, amqp_cstring_bytes("topic"), 0, 1, 0, 0,
                                  amqp_empty_table);
            if (amqp_ok(amqp_get_rpc_reply(conn), "exchange.declare") != 0)
                goto out;
            amqp_queue_bind(conn, 1, queue, exchange, amqp_cstring_bytes(colon + 1),
                            amqp_empty_table);
            if (amqp_ok(amqp_get_rpc_reply(conn), "queue.bind") != 0)
                goto out;
        }
        if (o->expect == 0) {
            rc = 0;
            goto out;
        }
    }
    amqp_basic_qos(conn, 1, 0, 2000, 0);
    amqp_basic_consume(conn, 1, queue, amqp_empty_bytes, 0, 0, 0, amqp_empty_table);
    if (amqp_ok(amqp_get_rpc_reply(conn), "basic.consume") != 0)
        goto out;

    while (o->expect <= 0 || (long)t->ids.count < o->expect) {
        struct timeval timeout = {.tv_sec = 0, .tv_usec = 200000};
        amqp_envelope_t envelope;
        amqp_rpc_reply_t reply;

        amqp_maybe_release_buffers(conn);
        reply = amqp_consume_message(conn, &envelope, &timeout, 0);
        if (reply.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
            reply.library_error == AMQP_STATUS_TIMEOUT) {
            if (now_seconds() - idle_since > o->idle_timeout)
                break;
            continue;
        }
        if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
            fprintf(stderr, "outbox_consumer: consume failed\n");
            goto out;
        }
        idle_since = now_seconds();
        if (envelope.message.properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG) {
            char id[128] = {0};
            amqp_bytes_t bytes = envelope.message.properties.message_id;
            const char *job_id;

            memcpy(id, bytes.bytes, bytes.len < sizeof(id) - 1 ? bytes.len : sizeof(id) - 1);
            /* <database_id>:<epoch>:<job_id>, or a bare <job_id> from a database of an earlier release */
            job_id = strrchr(id, ':');
            record(t, atoll(job_id != NULL ? job_id + 1 : id));
            if (o->show)
                show_message(id, &envelope);
        }
        /* ack every 500 messages with multiple, and the last one */
        if (t->received % 500 == 0 || (o->expect > 0 && (long)t->ids.count >= o->expect))
            amqp_basic_ack(conn, 1, envelope.delivery_tag, 1);
        amqp_destroy_envelope(&envelope);
    }
    rc = 0;
out:
    amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(conn);
    return rc;
}

static int
consume_redis(const struct options *o, const struct broker_url *url, struct tally *t)
{
    struct timeval timeout = {.tv_sec = 5, .tv_usec = 0};
    redisContext *c = redisConnectWithTimeout(url->host, url->port, timeout);
    char stream[512], last_id[64] = "0-0";
    double idle_since = now_seconds();
    redisReply *reply;

    if (c == NULL || c->err) {
        fprintf(stderr, "outbox_consumer: cannot reach %s:%d\n", url->host, url->port);
        redisFree(c);
        return -1;
    }
    if (url->password != NULL) {
        reply = url->user ? redisCommand(c, "AUTH %s %s", url->user, url->password)
                          : redisCommand(c, "AUTH %s", url->password);
        freeReplyObject(reply);
    }
    reply = redisCommand(c, "SELECT %d", sink_redis_url_db(url));
    freeReplyObject(reply);
    snprintf(stream, sizeof(stream), "%s%s", o->stream_prefix ? o->stream_prefix : "", o->queue);

    while (o->expect <= 0 || (long)t->ids.count < o->expect) {
        reply = redisCommand(c, "XREAD COUNT 1000 BLOCK 200 STREAMS %s %s", stream, last_id);
        if (reply == NULL) {
            fprintf(stderr, "outbox_consumer: redis: %s\n", c->errstr);
            redisFree(c);
            return -1;
        }
        if (reply->type == REDIS_REPLY_NIL || reply->elements == 0) {
            freeReplyObject(reply);
            if (now_seconds() - idle_since > o->idle_timeout)
                break;
            continue;
        }
        idle_since = now_seconds();
        {
            redisReply *entries = reply->element[0]->element[1];

            for (size_t i = 0; i < entries->elements; i++) {
                redisReply *entry = entries->element[i];
                redisReply *fields = entry->element[1];

                snprintf(last_id, sizeof(last_id), "%s", entry->element[0]->str);
                for (size_t f = 0; f + 1 < fields->elements; f += 2)
                    if (strcmp(fields->element[f]->str, "job_id") == 0)
                        record(t, atoll(fields->element[f + 1]->str));
            }
        }
        freeReplyObject(reply);
    }
    redisFree(c);
    return 0;
}

int
main(int argc, char **argv)
{
    struct options o = {.queue = "orders", .idle_timeout = 30, .stream_prefix = ""};
    struct tally t = {0};
    struct broker_url url;
    struct outbox_error err;
    int rc;

    for (int i = 1; i < argc; i++) {
        const char *name = argv[i];

        if (strcmp(name, "--declare") == 0) {
            o.declare = true;
            continue;
        }
        if (strcmp(name, "--show") == 0) {
            o.show = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "outbox_consumer: %s needs a value\n", name);
            return 2;
        }
        if (strcmp(name, "--broker") == 0)
            o.broker = argv[++i];
        else if (strcmp(name, "--queue") == 0)
            o.queue = argv[++i];
        else if (strcmp(name, "--expect") == 0)
            o.expect = atol(argv[++i]);
        else if (strcmp(name, "--idle-timeout") == 0)
            o.idle_timeout = atof(argv[++i]);
        else if (strcmp(name, "--stream-prefix") == 0)
            o.stream_prefix = argv[++i];
        else if (strcmp(name, "--bind") == 0)
            o.bind = argv[++i];
        else if (strcmp(name, "--ids-file") == 0)
            o.ids_file = argv[++i];
        else if (strcmp(name, "--inbox") == 0)
            o.inbox_url = argv[++i];
        else if (strcmp(name, "--consumer") == 0)
            o.consumer = argv[++i];
        else {
            fprintf(stderr, "outbox_consumer: unknown option %s\n", name);
            return 2;
        }
    }
    if (o.broker == NULL || sink_url_parse(o.broker, &url, &err) != 0) {
        fprintf(stderr, "outbox_consumer: --broker: %s\n",
                o.broker ? err.message : "required");
        return 2;
    }
    if (o.inbox_url != NULL) {
        t.inbox = PQconnectdb(o.inbox_url);
        t.consumer = o.consumer != NULL ? o.consumer : "shipping";
        if (PQstatus(t.inbox) != CONNECTION_OK ||
            !inbox_exec(&t, "SET client_min_messages = warning;"
                            " CREATE SCHEMA IF NOT EXISTS demo;"
                            " CREATE TABLE IF NOT EXISTS demo.shipments ("
                            "   message_id text NOT NULL,"
                            "   shipped_at timestamptz NOT NULL DEFAULT now())")) {
            fprintf(stderr, "outbox_consumer: --inbox: %s", PQerrorMessage(t.inbox));
            PQfinish(t.inbox);
            url_clear(&url);
            return 1;
        }
    }
    rc = strcmp(url.scheme->name, "redis") == 0 ? consume_redis(&o, &url, &t) : consume_amqp(&o, &url, &t);
    url_clear(&url);
    if (t.inbox_failed)
        rc = -1;
    if (rc == 0 && t.inbox != NULL)
        printf("inbox consumer=%s processed=%ld skipped=%ld\n", t.consumer, t.processed,
               t.skipped);
    PQfinish(t.inbox);
    if (rc == 0 && !(o.declare && o.expect == 0)) {
        double seconds = t.last > t.first ? t.last - t.first : 0;

        printf("received=%ld unique=%zu duplicates=%ld seconds=%.2f rate=%.0f\n", t.received,
               t.ids.count, t.received - (long)t.ids.count, seconds,
               seconds > 0 ? (double)t.received / seconds : 0.0);
        if (o.ids_file != NULL) {
            FILE *f = fopen(o.ids_file, "w");

            for (size_t i = 0; f != NULL && i < t.ids.capacity; i++)
                if (t.ids.slots[i] != 0)
                    fprintf(f, "%lld\n", t.ids.slots[i]);
            if (f != NULL)
                fclose(f);
        }
    }
    free(t.ids.slots);
    return rc == 0 ? 0 : 1;
}
