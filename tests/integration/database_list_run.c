/*
 * database_list_run.c - see database_list_run.h.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "database_list_run.h"
#include "fixtures.h"
#include "harness.h"
#include "redis_consumer.h"

void
list_run_enqueue_into(struct run *run, int i, int first, int last)
{
    char sql[256];

    snprintf(sql, sizeof(sql),
             "SELECT count(outbox.enqueue('" LIST_RUN_QUEUE "',"
             " jsonb_build_object('db', '%s', 'n', g)))"
             " FROM generate_series(%d, %d) AS g",
             run->ids[i], first, last);
    harness_exec(run->conns[i], sql);
}

/* Databases made by this process: each identity is new, so Redis deduplicates no row of another. */
static int made;

void
list_run_begin(struct run *run, const char *tag, int count)
{
    run->admin = harness_connect(harness_env("OUTBOX_TEST_PG_URL"));
    snprintf(run->list_path, sizeof(run->list_path), "%s/databases-%s-%d.list",
             harness_env("OUTBOX_TEST_STACK_DIR"), tag, (int)getpid());
    snprintf(run->prefix, sizeof(run->prefix), "mdb-%s-%d:", tag, (int)getpid());
    run->count = count;
    for (int i = 0; i < run->count; i++)
        list_run_make_database(run, i);
}

void
list_run_make_database(struct run *run, int i)
{
    char output[2048];

    run->urls[i] = harness_database_new();
    run->conns[i] = harness_connect(run->urls[i]);
    snprintf(run->ids[i], sizeof(run->ids[i]), "mdb%d-%d", (int)getpid(), made++);
    {
        const char *argv[] = {"--database-url", run->urls[i], "identity", "set",
                              "--database-id",  run->ids[i],  NULL};

        if (fixture_run_outboxctl(argv, output, sizeof(output)) != 0)
            fail_msg("outboxctl identity set: %s", output);
    }
    list_run_enqueue_into(run, i, 1, run->bc->rows);
}

void
list_run_enqueue(struct run *run, int databases, int first, int last)
{
    for (int i = 0; i < databases; i++)
        list_run_enqueue_into(run, i, first, last);
}

void
list_run_write_list(const struct run *run, int databases, bool with_unreachable)
{
    FILE *file = fopen(run->list_path, "w");

    assert_non_null(file);
    fprintf(file, "# databases of %s\n", run->bc->name);
    for (int i = 0; i < databases; i++)
        fprintf(file, i % 2 == 0 ? "db%d %s\n" : "db%d   %s   # tenant\n", i, run->urls[i]);
    if (with_unreachable)
        fprintf(file, "unreachable postgresql://postgres@127.0.0.1:1/nowhere\n");
    assert_int_equal(fclose(file), 0);
}

void
list_run_start_relay(struct run *run, struct relay_process *relay, const char *name, int port)
{
    const char *broker = harness_env(run->bc->url_variable);
    char budget[16], metrics[32];
    const char *extra[16];
    int n = 0;

    snprintf(budget, sizeof(budget), "%d", run->bc->budget);
    snprintf(metrics, sizeof(metrics), port > 0 ? "127.0.0.1:%d" : "off", port);
    extra[n++] = "--databases";
    extra[n++] = run->list_path;
    extra[n++] = "--max-db-connections";
    extra[n++] = budget;
    extra[n++] = "--batch-size";
    extra[n++] = "20";
    extra[n++] = "--metrics-addr";
    extra[n++] = metrics;
    if (run->bc->lease != NULL) {
        extra[n++] = "--lease";
        extra[n++] = run->bc->lease;
    }
    extra[n++] = run->bc->prefix_option;
    extra[n++] = run->prefix;
    extra[n] = NULL;
    setenv("PGAPPNAME", name, 1); /* wins over the relay's fallback_application_name */
    relay_start_process(relay, NULL, broker, extra);
    unsetenv("PGAPPNAME");
}

long long
list_run_rows_left(const struct run *run)
{
    long long left = 0;

    for (int i = 0; i < run->count; i++)
        left += harness_query_ll(run->conns[i],
                                 "SELECT count(*) FROM outbox.job WHERE state <> 'succeeded'");
    return left;
}

/* The index of the database whose identity is id, -1 for none. */
static int
database_of(const struct run *run, const char *id)
{
    for (int i = 0; i < run->count; i++)
        if (strcmp(run->ids[i], id) == 0)
            return i;
    return -1;
}

