/*
 * test_ha_async_promotion.c - an asynchronous standby promoted while it
 * lagged: the relay had published rows the standby never received, so the
 * new primary hands out their job ids (and transaction ids) again. Rows
 * committed on the new primary after the switch must all be published,
 * none taken for a duplicate of the old primary's, in row-state mode and
 * in a stream, here to Redis (whose dedup and order records outlive the
 * switch by 24 h).
 *
 * The same for a database kept on bare job ids, published to NATS (case 8
 * of issue 47): NATS' own dedup key must be unique all the same. And two
 * standbys promoted one after the other on the same timeline (case 2), and
 * one base backup restored twice, each time to timeline 2 (case 3).
 *
 * A primary with a streaming standby (stack.sh postgres-standby, made
 * asynchronous here), cut off from the primary before the second batch of
 * rows; the relay publishes through libpq's multi-host URL with
 * target_session_attrs=read-write, then the primary dies and the standby
 * is promoted.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker_matrix.h"
#include "ha_common.h"
#include "harness.h"
#include "redis_consumer.h"
#include "relay_runner.h"

#define FIRST_ROWS 100   /* published by the old primary and received by the standby */
#define LOST_ROWS 300    /* published by the old primary, never received by the standby */
#define AFTER_ROWS 300   /* committed on the new primary */

struct fixture {
    char *url;
    char database[64];
    char ha_url[512];
    char standby_url[256];
    const char *broker;
    char prefix[64];
    redisContext *redis;
    struct relay_process last; /* the last relay_once's, its log kept until the checks */
    char restored_url[256];    /* a server restored from a backup (pg-restored), the relay's */
};

#define PG_CTL                                                                                     \
    "setpriv --reuid=postgres --regid=postgres --init-groups --"                                   \
    " /usr/lib/postgresql/15/bin/pg_ctl -w -t 60"

/* Runs command (sh) in the stack's directory; fails the test when it fails. */
static void
stack_shell(const char *command)
{
    const char *argv[] = {"sh", "-c", "cd \"$0\" && eval \"$1\"",
                          harness_env("OUTBOX_TEST_STACK_DIR"), command, NULL};
    char *log = harness_log_path("ha-two-standbys");

    if (harness_wait_exit(harness_spawn(argv, log), 120000) != 0)
        fail_msg("'%s' failed (see %s)", command, log);
    free(log);
}

static int
setup(void **state)
{
    static int started;
    const char *const services[] = {"postgres", "postgres-standby", NULL};
    struct fixture *f = calloc(1, sizeof(*f));
    const char *slash;
    char name[64];
    PGconn *conn;

    assert_non_null(f);
    snprintf(name, sizeof(name), "postgres-async-promotion-%d", started++);
    ha_start_servers(name, services);
    f->url = harness_database_new();
    slash = strrchr(f->url, '/');
    assert_non_null(slash);
    snprintf(f->database, sizeof(f->database), "%.*s", (int)strcspn(slash + 1, "?"), slash + 1);
    snprintf(f->ha_url, sizeof(f->ha_url),
             "postgresql://postgres@127.0.0.1:%s,127.0.0.1:%s/%s?target_session_attrs=read-write",
             harness_env("OUTBOX_TEST_PG_PORT"), harness_env("OUTBOX_TEST_PG_STANDBY_PORT"),
             f->database);
    snprintf(f->standby_url, sizeof(f->standby_url), "postgresql://postgres@127.0.0.1:%s/%s",
             harness_env("OUTBOX_TEST_PG_STANDBY_PORT"), f->database);
    /* asynchronous: commits no longer wait for the standby */
    conn = harness_connect(f->url);
    harness_exec(conn, "ALTER SYSTEM SET synchronous_standby_names = ''");
    harness_exec(conn, "SELECT pg_reload_conf()");
    PQfinish(conn);
    f->broker = harness_env("OUTBOX_TEST_REDIS_URL");
    f->redis = stream_consumer_connect(f->broker);
    assert_non_null(f->redis);
    snprintf(f->prefix, sizeof(f->prefix), "ha-async-%d:", (int)getpid());
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    struct fixture *f = *state;
    char tagged[80];

    stream_consumer_delete_prefix(f->redis, f->prefix);
    snprintf(tagged, sizeof(tagged), "{%s", f->prefix);
    stream_consumer_delete_prefix(f->redis, tagged);
    redisFree(f->redis);
    if (f->restored_url[0] != '\0')
        stack_shell(PG_CTL " -D pg-restored -m immediate stop >/dev/null 2>&1 || true");
    if (f->last.log_path[0] != '\0')
        unlink(f->last.log_path);
    free(f->url);
    free(f);
    ha_stop_servers();
    return 0;
}

