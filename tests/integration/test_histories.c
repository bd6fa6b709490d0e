/*
 * test_histories.c - rows committed in a second history of a database reach
 * the broker: a TEMPLATE copy beside its original, a dump restored twice, a
 * cold copy of a stopped data directory started in place, and a database
 * on the bare ids of an earlier release through a promotion. Each history
 * hands out the job ids the other did, on the same cluster, system
 * identifier and timeline (the promotion aside): only an identity the row
 * carries tells its messages apart.
 *
 * Run for Redis (dedup records) and NATS (Nats-Msg-Id within the stream's
 * duplicate window), the brokers that drop a message id they hold, read
 * with consumers that share no code with the relay. Rows carry a tag per
 * history in their payload; every tag's rows must be there exactly once.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "broker_matrix.h"
#include "fixtures.h"
#include "harness.h"
#include "nats_consumer.h"
#include "outbox.h"
#include "redis_consumer.h"
#include "relay_runner.h"

#define PG_BIN "/usr/lib/postgresql/15/bin"
#define ROWS 30

struct fixture;

/* A broker whose own dedup drops a message id it holds. */
struct broker {
    const char *name;
    const char *url_variable;
    void (*open)(struct fixture *f);
    void (*close)(struct fixture *f);
    /* The payloads (malloc'd, each malloc'd) and message ids consumers see, of every message. */
    size_t (*read)(struct fixture *f, char ***payloads, char ***message_ids);
};

struct fixture {
    const struct broker *broker;
    const char *broker_url;
    char *url;
    PGconn *conn;
    char queue[64];
    char prefix[64];
    const char *extra[4];
    redisContext *redis;
    nats_consumer *nats;
    char *copies[3];       /* databases a test made beside f->url, dropped at teardown */
    char second_dir[2048]; /* a second cluster's stack, stopped at teardown */
    char *second_url;      /* its database */
    char *log;
};

static int test_counter;

/* ---- Redis: a stream per queue under the test's prefix ---- */

static void
redis_open(struct fixture *f)
{
    f->redis = stream_consumer_connect(f->broker_url);
    assert_non_null(f->redis);
    f->extra[0] = "--stream-prefix";
    f->extra[1] = f->prefix;
}

static void
redis_close(struct fixture *f)
{
    stream_consumer_delete_test_keys(f->redis, f->prefix);
    redisFree(f->redis);
}

static size_t
redis_read(struct fixture *f, char ***payloads, char ***message_ids)
{
    struct stream_consumer_stream stream = {0};
    char key[160];
    size_t count;

    snprintf(key, sizeof(key), "%s%s", f->prefix, f->queue);
    assert_int_equal(stream_consumer_read_stream(f->redis, key, &stream), 0);
    count = stream.count;
    *payloads = calloc(count + 1, sizeof(char *));
    *message_ids = calloc(count + 1, sizeof(char *));
    assert_true(*payloads != NULL && *message_ids != NULL);
    for (size_t i = 0; i < count; i++) {
        (*payloads)[i] = strdup(stream.entries[i].payload);
        (*message_ids)[i] = strdup(stream.entries[i].message_id ? stream.entries[i].message_id : "");
    }
    stream_consumer_stream_clear(&stream);
    return count;
}

/* ---- NATS: a stream over "<prefix>.>", messages of subject prefix + queue ---- */

static void
nats_open(struct fixture *f)
{
    f->nats = broker_nats_stream_open(f->broker_url, f->prefix);
    f->extra[0] = "--subject-prefix";
    f->extra[1] = f->prefix;
}

static void
nats_close(struct fixture *f)
{
    broker_nats_stream_close(f->nats, f->prefix);
}

/* The message id consumers see: Outbox-Message-Id when there is one, else Nats-Msg-Id. */
static char *
nats_message_id(const struct nats_consumer_message *m)
{
    const char *line = m->headers != NULL ? strstr(m->headers, "Outbox-Message-Id: ") : NULL;

    if (line == NULL)
        return strdup(m->msg_id != NULL ? m->msg_id : "");
    line += strlen("Outbox-Message-Id: ");
    return strndup(line, strcspn(line, "\r\n"));
}