void
list_run_check_redis(struct run *run, int rows_each, int last_rows)
{
    redisContext *redis = stream_consumer_connect(harness_env("OUTBOX_TEST_REDIS_URL"));
    struct stream_consumer_stream stream = {0};
    char stream_key[128], *seen = NULL;
    long long expected = 0;
    int width = rows_each > last_rows ? rows_each : last_rows;

    assert_non_null(redis);
    snprintf(stream_key, sizeof(stream_key), "%s" LIST_RUN_QUEUE, run->prefix);
    assert_int_equal(stream_consumer_read_stream(redis, stream_key, &stream), 0);
    seen = calloc((size_t)run->count * (size_t)(width + 1), 1);
    assert_non_null(seen);
    for (int i = 0; i < run->count; i++)
        expected += i == run->count - 1 ? last_rows : rows_each;
    for (size_t e = 0; e < stream.count; e++) {
        const struct stream_consumer_entry *entry = &stream.entries[e];
        char db[64] = "", want[96];
        int n = 0, index;

        if (sscanf(entry->payload, "{\"n\": %d, \"db\": \"%63[^\"]\"}", &n, db) != 2)
            fail_msg("unexpected payload %s", entry->payload);
        index = database_of(run, db);
        assert_true(index >= 0);
        /* the message id names the database the payload was written in */
        snprintf(want, sizeof(want), "%s:", db);
        if (strncmp(entry->message_id, want, strlen(want)) != 0)
            fail_msg("row of %s published as %s", db, entry->message_id);
        assert_true(n >= 1 && n <= width);
        if (seen[(size_t)index * (size_t)(width + 1) + (size_t)n]++)
            fail_msg("row %d of %s appended twice", n, db);
    }
    assert_int_equal((long long)stream.count, expected);
    free(seen);
    stream_consumer_stream_clear(&stream);
    stream_consumer_delete_prefix(redis, run->prefix);
    redisFree(redis);
}

long long
list_run_sessions_opened(const struct run *run)
{
    char sql[4096];
    int n = snprintf(sql, sizeof(sql),
                     "SELECT sum(sessions)::bigint FROM pg_stat_database"
                     " WHERE datname IN (''");

    for (int i = 0; i < run->count; i++)
        n += snprintf(sql + n, sizeof(sql) - (size_t)n, ", '%s'", PQdb(run->conns[i]));
    snprintf(sql + n, sizeof(sql) - (size_t)n, ")");
    return harness_query_ll(run->admin, sql);
}

/* The fewer of two looks at count(*) FROM pg_stat_activity WHERE where, 50 ms apart. */
static long long
connections_where(PGconn *admin, const char *where)
{
    char sql[320];
    long long first, second;

    snprintf(sql, sizeof(sql), "SELECT count(*) FROM pg_stat_activity WHERE %s", where);
    first = harness_query_ll(admin, sql);
    usleep(50 * 1000);
    second = harness_query_ll(admin, sql);
    return first < second ? first : second;
}

long long
list_run_connections_of(PGconn *admin, const char *name)
{
    char where[160];

    snprintf(where, sizeof(where), "application_name = '%s'", name);
    return connections_where(admin, where);
}

long long
list_run_connections_to(PGconn *admin, const char *name, const char *datname)
{
    char where[256];

    snprintf(where, sizeof(where), "application_name = '%s' AND datname = '%s'", name, datname);
    return connections_where(admin, where);
}

long long
list_run_watch_connections(PGconn *admin)
{
    return harness_query_ll(admin, "SELECT count(*) FROM pg_stat_activity"
                                   " WHERE application_name LIKE 'outbox-relay watch %'");
}

int
list_run_served_count(const char *metrics)
{
    int count = 0;

    for (const char *p = metrics; (p = strstr(p, "outbox_database_served{")) != NULL; p++) {
        const char *end = strchr(p, '\n');

        count += end != NULL && end[-1] == '1' && end[-2] == ' ';
    }
    return count;
}

int
list_run_log_lines_with(const struct relay_process *relay, const char *a, const char *b)
{
    char *log = fixture_read_file(relay->log_path);
    int count = 0;

    for (char *line = strtok(log, "\n"); line != NULL; line = strtok(NULL, "\n"))
        count += strstr(line, a) != NULL && strstr(line, b) != NULL;
    free(log);
    return count;
}

void
list_run_drop(struct run *run)
{
    for (int i = 0; i < LIST_RUN_MAX_DATABASES; i++) {
        PQfinish(run->conns[i]);
        run->conns[i] = NULL;
        if (run->urls[i] != NULL)
            harness_database_drop(run->urls[i]);
        run->urls[i] = NULL;
    }
    PQfinish(run->admin);
    run->admin = NULL;
    if (run->list_path[0] != '\0')
        unlink(run->list_path);
}

int
list_run_relay_of(const struct relay_process *relays, const bool *running, int count,
                  const char *owner)
{
    const char *colon = owner != NULL ? strchr(owner, ':') : NULL;
    int pid = colon != NULL ? atoi(colon + 1) : 0;

    for (int k = 0; k < count; k++)
        if (running[k] && relays[k].pid == pid)
            return k;
    return -1;
}