static void
enqueue(PGconn *conn, const char *queue, int count)
{
    char sql[256];

    snprintf(sql, sizeof(sql),
             "SELECT outbox.enqueue_batch('%s', array_agg(jsonb_build_object('n', g)),"
             " ordering_keys => array_agg('key-' || (g %% 5)))"
             " FROM generate_series(1, %d) AS g",
             queue, count);
    harness_exec(conn, sql);
}

/*
 * Publishes what is publishable now, through the multi-host URL, to broker
 * (NULL: f->broker, Redis) with destination (NULL: --stream-prefix f->prefix).
 */
static void
relay_once_to(struct fixture *f, PGconn *conn, const char *broker, const char *const *destination)
{
    const char *extra[] = {"--once", "--stream-prefix", f->prefix, "--batch-size", "50", NULL};
    struct relay_process relay;

    if (destination != NULL) {
        extra[1] = destination[0];
        extra[2] = destination[1];
    }
    wait_for_value(conn,
                   "SELECT count(*) FROM outbox.job"
                   " WHERE state = 'stream' AND xid >= pg_snapshot_xmin(pg_current_snapshot())",
                   0, 60000);
    if (f->last.log_path[0] != '\0')
        unlink(f->last.log_path);
    relay_start_process(&relay, f->restored_url[0] != '\0' ? f->restored_url : f->ha_url,
                        broker != NULL ? broker : f->broker, extra);
    if (relay_wait(&relay, 120000) != 0) {
        relay_dump_log(&relay);
        fail_msg("the relay did not stop cleanly");
    }
    f->last = relay;
}

static void
relay_once(struct fixture *f, PGconn *conn)
{
    relay_once_to(f, conn, NULL, NULL);
}

/* Cuts the standby off the primary once it has all of it: it receives nothing more. */
static void
standby_cut_off(struct fixture *f, PGconn *primary)
{
    PGconn *standby;

    wait_for_value(primary,
                   "SELECT count(*) FROM pg_stat_replication WHERE replay_lsn < pg_current_wal_lsn()",
                   0, 30000);
    standby = harness_connect(f->standby_url);
    harness_exec(standby, "ALTER SYSTEM SET primary_conninfo = ''");
    harness_exec(standby, "SELECT pg_reload_conf()");
    PQfinish(standby);
    assert_int_equal(wait_for_value(primary, "SELECT count(*) FROM pg_stat_replication", 0, 30000),
                     0);
}

/*
 * Crashes the primary and promotes the standby; its connection, and the
 * time of the switch in switched (size bytes).
 */
static PGconn *
standby_promoted(struct fixture *f, char *switched, size_t size)
{
    const char *const crash[] = {"crash-primary", NULL};
    const char *const promote[] = {"promote-standby", NULL};
    PGconn *promoted;
    PGresult *now;

    ha_stack(crash);
    ha_stack(promote);
    promoted = harness_connect(f->standby_url);
    wait_for_value(promoted, "SELECT pg_is_in_recovery()::int", 0, 30000);
    now = PQexec(promoted, "SELECT clock_timestamp()::text");
    snprintf(switched, size, "%s", PQgetvalue(now, 0, 0));
    PQclear(now);
    return promoted;
}

