/*
 * ha_common.c - see ha_common.h.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "amqp_consumer.h"
#include "ha_common.h"
#include "harness.h"
#include "relay_runner.h"

#define PRODUCER_GIVE_UP_SECONDS 120

/* The run's stack directory, before ha_start_servers() pointed OUTBOX_TEST_STACK_DIR elsewhere. */
static char outer_dir[2048];

void
ha_start_servers(const char *name, const char *const services[])
{
    const char *args[16] = {"start"};
    char dir[4096];
    size_t n = 1;
    double started = wall_clock_seconds();

    /* the figures printed along the way survive a failing test */
    setvbuf(stdout, NULL, _IONBF, 0);
    /* every stack of a test sits in the run's directory, whichever was loaded last */
    if (outer_dir[0] == '\0')
        snprintf(outer_dir, sizeof(outer_dir), "%s", harness_env("OUTBOX_TEST_STACK_DIR"));
    snprintf(dir, sizeof(dir), "%s/%s", outer_dir, name);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        fail_msg("unable to create %s: %s", dir, strerror(errno));
    setenv("OUTBOX_TEST_STACK_DIR", dir, 1);
    for (size_t i = 0; services[i] != NULL && n < 15; i++)
        args[n++] = services[i];
    args[n] = NULL;
    if (harness_stack_run(args) != 0)
        fail_msg("the test servers did not start (see the lines above)");
    printf("ha: servers up in %.1f s:", wall_clock_seconds() - started);
    for (size_t i = 0; services[i] != NULL; i++)
        printf(" %s", services[i]);
    printf("\n");
    harness_stack_load_env();
}

void
ha_stop_servers(void)
{
    const char *const args[] = {"stop", NULL};
    double started = wall_clock_seconds();

    harness_stack_run(args);
    printf("ha: servers stopped in %.1f s\n", wall_clock_seconds() - started);
}

void
ha_wait_third_through(PGconn *conn, struct relay_process *relay, int rows)
{
    char sql[128];

    snprintf(sql, sizeof(sql),
             "SELECT least(count(*), %d) FROM outbox.job WHERE state = 'succeeded'", rows / 3);
    if (wait_for_value(conn, sql, rows / 3, 120000) != rows / 3) {
        relay_dump_log(relay);
        fail_msg("a third of the rows did not get through within 120 s");
    }
}

void
ha_wait_all_succeeded(PGconn *conn, struct relay_process *relay)
{
    if (wait_for_value(conn, "SELECT count(*) FROM outbox.job WHERE state <> 'succeeded'", 0,
                       180000) != 0) {
        relay_dump_log(relay);
        fail_msg("rows left unsucceeded 180 s after the last commit");
    }
}

int
ha_start_cluster(const char *cluster)
{
    const char *const services[] = {cluster, NULL};

    ha_start_servers(cluster, services);
    return 0;
}

int
ha_group_teardown(void **state)
{
    (void)state;
    ha_stop_servers();
    return 0;
}

void
ha_stack(const char *const args[])
{
    int status;

    printf("ha: stack.sh");
    for (size_t i = 0; args[i] != NULL; i++)
        printf(" %s", args[i]);
    printf("\n");
    fflush(stdout);
    status = harness_stack_run(args);
    if (status != 0)
        fail_msg("stack.sh %s exited %d", args[0], status);
}

/* Appends the ids of a text array "{1,2,3}" to the producer's list. */
static void
add_ids(struct ha_producer *p, const char *array)
{
    for (const char *c = array; *c != '\0'; c++) {
        if (*c >= '0' && *c <= '9' && (c == array || c[-1] == '{' || c[-1] == ',')) {
            p->committed_ids[p->committed++] = strtoll(c, NULL, 10);
        }
    }
}