static size_t
nats_read(struct fixture *f, char ***payloads, char ***message_ids)
{
    struct nats_consumer_message *messages;
    char name[64];
    size_t count;

    broker_nats_stream_name(f->prefix, name, sizeof(name));
    assert_int_equal(nats_consumer_read(f->nats, name, &messages, &count), 0);
    *payloads = calloc(count + 1, sizeof(char *));
    *message_ids = calloc(count + 1, sizeof(char *));
    assert_true(*payloads != NULL && *message_ids != NULL);
    for (size_t i = 0; i < count; i++) {
        (*payloads)[i] = strdup(messages[i].body);
        (*message_ids)[i] = nats_message_id(&messages[i]);
    }
    nats_consumer_messages_free(messages, count);
    return count;
}

static const struct broker BROKERS[] = {
    {"redis", "OUTBOX_TEST_REDIS_URL", redis_open, redis_close, redis_read},
    {"nats", "OUTBOX_TEST_NATS_URL", nats_open, nats_close, nats_read},
};

/* ---- fixture ---- */

static int
setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    f->broker = *state;
    f->broker_url = harness_env(f->broker->url_variable);
    f->url = harness_database_new();
    f->conn = harness_connect(f->url);
    snprintf(f->queue, sizeof(f->queue), "histories-%d-%d", (int)getpid(), test_counter);
    snprintf(f->prefix, sizeof(f->prefix), "histories-%d-%d:", (int)getpid(), test_counter++);
    f->log = harness_log_path("histories");
    f->broker->open(f);
    *state = f;
    return 0;
}