/*
 * How many of the rows of queue committed on conn's database since
 * (created_at after it) the stream prefix + queue holds, under the message
 * id the database gives them now; *rows receives how many there are.
 */
static long long
published_since(struct fixture *f, PGconn *conn, const char *queue, const char *since,
                long long *rows)
{
    struct stream_consumer_stream stream = {0};
    const char *values[2] = {queue, since};
    char key[160];
    long long found = 0;
    PGresult *result = PQexecParams(conn,
                                    "SELECT i.database_id || ':' || CASE i.id_form"
                                    "  WHEN 'uid' THEN j.message_uid::text"
                                    "  ELSE i.epoch || ':' || j.job_id END"
                                    " FROM outbox.job AS j, outbox.identity AS i"
                                    " WHERE j.queue = $1 AND j.created_at > $2::timestamptz",
                                    2, NULL, values, NULL, NULL, 0);

    assert_int_equal(PQresultStatus(result), PGRES_TUPLES_OK);
    snprintf(key, sizeof(key), "%s%s", f->prefix, queue);
    assert_int_equal(stream_consumer_read_stream(f->redis, key, &stream), 0);
    *rows = PQntuples(result);
    for (int r = 0; r < PQntuples(result); r++) {
        bool seen = false;

        for (size_t e = 0; e < stream.count && !seen; e++)
            seen = stream.entries[e].message_id != NULL &&
                   strcmp(stream.entries[e].message_id, PQgetvalue(result, r, 0)) == 0;
        found += seen;
    }
    PQclear(result);
    stream_consumer_stream_clear(&stream);
    return found;
}

static void
test_rows_committed_after_an_async_promotion_are_published(void **state)
{
    struct fixture *f = *state;
    PGconn *primary = harness_connect(f->url), *promoted;
    char switched[64];
    long long rows, found;

    harness_exec(primary, "SELECT outbox.stream_enable('ev-stream', 2)");
    enqueue(primary, "ev-row", FIRST_ROWS);
    enqueue(primary, "ev-stream", FIRST_ROWS);
    relay_once(f, primary);
    standby_cut_off(f, primary);

    enqueue(primary, "ev-row", LOST_ROWS);
    enqueue(primary, "ev-stream", LOST_ROWS);
    relay_once(f, primary);
    assert_int_equal(harness_query_ll(primary, "SELECT count(*) FROM outbox.job"
                                               " WHERE queue = 'ev-row' AND state = 'succeeded'"),
                     FIRST_ROWS + LOST_ROWS);
    PQfinish(primary);

    promoted = standby_promoted(f, switched, sizeof(switched));
    enqueue(promoted, "ev-row", AFTER_ROWS);
    enqueue(promoted, "ev-stream", AFTER_ROWS);
    {
        char sql[160];

        snprintf(sql, sizeof(sql), "SELECT min(job_id) FROM outbox.job WHERE created_at > '%s'",
                 switched);
        printf("ha: the new primary's job ids start at %lld; the old primary published up to %lld\n",
               harness_query_ll(promoted, sql), (long long)2 * (FIRST_ROWS + LOST_ROWS));
    }
    relay_once(f, promoted);

    found = published_since(f, promoted, "ev-row", switched, &rows);
    printf("ha: row-state: %lld of %lld rows committed after the promotion published\n", found,
           rows);
    if (found != AFTER_ROWS)
        relay_dump_log(&f->last); /* what the relay saw of the new primary */
    assert_int_equal(rows, AFTER_ROWS);
    assert_int_equal(found, AFTER_ROWS);
    found = published_since(f, promoted, "ev-stream", switched, &rows);
    printf("ha: stream: %lld of %lld rows committed after the promotion published\n", found, rows);
    assert_int_equal(rows, AFTER_ROWS);
    assert_int_equal(found, AFTER_ROWS);
    PQfinish(promoted);
}