static void *
producer_run(void *arg)
{
    struct ha_producer *p = arg;
    PGconn *conn = NULL;
    char sql[512];
    double failing_since = 0;

    snprintf(sql, sizeof(sql),
             "SELECT array_agg(outbox.enqueue('%s', jsonb_build_object('n', g)))"
             " FROM generate_series(1, %d) AS g",
             p->queue, p->rows_per_commit);
    while (p->committed + p->in_doubt < p->total) {
        PGresult *result;

        if (conn == NULL || PQstatus(conn) != CONNECTION_OK) {
            PQfinish(conn);
            conn = PQconnectdb(p->database_url);
            if (PQstatus(conn) != CONNECTION_OK) {
                if (failing_since == 0)
                    failing_since = wall_clock_seconds();
                if (wall_clock_seconds() - failing_since > PRODUCER_GIVE_UP_SECONDS) {
                    snprintf(p->error, sizeof(p->error), "producer: no database for %d s: %s",
                             PRODUCER_GIVE_UP_SECONDS, PQerrorMessage(conn));
                    break;
                }
                usleep(100 * 1000);
                continue;
            }
        }
        result = PQexec(conn, sql);
        if (PQresultStatus(result) == PGRES_TUPLES_OK) {
            add_ids(p, PQgetvalue(result, 0, 0));
            atomic_store(&p->progress, p->committed);
            failing_since = 0;
        } else {
            /* the commit may or may not have happened: the final check reads the table */
            p->in_doubt += p->rows_per_commit;
            PQfinish(conn);
            conn = NULL;
            if (failing_since == 0)
                failing_since = wall_clock_seconds();
        }
        PQclear(result);
        if (p->pause_ms > 0)
            usleep((useconds_t)p->pause_ms * 1000);
    }
    PQfinish(conn);
    return NULL;
}

void
ha_producer_start(struct ha_producer *producer)
{
    producer->committed_ids = calloc((size_t)producer->total + (size_t)producer->rows_per_commit,
                                     sizeof(*producer->committed_ids));
    assert_non_null(producer->committed_ids);
    producer->committed = producer->in_doubt = 0;
    atomic_store(&producer->progress, 0);
    producer->error[0] = '\0';
    assert_int_equal(pthread_create(&producer->thread, NULL, producer_run, producer), 0);
}

void
ha_producer_join(struct ha_producer *producer)
{
    pthread_join(producer->thread, NULL);
}

void
ha_producer_clear(struct ha_producer *producer)
{
    free(producer->committed_ids);
    producer->committed_ids = NULL;
}

static int
compare_id(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;

    return (x > y) - (x < y);
}

/* The message ids drained so far. */
struct id_list {
    long long *ids;
    size_t count;
    size_t capacity;
    bool failed; /* out of memory, or a message without an id */
};

static void
collect_id(const char *message_id, int64_t job_id, void *arg)
{
    struct id_list *list = arg;

    if (list->count == list->capacity) {
        size_t capacity = list->capacity ? list->capacity * 2 : 4096;
        long long *ids = realloc(list->ids, capacity * sizeof(*ids));

        if (ids == NULL) {
            list->failed = true;
            return;
        }
        list->ids = ids;
        list->capacity = capacity;
    }
    if (message_id[0] == '\0' || job_id < 0)
        list->failed = true;
    list->ids[list->count++] = job_id;
}

void
ha_drain_amqp(PGconn *conn, const char *broker_url, const char *queue,
              struct ha_delivery *delivery)
{
    queue_consumer *mq = queue_consumer_connect(broker_url);
    struct id_list list = {0};
    long long *ids, *rows;
    size_t count, row_count, r = 0;
    char sql[256];
    PGresult *result;

    assert_non_null(mq);
    memset(delivery, 0, sizeof(*delivery));
    if (queue_consumer_drain(mq, queue, 2000, collect_id, &list) != 0)
        fail_msg("draining %s: %s", queue, queue_consumer_error(mq));
    queue_consumer_free(mq);
    assert_false(list.failed);
    ids = list.ids;
    count = list.count;

    snprintf(sql, sizeof(sql), "SELECT job_id FROM outbox.job WHERE queue = '%s' ORDER BY 1", queue);
    result = PQexec(conn, sql);
    assert_int_equal(PQresultStatus(result), PGRES_TUPLES_OK);
    row_count = (size_t)PQntuples(result);
    rows = calloc(row_count + 1, sizeof(*rows));
    assert_non_null(rows);
    for (size_t i = 0; i < row_count; i++)
        rows[i] = strtoll(PQgetvalue(result, (int)i, 0), NULL, 10);
    PQclear(result);

    if (count > 0)
        qsort(ids, count, sizeof(*ids), compare_id);
    delivery->rows = (long long)row_count;
    delivery->messages = (long long)count;
    for (size_t i = 0; i < count; i++) {
        if (i > 0 && ids[i] == ids[i - 1])
            continue;
        while (r < row_count && rows[r] < ids[i])
            r++;
        if (r < row_count && rows[r] == ids[i])
            delivery->unique++;
        else
            delivery->strays++;
    }
    delivery->duplicates = delivery->messages - delivery->unique - delivery->strays;
    free(rows);
    free(ids);
}
