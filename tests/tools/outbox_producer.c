/*
 * outbox_producer - a stand-in application for the demo, tests and benchmark.
 *
 * Each business transaction inserts an order into demo.orders and its event
 * into the outbox with outbox_enqueue(), then commits; every Nth transaction
 * rolls back instead, so its event must never reach the broker. Several
 * threads commit in parallel, optionally paced to a total rate.
 *
 *   outbox_producer --database-url URL [--queue orders] [--count 10000]
 *                   [--threads 4] [--rate ROWS_PER_S] [--rollback-every 10]
 *                   [--ordering-keys N] [--payload-bytes N] [--batch N]
 *
 * Prints one line: committed, rolled back, seconds, rows/s.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "outbox.h"

struct options {
    const char *database_url;
    const char *queue;
    long count;
    int threads;
    double rate;
    int rollback_every;
    int ordering_keys;
    int payload_bytes;
    int batch;
};

struct worker {
    const struct options *options;
    int index;
    long committed;
    long rolled_back;
    int failed;
};

static atomic_long next_order;

static double
now_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int
exec_ok(PGconn *conn, const char *sql)
{
    PGresult *result = PQexec(conn, sql);
    int ok = PQresultStatus(result) == PGRES_COMMAND_OK;

    if (!ok)
        fprintf(stderr, "outbox_producer: %s: %s", sql, PQerrorMessage(conn));
    PQclear(result);
    return ok;
}

static void *
worker_run(void *arg)
{
    struct worker *w = arg;
    const struct options *o = w->options;
    PGconn *conn = PQconnectdb(o->database_url);
    char *payload = NULL;
    double start = now_seconds();
    long done = 0;

    if (PQstatus(conn) != CONNECTION_OK) {
        fprintf(stderr, "outbox_producer: %s", PQerrorMessage(conn));
        w->failed = 1;
        goto out;
    }
    payload = malloc((size_t)o->payload_bytes + 128);
    for (;;) {
        long order = atomic_fetch_add(&next_order, o->batch);
        bool rollback;

        if (order >= o->count)
            break;
        rollback = o->rollback_every > 0 && (order / o->batch) % o->rollback_every == 0;
        if (!exec_ok(conn, "BEGIN")) {
            w->failed = 1;
            break;
        }
        for (int i = 0; i < o->batch && order + i < o->count; i++) {
            long id = order + i;
            char sql[160], key[32];
            struct outbox_message message = {.queue = o->queue};
            struct outbox_error err;
            int64_t job_id;
            int n;

            snprintf(sql, sizeof(sql),
                     "INSERT INTO demo.orders (order_id, amount) VALUES (%ld, %ld)", id,
                     id % 1000);
            if (!exec_ok(conn, sql)) {
                w->failed = 1;
                goto out;
            }
            n = snprintf(payload, 128, "{\"order_id\": %ld, \"event\": \"order.created\"",
                         id);
            if (o->payload_bytes > 0) {
                n += snprintf(payload + n, 16, ", \"pad\": \"");
                memset(payload + n, 'x', (size_t)o->payload_bytes);
                n += o->payload_bytes;
                n += snprintf(payload + n, 8, "\"");
            }
            snprintf(payload + n, 8, "}");
            message.payload_json = payload;
            if (o->ordering_keys > 0) {
                snprintf(key, sizeof(key), "order-%ld", id % o->ordering_keys);
                message.ordering_key = key;
            }
            if (outbox_enqueue(conn, &message, &job_id, &err) != 0) {
                fprintf(stderr, "outbox_producer: %s\n", err.message);
                w->failed = 1;
                goto out;
            }
            done++;
        }
        if (!exec_ok(conn, rollback ? "ROLLBACK" : "COMMIT")) {
            w->failed = 1;
            break;
        }
        if (rollback)
            w->rolled_back += o->batch;
        else
            w->committed += o->batch;
        if (order + o->batch > o->count) {
            long extra = order + o->batch - o->count;

            if (rollback)
                w->rolled_back -= extra;
            else
                w->committed -= extra;
        }
        if (o->rate > 0) {
            /* pace this thread to its share of the total rate */
            double due = start + (double)done / (o->rate / o->threads);
            double wait = due - now_seconds();

            if (wait > 0)
                usleep((useconds_t)(wait * 1e6));
        }
    }
out:
    free(payload);
    PQfinish(conn);
    return NULL;
}

static void
usage(void)
{
    fputs("usage: outbox_producer --database-url URL [--queue Q] [--count N] [--threads N]\n"
          "       [--rate ROWS_PER_S] [--rollback-every N] [--ordering-keys N]\n"
          "       [--payload-bytes N] [--batch N]\n",
          stderr);
    exit(2);
}

int
main(int argc, char **argv)
{
    struct options o = {.queue = "orders",
                        .count = 10000,
                        .threads = 4,
                        .rollback_every = 10,
                        .batch = 1};
    struct worker *workers;
    pthread_t *threads;
    long committed = 0, rolled_back = 0;
    int failed = 0;
    double start, seconds;
    PGconn *conn;

    for (int i = 1; i < argc; i++) {
        const char *name = argv[i];
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;

        if (value == NULL)
            usage();
        i++;
        if (strcmp(name, "--database-url") == 0)
            o.database_url = value;
        else if (strcmp(name, "--queue") == 0)
            o.queue = value;
        else if (strcmp(name, "--count") == 0)
            o.count = atol(value);
        else if (strcmp(name, "--threads") == 0)
            o.threads = atoi(value);
        else if (strcmp(name, "--rate") == 0)
            o.rate = atof(value);
        else if (strcmp(name, "--rollback-every") == 0)
            o.rollback_every = atoi(value);
        else if (strcmp(name, "--ordering-keys") == 0)
            o.ordering_keys = atoi(value);
        else if (strcmp(name, "--payload-bytes") == 0)
            o.payload_bytes = atoi(value);
        else if (strcmp(name, "--batch") == 0)
            o.batch = atoi(value);
        else
            usage();
    }
    if (o.database_url == NULL || o.threads < 1 || o.batch < 1 || o.count < 0 ||
        o.payload_bytes < 0 || o.payload_bytes > 10000000)
        usage();

    conn = PQconnectdb(o.database_url);
    if (PQstatus(conn) != CONNECTION_OK) {
        fprintf(stderr, "outbox_producer: %s", PQerrorMessage(conn));
        PQfinish(conn);
        return 1;
    }
    if (!exec_ok(conn, "CREATE SCHEMA IF NOT EXISTS demo;"
                       " CREATE TABLE IF NOT EXISTS demo.orders ("
                       " order_id bigint, amount bigint, created_at timestamptz DEFAULT now())")) {
        PQfinish(conn);
        return 1;
    }
    PQfinish(conn);

    workers = calloc((size_t)o.threads, sizeof(*workers));
    threads = calloc((size_t)o.threads, sizeof(*threads));
    start = now_seconds();
    for (int i = 0; i < o.threads; i++) {
        workers[i] = (struct worker){.options = &o, .index = i};
        pthread_create(&threads[i], NULL, worker_run, &workers[i]);
    }
    for (int i = 0; i < o.threads; i++) {
        pthread_join(threads[i], NULL);
        committed += workers[i].committed;
        rolled_back += workers[i].rolled_back;
        failed |= workers[i].failed;
    }
    seconds = now_seconds() - start;
    printf("committed=%ld rolled_back=%ld seconds=%.2f rows_per_second=%.0f\n", committed,
           rolled_back, seconds, (double)(committed + rolled_back) / seconds);
    free(workers);
    free(threads);
    return failed ? 1 : 0;
}