/*
 * NATS' messages of the stream of prefix: how many, under how many distinct
 * Nats-Msg-Id, and whether every one shows its consumers a bare job id
 * (Outbox-Message-Id, else Nats-Msg-Id).
 */
static size_t
nats_published(nats_consumer *nats, const char *prefix, size_t *distinct, bool *bare)
{
    struct nats_consumer_message *m;
    char name[96];
    size_t count;

    broker_nats_stream_name(prefix, name, sizeof(name));
    assert_int_equal(nats_consumer_read(nats, name, &m, &count), 0);
    *distinct = 0;
    *bare = true;
    for (size_t i = 0; i < count; i++) {
        const char *line = m[i].headers != NULL ? strstr(m[i].headers, "Outbox-Message-Id: ") : NULL;
        const char *id = line != NULL ? line + strlen("Outbox-Message-Id: ") : m[i].msg_id;
        bool seen = false;

        for (size_t j = 0; j < i && !seen; j++)
            seen = m[i].msg_id == NULL || (m[j].msg_id != NULL && strcmp(m[j].msg_id, m[i].msg_id) == 0);
        *distinct += !seen;
        if (id == NULL || strspn(id, "0123456789") == 0 ||
            strcspn(id, "\r\n") != strspn(id, "0123456789"))
            *bare = false;
    }
    nats_consumer_messages_free(m, count);
    return count;
}

/*
 * Case 8 of issue 47: a database kept on the bare job ids of an earlier
 * release (--id-form job), published to NATS, through the same promotion.
 * Its consumers go on seeing bare job ids, but NATS deduplicates on the
 * row's own identity (Nats-Msg-Id): the rows committed on the new primary,
 * under the job ids of the lost ones, are all stored, and the relay warns
 * that the history changed under ids of an earlier form.
 */
static void
test_bare_ids_through_an_async_promotion(void **state)
{
    struct fixture *f = *state;
    const char *nats_url = harness_env("OUTBOX_TEST_NATS_URL");
    const char *destination[] = {"--subject-prefix", f->prefix};
    const char *warning[] = {"database history changed", "id_form=job", NULL};
    PGconn *primary = harness_connect(f->url), *promoted;
    nats_consumer *nats = broker_nats_stream_open(nats_url, f->prefix);
    char switched[64];
    size_t count, distinct;
    bool bare;

    harness_exec(primary, "SELECT outbox.identity_set(NULL, 'job')");
    enqueue(primary, "ev-row", FIRST_ROWS);
    relay_once_to(f, primary, nats_url, destination);
    standby_cut_off(f, primary);
    enqueue(primary, "ev-row", LOST_ROWS);
    relay_once_to(f, primary, nats_url, destination);
    PQfinish(primary);
    promoted = standby_promoted(f, switched, sizeof(switched));
    enqueue(promoted, "ev-row", AFTER_ROWS);
    relay_once_to(f, promoted, nats_url, destination);
    PQfinish(promoted);

    count = nats_published(nats, f->prefix, &distinct, &bare);
    printf("ha: bare ids to NATS: %zu messages under %zu Nats-Msg-Ids, %d expected\n", count,
           distinct, FIRST_ROWS + LOST_ROWS + AFTER_ROWS);
    broker_nats_stream_close(nats, f->prefix);
    if (count != FIRST_ROWS + LOST_ROWS + AFTER_ROWS || distinct != count)
        relay_dump_log(&f->last);
    assert_int_equal(count, FIRST_ROWS + LOST_ROWS + AFTER_ROWS);
    assert_int_equal(distinct, count);
    assert_true(bare); /* what consumers see is the form they know */
    if (relay_log_find(&f->last, 0, false, warning, NULL, 0) < 0) {
        relay_dump_log(&f->last);
        fail_msg("the relay logged no warning of the history change");
    }
}