/* Runs tests/harness/stack.sh with args (NULL-terminated, at most 4) on the second cluster. */
static int
second_stack(struct fixture *f, const char *const *args)
{
    const char *argv[8] = {"sh", "-c", "\"$0\" \"$@\"", NULL};
    char script[2048];
    size_t n = 3;

    snprintf(script, sizeof(script), "%s/tests/harness/stack.sh", harness_env("OUTBOX_SOURCE_DIR"));
    argv[n++] = script;
    for (size_t i = 0; args[i] != NULL && n + 1 < sizeof(argv) / sizeof(argv[0]); i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    return harness_wait_exit(harness_spawn(argv, f->log), 120000);
}

static int
teardown(void **state)
{
    struct fixture *f = *state;

    if (f->second_dir[0] != '\0') {
        const char *argv[] = {"rm", "-rf", f->second_dir, NULL};

        second_stack(f, (const char *[]){"stop", f->second_dir, NULL});
        harness_wait_exit(harness_spawn(argv, f->log), 60000);
    }
    f->broker->close(f);
    PQfinish(f->conn);
    for (size_t i = 0; i < sizeof(f->copies) / sizeof(f->copies[0]); i++)
        harness_database_drop(f->copies[i]);
    free(f->second_url);
    harness_database_drop(f->url);
    free(f->log);
    free(f);
    return 0;
}

/* ---- steps ---- */

/* Enqueues ROWS rows whose payload names tag. */
static void
enqueue_tagged(PGconn *conn, const struct fixture *f, const char *tag)
{
    char sql[512];

    snprintf(sql, sizeof(sql),
             "SELECT count(outbox.enqueue('%s', jsonb_build_object('tag', '%s', 'n', g)))"
             " FROM generate_series(1, %d) AS g",
             f->queue, tag, ROWS);
    assert_int_equal(harness_query_ll(conn, sql), ROWS);
}

/* Runs a relay with --once on url to a clean end; its log is left in *relay (unlink it). */
static void
publish_into(const struct fixture *f, const char *url, struct relay_process *relay)
{
    const char *extra[] = {f->extra[0], f->extra[1], "--once", NULL};

    relay_start_process(relay, url, f->broker_url, extra);
    if (relay_wait(relay, 60000) != 0) {
        relay_dump_log(relay);
        fail_msg("the relay on %s did not end cleanly", url);
    }
}

static void
publish(const struct fixture *f, const char *url)
{
    struct relay_process relay;

    publish_into(f, url, &relay);
    unlink(relay.log_path);
}

/*
 * How many messages the broker holds of rows tagged tag, how many distinct
 * rows those are (a row is its payload: tag and number), and whether each
 * carries a bare job id as its consumers' message id (bare may be NULL).
 */
static size_t
count_tagged(struct fixture *f, const char *tag, size_t *distinct, bool *bare)
{
    char **payloads, **ids, needle[96];
    size_t count = f->broker->read(f, &payloads, &ids), found = 0;

    snprintf(needle, sizeof(needle), "\"tag\": \"%s\"", tag);
    *distinct = 0;
    if (bare != NULL)
        *bare = true;
    for (size_t i = 0; i < count; i++) {
        bool seen = false;

        if (strstr(payloads[i], needle) == NULL)
            continue;
        found++;
        for (size_t j = 0; j < i && !seen; j++)
            seen = strcmp(payloads[j], payloads[i]) == 0;
        *distinct += !seen;
        if (bare != NULL && (ids[i][0] == '\0' || strspn(ids[i], "0123456789") != strlen(ids[i])))
            *bare = false;
    }
    for (size_t i = 0; i < count; i++) {
        free(payloads[i]);
        free(ids[i]);
    }
    free(payloads);
    free(ids);
    return found;
}

/* Every row tagged tag is at the broker, exactly once. */
static void
assert_tag_delivered(struct fixture *f, const char *tag)
{
    size_t distinct, count = count_tagged(f, tag, &distinct, NULL);

    if (count != ROWS || distinct != ROWS)
        fail_msg("%s: rows tagged '%s': %zu of %d at the broker (%zu messages)", f->broker->name,
                 tag, distinct, ROWS, count);
}

/* The name of url's database. */
static const char *
database_name(const char *url)
{
    return strrchr(url, '/') + 1;
}

/* A URL of database name on the server of url (malloc'd). */
static char *
url_on_same_server(const char *url, const char *name)
{
    size_t base = (size_t)(database_name(url) - url);
    char *out = malloc(base + strlen(name) + 1);

    assert_non_null(out);
    memcpy(out, url, base);
    strcpy(out + base, name);
    return out;
}

/* Runs sql on the test server's maintenance database. */
static void
maintenance(const char *sql)
{
    PGconn *admin = harness_connect(harness_env("OUTBOX_TEST_PG_URL"));

    harness_exec(admin, sql);
    PQfinish(admin);
}

/* ---- scenarios ---- */

/*
 * Case 9. A CREATE DATABASE ... TEMPLATE copy publishing beside its
 * original without `identity set`: the rows the copy took unpublished are
 * one message each (true duplicates), and the rows each side commits
 * after the copy, under the same job ids, all arrive.
 */
static void
test_template_copy_beside_its_original(void **state)
{
    struct fixture *f = *state;
    char sql[256], name[96];
    PGconn *copy;

    enqueue_tagged(f->conn, f, "before");
    publish(f, f->url);
    enqueue_tagged(f->conn, f, "copied"); /* not yet published when the copy is made */
    PQfinish(f->conn);
    snprintf(name, sizeof(name), "%s_copy", database_name(f->url));
    snprintf(sql, sizeof(sql), "CREATE DATABASE %s TEMPLATE %s", name, database_name(f->url));
    maintenance(sql);
    f->copies[0] = url_on_same_server(f->url, name);
    f->conn = harness_connect(f->url);
    copy = harness_connect(f->copies[0]);

    enqueue_tagged(f->conn, f, "original");
    enqueue_tagged(copy, f, "copy");
    assert_int_equal(harness_query_ll(copy, "SELECT max(job_id) FROM outbox.job"),
                     harness_query_ll(f->conn, "SELECT max(job_id) FROM outbox.job"));
    publish(f, f->url);
    publish(f, f->copies[0]);
    PQfinish(copy);

    assert_tag_delivered(f, "before");
    assert_tag_delivered(f, "copied");
    assert_tag_delivered(f, "original");
    assert_tag_delivered(f, "copy");
}

/* pg_dump -Fc of f->url restored into a new database name of the same server; its URL. */
static char *
restore_dump(struct fixture *f, const char *dump, const char *name)
{
    char sql[160], command[4096];
    const char *argv[] = {"sh", "-c", command, NULL};
    char *url = url_on_same_server(f->url, name);

    snprintf(sql, sizeof(sql), "CREATE DATABASE %s TEMPLATE template0", name);
    maintenance(sql);
    snprintf(command, sizeof(command), PG_BIN "/pg_restore --exit-on-error -d '%s' '%s'", url,
             dump);
    if (harness_wait_exit(harness_spawn(argv, f->log), 120000) != 0)
        fail_msg("pg_restore failed (see %s)", f->log);
    return url;
}

/*
 * Case 4. One pg_dump restored twice (a move retried: restored, used,
 * dropped, restored again): the rows committed in each restore all arrive,
 * though both hand out the same job ids after the same dump.
 */
static void
test_dump_restored_twice(void **state)
{
    struct fixture *f = *state;
    char dump[2200], command[4096], name[96];
    const char *argv[] = {"sh", "-c", command, NULL};
    PGconn *restored;

    enqueue_tagged(f->conn, f, "before");
    publish(f, f->url);
    snprintf(dump, sizeof(dump), "%s.%d.dump", f->log, (int)getpid());
    snprintf(command, sizeof(command), PG_BIN "/pg_dump -Fc -f '%s' '%s'", dump, f->url);
    if (harness_wait_exit(harness_spawn(argv, f->log), 120000) != 0)
        fail_msg("pg_dump failed (see %s)", f->log);

    snprintf(name, sizeof(name), "%s_r1", database_name(f->url));
    f->copies[0] = restore_dump(f, dump, name);
    restored = harness_connect(f->copies[0]);
    enqueue_tagged(restored, f, "first");
    PQfinish(restored);
    publish(f, f->copies[0]);
    harness_database_drop(f->copies[0]);

    f->copies[0] = restore_dump(f, dump, name);
    restored = harness_connect(f->copies[0]);
    enqueue_tagged(restored, f, "second");
    PQfinish(restored);
    publish(f, f->copies[0]);
    unlink(dump);

    assert_tag_delivered(f, "before");
    assert_tag_delivered(f, "first");
    assert_tag_delivered(f, "second");
}

/* Starts a second, freshly initdb'd PostgreSQL; a migrated database "app" of it is returned. */
static char *
second_cluster_start(struct fixture *f)
{
    char env_path[2100], admin_url[128];
    const char *port_line;
    struct outbox_error err;
    int applied;
    char *env;
    PGconn *conn;

    snprintf(f->second_dir, sizeof(f->second_dir), "%s/%.*s", harness_env("OUTBOX_TEST_STACK_DIR"),
             (int)strlen(f->prefix) - 1, f->prefix);
    if (mkdir(f->second_dir, 0755) != 0 && errno != EEXIST)
        fail_msg("unable to create %s: %s", f->second_dir, strerror(errno));
    if (second_stack(f, (const char *[]){"start", f->second_dir, "postgres", NULL}) != 0)
        fail_msg("the second cluster did not start (see %s)", f->log);
    snprintf(env_path, sizeof(env_path), "%s/env", f->second_dir);
    env = fixture_read_file(env_path);
    port_line = strstr(env, "OUTBOX_TEST_PG_PORT=");
    assert_non_null(port_line);
    snprintf(admin_url, sizeof(admin_url), "postgresql://postgres@127.0.0.1:%d/postgres",
             atoi(port_line + strlen("OUTBOX_TEST_PG_PORT=")));
    free(env);
    conn = harness_connect(admin_url);
    harness_exec(conn, "CREATE DATABASE app");
    PQfinish(conn);
    f->second_url = url_on_same_server(admin_url, "app");
    conn = harness_connect(f->second_url);
    if (outbox_migrate(conn, &applied, &err) != 0)
        fail_msg("unable to migrate the second cluster's database: %s", err.message);
    PQfinish(conn);
    return f->second_url;
}

/* Runs command (sh) in the second cluster's directory, as root; fails the test when it fails. */
static void
second_cluster_shell(struct fixture *f, const char *command)
{
    const char *argv[] = {"sh", "-c", "cd \"$0\" && eval \"$1\"", f->second_dir, command, NULL};

    if (harness_wait_exit(harness_spawn(argv, f->log), 120000) != 0)
        fail_msg("'%s' failed in %s (see %s)", command, f->second_dir, f->log);
}

static void
second_cluster_service(struct fixture *f, const char *command)
{
    if (second_stack(f, (const char *[]){command, f->second_dir, "postgres", NULL}) != 0)
        fail_msg("stack.sh %s postgres failed (see %s)", command, f->log);
}

/*
 * Case 1. A cold copy of a stopped data directory, started in place of the
 * cluster after the cluster went on publishing: same system identifier,
 * same timeline, the same job ids handed out again. The rows committed
 * after the copy was started all arrive.
 */
static void
test_cold_copy_started_in_place(void **state)
{
    struct fixture *f = *state;
    char *url = second_cluster_start(f);
    PGconn *conn = harness_connect(url);

    enqueue_tagged(conn, f, "before");
    PQfinish(conn);
    publish(f, url);
    second_cluster_service(f, "stop-service");
    second_cluster_shell(f, "rm -rf pg.copy && cp -a pg pg.copy");
    second_cluster_service(f, "start-service");

    conn = harness_connect(url);
    enqueue_tagged(conn, f, "lost"); /* published, then the cluster is lost */
    PQfinish(conn);
    publish(f, url);
    second_cluster_service(f, "stop-service");
    second_cluster_shell(f, "rm -rf pg && mv pg.copy pg");
    second_cluster_service(f, "start-service");

    conn = harness_connect(url);
    enqueue_tagged(conn, f, "after");
    PQfinish(conn);
    publish(f, url);

    assert_tag_delivered(f, "before");
    assert_tag_delivered(f, "lost");
    assert_tag_delivered(f, "after");
}

/*
 * Case 8. A database kept on the bare job ids of an earlier release
 * (--id-form job) through an asynchronous promotion, as the new primary
 * sees it: the rows the old primary published last never reached it, its
 * job id sequence hands their ids out again, on a later timeline. Its
 * consumers still see bare job ids, but the broker's own dedup keys are
 * unique at once: every row committed after the promotion arrives, and the
 * relay warns that the history changed under ids of an earlier form.
 */
static void
test_bare_ids_through_a_promotion(void **state)
{
    struct fixture *f = *state;
    const char *warning[] = {"database history changed", "id_form=job", NULL};
    struct relay_process relay;
    size_t distinct;
    long long last;
    bool bare;

    harness_exec(f->conn, "SELECT outbox.identity_set(NULL, 'job')");
    enqueue_tagged(f->conn, f, "before");
    publish(f, f->url);
    last = harness_query_ll(f->conn, "SELECT max(job_id) FROM outbox.job");
    enqueue_tagged(f->conn, f, "lost");
    publish(f, f->url);
    /* the promoted standby: without the lost rows, its sequence behind them, a timeline on */
    harness_exec(f->conn, "DELETE FROM outbox.job WHERE payload->>'tag' = 'lost'");
    {
        char sql[160];

        snprintf(sql, sizeof(sql),
                 "SELECT setval(pg_get_serial_sequence('outbox.job', 'job_id'), %lld)", last);
        harness_exec(f->conn, sql);
    }
    harness_exec(f->conn, "UPDATE outbox.identity SET timeline = timeline - 1");
    enqueue_tagged(f->conn, f, "after");
    publish_into(f, f->url, &relay);

    assert_tag_delivered(f, "before");
    assert_tag_delivered(f, "lost");
    assert_tag_delivered(f, "after");
    count_tagged(f, "after", &distinct, &bare);
    assert_true(bare); /* what consumers see is the form they know */
    if (relay_log_find(&relay, 0, false, warning, NULL, 0) < 0) {
        relay_dump_log(&relay);
        fail_msg("the relay logged no warning of the history change");
    }
    unlink(relay.log_path);
}

static const struct broker_scenario SCENARIOS[] = {
    {"template_copy_beside_its_original", test_template_copy_beside_its_original},
    {"dump_restored_twice", test_dump_restored_twice},
    {"cold_copy_started_in_place", test_cold_copy_started_in_place},
    {"bare_ids_through_a_promotion", test_bare_ids_through_a_promotion},
};

int
main(void)
{
    return broker_matrix_run("histories", BROKERS, sizeof(BROKERS) / sizeof(BROKERS[0]),
                             sizeof(BROKERS[0]), SCENARIOS, sizeof(SCENARIOS) / sizeof(SCENARIOS[0]),
                             setup, teardown);
}