/* Enqueues count rows of queue whose payload names tag. */
static void
enqueue_tagged(PGconn *conn, const char *queue, const char *tag, int count)
{
    char sql[256];

    snprintf(sql, sizeof(sql),
             "SELECT count(outbox.enqueue('%s', jsonb_build_object('tag', '%s', 'n', g)))"
             " FROM generate_series(1, %d) AS g",
             queue, tag, count);
    harness_exec(conn, sql);
}

/* How many entries of the stream prefix + queue hold rows tagged tag. */
static long long
tagged_entries(struct fixture *f, const char *queue, const char *tag)
{
    struct stream_consumer_stream stream = {0};
    char key[160], needle[64];
    long long found = 0;

    snprintf(key, sizeof(key), "%s%s", f->prefix, queue);
    snprintf(needle, sizeof(needle), "\"tag\": \"%s\"", tag);
    assert_int_equal(stream_consumer_read_stream(f->redis, key, &stream), 0);
    for (size_t e = 0; e < stream.count; e++)
        found += stream.entries[e].payload != NULL && strstr(stream.entries[e].payload, needle);
    stream_consumer_stream_clear(&stream);
    return found;
}

/* Promotes the standby, commits AFTER_ROWS rows tagged tag there and publishes them. */
static void
promote_and_publish(struct fixture *f, const char *tag)
{
    const char *const promote[] = {"promote-standby", NULL};
    PGconn *promoted;

    ha_stack(promote);
    promoted = harness_connect(f->standby_url);
    wait_for_value(promoted, "SELECT pg_is_in_recovery()::int", 0, 30000);
    enqueue_tagged(promoted, "ev-row", tag, AFTER_ROWS);
    relay_once(f, promoted);
    PQfinish(promoted);
}

/*
 * Case 2 of issue 47: two asynchronous standbys of one primary, both cut
 * off at the same point. The first is promoted, publishes, and dies; the
 * second, which never followed the first, is promoted in its place: both
 * are on timeline 2, both hand out the same job ids. Every row committed on
 * the second reaches Redis. (The second standby is a copy of the first's
 * data directory, taken while both stood at the same point.)
 */
static void
test_two_standbys_promoted_one_after_the_other(void **state)
{
    struct fixture *f = *state;
    const char *const crash[] = {"crash-primary", NULL};
    PGconn *primary = harness_connect(f->url);

    enqueue_tagged(primary, "ev-row", "first", FIRST_ROWS);
    relay_once(f, primary);
    standby_cut_off(f, primary);
    enqueue_tagged(primary, "ev-row", "lost", LOST_ROWS);
    relay_once(f, primary);
    PQfinish(primary);
    ha_stack(crash);
    stack_shell(PG_CTL " -D pg-standby -m fast stop && cp -a pg-standby pg-standby.second"
                " && " PG_CTL " -D pg-standby -l pg-standby.log start");

    promote_and_publish(f, "s1");
    stack_shell(PG_CTL " -D pg-standby -m immediate stop && rm -rf pg-standby"
                " && mv pg-standby.second pg-standby"
                " && " PG_CTL " -D pg-standby -l pg-standby.log start");

    promote_and_publish(f, "s2");
    printf("ha: two standbys: first %lld, lost %lld, s1 %lld, s2 %lld of %d, %d, %d, %d\n",
           tagged_entries(f, "ev-row", "first"), tagged_entries(f, "ev-row", "lost"),
           tagged_entries(f, "ev-row", "s1"), tagged_entries(f, "ev-row", "s2"), FIRST_ROWS,
           LOST_ROWS, AFTER_ROWS, AFTER_ROWS);
    if (tagged_entries(f, "ev-row", "s2") != AFTER_ROWS)
        relay_dump_log(&f->last);
    assert_int_equal(tagged_entries(f, "ev-row", "s1"), AFTER_ROWS);
    assert_int_equal(tagged_entries(f, "ev-row", "s2"), AFTER_ROWS);
}

/*
 * Restores the base backup in pg-backup into pg-restored (whatever was
 * there goes) and starts it on a port of its own, in recovery with an
 * archive of its own (empty): it replays what the backup holds, ends
 * recovery and takes the next timeline. f->restored_url becomes the
 * relay's; the connection to it is returned.
 */
static PGconn *
restore_backup(struct fixture *f)
{
    char command[1024];
    int port = harness_free_port();
    PGconn *restored;

    snprintf(command, sizeof(command),
             PG_CTL " -D pg-restored -m immediate stop >/dev/null 2>&1; rm -rf pg-restored"
             " && cp -a pg-backup pg-restored && touch pg-restored/recovery.signal"
             " && echo \"restore_command = '/bin/false'\" >>pg-restored/postgresql.auto.conf"
             " && " PG_CTL " -D pg-restored -l pg-restored/restored.log -o '-p %d' start",
             port);
    stack_shell(command);
    snprintf(f->restored_url, sizeof(f->restored_url), "postgresql://postgres@127.0.0.1:%d/%s",
             port, f->database);
    restored = harness_connect(f->restored_url);
    wait_for_value(restored, "SELECT pg_is_in_recovery()::int", 0, 60000);
    return restored;
}

/*
 * Case 3 of issue 47: point-in-time recovery twice from one base backup,
 * each restore with an archive of its own. The first restore publishes
 * rows and is given up; the second, on the same timeline (2) with the same
 * system identifier, hands out the same job ids. Every row committed on
 * the second reaches Redis.
 */
static void
test_backup_restored_twice(void **state)
{
    struct fixture *f = *state;
    PGconn *primary = harness_connect(f->url), *restored;
    char command[512];

    enqueue_tagged(primary, "ev-row", "first", FIRST_ROWS);
    relay_once(f, primary);
    PQfinish(primary);
    snprintf(command, sizeof(command),
             "rm -rf pg-backup && mkdir -m 0700 pg-backup && chown postgres: pg-backup"
             " && setpriv --reuid=postgres --regid=postgres --init-groups --"
             " /usr/lib/postgresql/15/bin/pg_basebackup -h 127.0.0.1 -p %s -U postgres"
             " -D pg-backup -X stream -c fast",
             harness_env("OUTBOX_TEST_PG_PORT"));
    stack_shell(command);

    restored = restore_backup(f);
    enqueue_tagged(restored, "ev-row", "r1", AFTER_ROWS);
    relay_once(f, restored);
    PQfinish(restored);
    restored = restore_backup(f); /* the first restore given up, the backup restored again */
    enqueue_tagged(restored, "ev-row", "r2", AFTER_ROWS);
    relay_once(f, restored);
    printf("ha: backup restored twice: first %lld, r1 %lld, r2 %lld of %d, %d, %d (timeline %lld)\n",
           tagged_entries(f, "ev-row", "first"), tagged_entries(f, "ev-row", "r1"),
           tagged_entries(f, "ev-row", "r2"), FIRST_ROWS, AFTER_ROWS, AFTER_ROWS,
           harness_query_ll(restored, "SELECT outbox.current_timeline()"));
    PQfinish(restored);
    if (tagged_entries(f, "ev-row", "r2") != AFTER_ROWS)
        relay_dump_log(&f->last);
    assert_int_equal(tagged_entries(f, "ev-row", "r1"), AFTER_ROWS);
    assert_int_equal(tagged_entries(f, "ev-row", "r2"), AFTER_ROWS);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_rows_committed_after_an_async_promotion_are_published,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_bare_ids_through_an_async_promotion, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_two_standbys_promoted_one_after_the_other, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_backup_restored_twice, setup, teardown),
    };

    if (getenv("OUTBOX_TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("OUTBOX_TEST_FILTER"));
    return cmocka_run_group_tests_name("ha_async_promotion", tests, NULL, NULL);
}
