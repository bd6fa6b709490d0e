/*
 * test_outboxctl.c - the outboxctl command line against a real PostgreSQL.
 *
 * Needs OUTBOX_TEST_PG_URL (a libpq URL of the "postgres" database of a
 * throwaway server) and OUTBOX_BIN (the directory holding outboxctl, default
 * "bin"). Each test creates its own database and drops it afterwards. With
 * OUTBOX_VALGRIND set, outboxctl runs under that command.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "harness.h"
#include "migrate.h"
#include "outbox.h"

#define MAX_ARGS 32
#define SECRET "Sup3rSecretPw"

/* One test's own database. */
struct testdb {
    char name[64];
    char *url;
    PGconn *conn;
};

/* What one outboxctl run printed and how it ended. */
struct ctl_run {
    int status; /* exit code, or 128 + signal */
    char *out;
    char *err;
};

/* A started outboxctl whose output goes to two temporary files. */
struct ctl_process {
    pid_t pid;
    char out_path[64];
    char err_path[64];
};

static const char *
base_url(void)
{
    const char *url = getenv("OUTBOX_TEST_PG_URL");

    return url != NULL && url[0] != '\0' ? url : NULL;
}

/* The URL of database name on the server of OUTBOX_TEST_PG_URL (malloc'd). */
static char *
url_for_database(const char *name)
{
    const char *base = base_url();
    const char *scheme = strstr(base, "://");
    char *url = NULL;

    if (scheme == NULL) {
        /* conninfo: a later dbname wins */
        assert_true(asprintf(&url, "%s dbname=%s", base, name) > 0);
        return url;
    }
    {
        const char *authority = scheme + 3;
        const char *path = authority + strcspn(authority, "/?");
        const char *query = path + strcspn(path, "?");

        assert_true(asprintf(&url, "%.*s/%s%s", (int)(path - base), base, name, query) > 0);
    }
    return url;
}

/* Drops NOTICEs such as "database ... does not exist, skipping". */
static void
quiet_notice(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

static PGconn *
connect_ok(const char *url)
{
    PGconn *conn = PQconnectdb(url);

    if (PQstatus(conn) != CONNECTION_OK)
        fail_msg("cannot connect to the test server: %s", PQerrorMessage(conn));
    PQsetNoticeProcessor(conn, quiet_notice, NULL);
    return conn;
}

/* Runs sql, which must succeed; returns the result (caller clears). */
static PGresult *
query(PGconn *conn, const char *sql)
{
    PGresult *result = PQexec(conn, sql);
    ExecStatusType status = PQresultStatus(result);

    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK)
        fail_msg("%s: %s", sql, PQerrorMessage(conn));
    return result;
}

static void
exec_ok(PGconn *conn, const char *sql)
{
    PQclear(query(conn, sql));
}

/* The single value sql returns, as a malloc'd string ("" for NULL). */
static char *
query_value(PGconn *conn, const char *sql)
{
    PGresult *result = query(conn, sql);
    char *value;

    assert_int_equal(PQntuples(result), 1);
    value = strdup(PQgetvalue(result, 0, 0));
    PQclear(result);
    assert_non_null(value);
    return value;
}

static long long
query_number(PGconn *conn, const char *sql)
{
    char *value = query_value(conn, sql);
    long long number = strtoll(value, NULL, 10);

    free(value);
    return number;
}

/* Creates a fresh database for one test. */
static int
setup_database(void **state)
{
    static int counter;
    struct testdb *db;
    PGconn *admin;
    char sql[128];

    if (base_url() == NULL)
        return 0; /* the tests skip themselves */
    db = calloc(1, sizeof(*db));
    assert_non_null(db);
    snprintf(db->name, sizeof(db->name), "outboxctl_test_%d_%d", (int)getpid(), ++counter);
    admin = connect_ok(base_url());
    snprintf(sql, sizeof(sql), "CREATE DATABASE %s", db->name);
    exec_ok(admin, sql);
    PQfinish(admin);
    db->url = url_for_database(db->name);
    db->conn = connect_ok(db->url);
    *state = db;
    return 0;
}

static int
teardown_database(void **state)
{
    struct testdb *db = *state;
    PGconn *admin;
    char sql[128];

    if (db == NULL)
        return 0;
    PQfinish(db->conn);
    admin = connect_ok(base_url());
    snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS %s WITH (FORCE)", db->name);
    exec_ok(admin, sql);
    PQfinish(admin);
    free(db->url);
    free(db);
    *state = NULL;
    return 0;
}

static struct testdb *
test_database(void **state)
{
    if (base_url() == NULL) {
        print_message("OUTBOX_TEST_PG_URL is not set: skipping\n");
        skip();
    }
    return *state;
}

/* Reads a whole file into a malloc'd string. */
static char *
read_file(const char *path)
{
    FILE *file = fopen(path, "r");
    char *text = NULL;
    size_t size = 0;

    assert_non_null(file);
    {
        FILE *memory = open_memstream(&text, &size);
        char buf[4096];
        size_t n;

        assert_non_null(memory);
        while ((n = fread(buf, 1, sizeof(buf), file)) > 0)
            fwrite(buf, 1, n, memory);
        fclose(memory);
    }
    fclose(file);
    return text;
}

/*
 * Starts outboxctl with args (NULL-terminated). env_url becomes
 * OUTBOX_DATABASE_URL, which is unset when env_url is NULL.
 */
static void
start_ctl(struct ctl_process *process, const char *env_url, const char *const *args)
{
    const char *bin = getenv("OUTBOX_BIN");
    const char *valgrind = getenv("OUTBOX_VALGRIND");
    char program[512];
    char *argv[MAX_ARGS + 16];
    char *wrapper = NULL;
    int argc = 0, out_fd, err_fd;

    snprintf(program, sizeof(program), "%s/outboxctl", bin != NULL && bin[0] ? bin : "bin");
    if (valgrind != NULL && valgrind[0] != '\0') {
        wrapper = strdup(valgrind);
        assert_non_null(wrapper);
        for (char *word = strtok(wrapper, " "); word != NULL && argc < 16; word = strtok(NULL, " "))
            argv[argc++] = word;
    }
    argv[argc++] = program;
    for (size_t i = 0; i < MAX_ARGS && args[i] != NULL; i++)
        argv[argc++] = (char *)args[i];
    argv[argc] = NULL;

    snprintf(process->out_path, sizeof(process->out_path), "/tmp/outboxctl-out-XXXXXX");
    snprintf(process->err_path, sizeof(process->err_path), "/tmp/outboxctl-err-XXXXXX");
    out_fd = mkstemp(process->out_path);
    err_fd = mkstemp(process->err_path);
    assert_true(out_fd >= 0 && err_fd >= 0);

    fflush(NULL);
    process->pid = fork();
    assert_true(process->pid >= 0);
    if (process->pid == 0) {
        int null_fd = open("/dev/null", O_RDONLY);

        if (env_url != NULL)
            setenv("OUTBOX_DATABASE_URL", env_url, 1);
        else
            unsetenv("OUTBOX_DATABASE_URL");
        dup2(null_fd, 0);
        dup2(out_fd, 1);
        dup2(err_fd, 2);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(out_fd);
    close(err_fd);
    free(wrapper);
}

/* Waits for a started outboxctl and collects what it printed. */
static void
finish_ctl(struct ctl_process *process, struct ctl_run *run)
{
    int status = 0;

    assert_int_equal(waitpid(process->pid, &status, 0), process->pid);
    run->status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    run->out = read_file(process->out_path);
    run->err = read_file(process->err_path);
    unlink(process->out_path);
    unlink(process->err_path);
}

/* Runs outboxctl to the end: args after the program name, NULL-terminated. */
static void
run_ctl(struct ctl_run *run, const char *env_url, const char *const *args)
{
    struct ctl_process process = {0};

    start_ctl(&process, env_url, args);
    finish_ctl(&process, run);
}

/* RUN_CTL(&run, env_url, "arg", ...) runs outboxctl with those arguments. */
#define RUN_CTL(run, env_url, ...)                                                                 \
    run_ctl((run), (env_url), (const char *const[]){__VA_ARGS__, NULL})

static void
run_clear(struct ctl_run *run)
{
    free(run->out);
    free(run->err);
    run->out = run->err = NULL;
}

/* Asserts a run exited with want, showing its stderr when it did not. */
static void
assert_exit(const struct ctl_run *run, int want)
{
    if (run->status != want)
        fail_msg("outboxctl exited %d, want %d; stderr: %s; stdout: %s", run->status, want,
                 run->err, run->out);
}

static int
count_lines(const char *text)
{
    int lines = 0;

    for (; *text != '\0'; text++)
        lines += *text == '\n';
    return lines;
}

static void
migrate_ok(struct testdb *db)
{
    struct ctl_run run;

    RUN_CTL(&run, NULL, "--database-url", db->url, "migrate");
    assert_exit(&run, 0);
    run_clear(&run);
}

/* ---- migrate ----------------------------------------------------------- */

static void
test_migrate_creates_schema(void **state)
{
    struct testdb *db = test_database(state);
    struct ctl_run run;
    char *names;

    RUN_CTL(&run, NULL, "--database-url", db->url, "migrate");
    assert_exit(&run, 0);
    assert_non_null(strstr(run.out, "applied"));
    run_clear(&run);

    assert_int_equal(query_number(db->conn, "SELECT count(*) FROM outbox.schema_migrations"),
                     (long long)migrate_file_count);
    names = query_value(db->conn, "SELECT string_agg(name, ',' ORDER BY version) "
                                  "FROM outbox.schema_migrations");
    assert_non_null(strstr(names, migrate_files[0].name));
    free(names);
    assert_int_equal(query_number(db->conn, "SELECT (to_regclass('outbox.job') IS NOT NULL)::int"),
                     1);
    assert_int_equal(
        query_number(db->conn,
                     "SELECT (to_regprocedure('outbox.enqueue(text, jsonb, text, jsonb, integer, "
                     "timestamptz, integer, text, text, text)') IS NOT NULL)::int"),
        1);
    /* the schema works: enqueue returns an id */
    assert_true(query_number(db->conn, "SELECT outbox.enqueue('q', '{}')") > 0);
}

/*
 * Migration 003 on a database that already holds rows: a ready row with an
 * array header value, which the stricter check would refuse at its next
 * claim (failing its whole batch), is dead with the reason; everything else
 * is as it was, an infinite run_at included, and status still answers.
 */
static void
test_migrate_003_on_existing_rows(void **state)
{
    struct testdb *db = test_database(state);
    struct ctl_run run;

    exec_ok(db->conn, "CREATE SCHEMA outbox;"
                      " CREATE TABLE outbox.schema_migrations (version integer PRIMARY KEY,"
                      "  name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())");
    for (size_t i = 0; i < migrate_file_count && migrate_files[i].version <= 2; i++) {
        char sql[256];

        exec_ok(db->conn, migrate_files[i].sql);
        snprintf(sql, sizeof(sql), "INSERT INTO outbox.schema_migrations (version, name)"
                                   " VALUES (%d, '%s')",
                 migrate_files[i].version, migrate_files[i].name);
        exec_ok(db->conn, sql);
    }
    exec_ok(db->conn, "INSERT INTO outbox.job (queue, payload, headers, state, attempts,"
                      "                        finished_at, run_at) VALUES"
                      " ('a', '{}', '{\"a\": [\"x\"]}', 'ready', 0, NULL, now()),"
                      " ('a', '{}', '{\"a\": \"x\"}', 'ready', 0, NULL, now()),"
                      " ('a', '{}', '{\"a\": []}', 'dead', 1, now(), now()),"
                      " ('b', '{}', '{}', 'ready', 0, NULL, '-infinity')");

    RUN_CTL(&run, NULL, "--database-url", db->url, "migrate");
    assert_exit(&run, 0);
    run_clear(&run);
    assert_int_equal(query_number(db->conn, "SELECT count(*) FROM outbox.job WHERE state = 'dead'"
                                            " AND headers = '{\"a\": [\"x\"]}'"
                                            " AND last_error LIKE 'headers must be%'"),
                     1);
    assert_int_equal(query_number(db->conn, "SELECT count(*) FROM outbox.job WHERE state = 'ready'"),
                     2);
    assert_int_equal(query_number(db->conn, "SELECT count(*) FROM outbox.job WHERE state = 'dead'"
                                            " AND last_error IS NULL"),
                     1);
    RUN_CTL(&run, NULL, "--database-url", db->url, "status", "--json");
    assert_exit(&run, 0);
    run_clear(&run);
}

static void
test_migrate_again_applies_nothing(void **state)
{
    struct testdb *db = test_database(state);
    struct ctl_run run;
    char *before, *after;

    migrate_ok(db);
    before = query_value(db->conn, "SELECT string_agg(version || '@' || applied_at, ',') "
                                   "FROM outbox.schema_migrations");
    RUN_CTL(&run, NULL, "--database-url", db->url, "migrate");
    assert_exit(&run, 0);
    assert_non_null(strstr(run.out, "up to date"));
    run_clear(&run);
    after = query_value(db->conn, "SELECT string_agg(version || '@' || applied_at, ',') "
                                  "FROM outbox.schema_migrations");
    assert_string_equal(before, after);
    free(before);
    free(after);
}

static void
test_concurrent_migrate(void **state)
{
    struct testdb *db = test_database(state);
    const char *args[] = {"--database-url", db->url, "migrate", NULL};
    struct ctl_process processes[4] = {{0}};
    int appliers = 0;

    for (int i = 0; i < 4; i++)
        start_ctl(&processes[i], NULL, args);
    for (int i = 0; i < 4; i++) {
        struct ctl_run run;

        finish_ctl(&processes[i], &run);
        assert_exit(&run, 0);
        appliers += strstr(run.out, "applied") != NULL;
        run_clear(&run);
    }
    assert_int_equal(appliers, 1);
    assert_int_equal(query_number(db->conn, "SELECT count(*) FROM outbox.schema_migrations"),
                     (long long)migrate_file_count);
    /* the lock was released by every process */
    assert_int_equal(query_number(db->conn, "SELECT count(*) FROM pg_locks "
                                            "WHERE locktype = 'advisory'"),
                     0);
}

static void
test_status_without_schema(void **state)
{
    struct testdb *db = test_database(state);
    struct ctl_run run;

    RUN_CTL(&run, NULL, "--database-url", db->url, "status");
    assert_exit(&run, 1);
    assert_string_equal(run.err, "outboxctl: outbox schema not found: run 'outboxctl migrate'\n");
    run_clear(&run);
}

/* ---- status ------------------------------------------------------------ */

/* Known rows: queue a 2 ready, 1 running, 3 succeeded, 1 dead; b 1 ready, 1 dead. */
static void
insert_known_rows(PGconn *conn)
{
    exec_ok(conn,
            "INSERT INTO outbox.job (queue, payload, state, attempts, worker_id, lease_until,"
            "                        finished_at, last_error, run_at) VALUES"
            " ('a', '{}', 'ready', 0, NULL, NULL, NULL, NULL, now()),"
            " ('a', '{}', 'ready', 0, NULL, NULL, NULL, NULL, now() + interval '1 hour'),"
            " ('a', '{}', 'running', 1, 'w1', now() + interval '1 minute', NULL, NULL, now()),"
            " ('a', '{}', 'succeeded', 1, NULL, NULL, now(), NULL, now()),"
            " ('a', '{}', 'succeeded', 1, NULL, NULL, now(), NULL, now()),"
            " ('a', '{}', 'succeeded', 1, NULL, NULL, now(), NULL, now()),"
            " ('a', '{}', 'dead', 10, NULL, NULL, now(), 'boom', now()),"
            " ('b', '{}', 'ready', 0, NULL, NULL, NULL, NULL, now() - interval '100 seconds'),"
            " ('b', '{}', 'dead', 10, NULL, NULL, now(), 'bang', now())");
}

static void
test_status_json_counts(void **state)
{
    struct testdb *db = test_database(state);
    const char *params[1];
    struct ctl_run run;
    PGresult *result;
    PGconn *holder;

    migrate_ok(db);
    insert_known_rows(db->conn);

    /* a session holding back the xmin horizon, with a name that needs escaping */
    holder = connect_ok(db->url);
    exec_ok(holder, "SET application_name = 'we\"ird\\app'");
    exec_ok(holder, "BEGIN ISOLATION LEVEL REPEATABLE READ");
    exec_ok(holder, "SELECT count(*) FROM outbox.job");

    RUN_CTL(&run, NULL, "--database-url", db->url, "status", "--json");
    assert_exit(&run, 0);
    params[0] = run.out;
    result = PQexecParams(db->conn,
                          "SELECT q->>'queue', q->>'ready', q->>'running', q->>'succeeded',"
                          "       q->>'dead', (q->>'oldest_ready_age_seconds')::float8 >= 100,"
                          "       $1::jsonb->'oldest_transaction'->>'application_name',"
                          "       ($1::jsonb->>'schema_version')::int,"
                          "       ($1::jsonb->'table'->>'table_bytes')::bigint > 0"
                          "  FROM jsonb_array_elements($1::jsonb->'queues') AS q"
                          " ORDER BY 1",
                          1, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(result) != PGRES_TUPLES_OK)
        fail_msg("status --json is not the expected JSON: %s\n%s", PQerrorMessage(db->conn),
                 run.out);
    assert_int_equal(PQntuples(result), 2);
    assert_string_equal(PQgetvalue(result, 0, 0), "a");
    assert_string_equal(PQgetvalue(result, 0, 1), "2");
    assert_string_equal(PQgetvalue(result, 0, 2), "1");
    assert_string_equal(PQgetvalue(result, 0, 3), "3");
    assert_string_equal(PQgetvalue(result, 0, 4), "1");
    assert_string_equal(PQgetvalue(result, 1, 0), "b");
    assert_string_equal(PQgetvalue(result, 1, 1), "1");
    assert_string_equal(PQgetvalue(result, 1, 2), "0");
    assert_string_equal(PQgetvalue(result, 1, 3), "0");
    assert_string_equal(PQgetvalue(result, 1, 4), "1");
    assert_string_equal(PQgetvalue(result, 1, 5), "t");
    assert_string_equal(PQgetvalue(result, 0, 6), "we\"ird\\app");
    assert_int_equal(atoi(PQgetvalue(result, 0, 7)), migrate_files[migrate_file_count - 1].version);
    assert_string_equal(PQgetvalue(result, 0, 8), "t");
    PQclear(result);
    run_clear(&run);

    /* the table form shows the same queues */
    RUN_CTL(&run, NULL, "--database-url", db->url, "status");
    assert_exit(&run, 0);
    assert_non_null(strstr(run.out, "QUEUE"));
    assert_non_null(strstr(run.out, "\na "));
    assert_non_null(strstr(run.out, "\nb "));
    run_clear(&run);

    exec_ok(holder, "ROLLBACK");
    PQfinish(holder);
}

/* The oldest transaction `status --json` names: its application name, "" for none. */
static void
oldest_transaction_name(struct testdb *db, char *name, size_t size)
{
    const char *params[1];
    struct ctl_run run;
    PGresult *result;

    RUN_CTL(&run, NULL, "--database-url", db->url, "status", "--json");
    assert_exit(&run, 0);
    params[0] = run.out;
    result = PQexecParams(db->conn,
                          "SELECT coalesce($1::jsonb->'oldest_transaction'->>'application_name',"
                          "                '')",
                          1, NULL, params, NULL, NULL, 0);
    assert_int_equal(PQresultStatus(result), PGRES_TUPLES_OK);
    snprintf(name, size, "%s", PQgetvalue(result, 0, 0));
    PQclear(result);
    run_clear(&run);
}

/*
 * A list relay's statistics watch reads pg_stat_database ten times a second,
 * each look a short transaction of its own: status does not name it as the
 * oldest transaction (an operator chasing what holds vacuum back was sent
 * to the relay). A session under a watch's name whose transaction outlives
 * a look's deadline (2 s) is no look, and is named.
 */
static void
test_status_leaves_the_watchs_look_out(void **state)
{
    struct testdb *db = test_database(state);
    PGconn *look = connect_ok(db->url);
    char name[128];

    migrate_ok(db);
    exec_ok(look, "SET application_name = 'outbox-relay watch 5f5dcae0-739b'");
    exec_ok(look, "BEGIN ISOLATION LEVEL REPEATABLE READ");
    exec_ok(look, "SELECT count(*) FROM pg_stat_database");
    oldest_transaction_name(db, name, sizeof(name));
    assert_string_equal(name, "");
    usleep(2500 * 1000);
    oldest_transaction_name(db, name, sizeof(name));
    assert_string_equal(name, "outbox-relay watch 5f5dcae0-739b");
    exec_ok(look, "ROLLBACK");
    PQfinish(look);
}

/*
 * Succeeded rows against the retention; a row that finished at -infinity
 * (PostgreSQL refuses to subtract it) reads as the largest age instead of
 * failing status.
 */
static void
test_status_retention_and_infinite_times(void **state)
{
    struct testdb *db = test_database(state);
    const char *params[1];
    struct ctl_run run;
    PGresult *result;

    migrate_ok(db);
    exec_ok(db->conn,
            "INSERT INTO outbox.job (queue, payload, state, attempts, finished_at) VALUES"
            " ('a', '{}', 'succeeded', 1, '-infinity'),"
            " ('a', '{}', 'succeeded', 1, now() - interval '2 hours'),"
            " ('a', '{}', 'succeeded', 1, now() - interval '10 minutes')");

    RUN_CTL(&run, NULL, "--database-url", db->url, "status", "--json", "--retention", "1h");
    assert_exit(&run, 0);
    params[0] = run.out;
    result = PQexecParams(db->conn,
                          "SELECT t->>'retention_seconds', t->>'succeeded_rows',"
                          "       t->>'succeeded_past_retention_rows',"
                          "       (t->>'oldest_succeeded_past_retention_seconds')::float8 >= 1e8"
                          "  FROM (SELECT $1::jsonb->'table' AS t) AS s",
                          1, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(result) != PGRES_TUPLES_OK)
        fail_msg("status --json is not the expected JSON: %s\n%s", PQerrorMessage(db->conn),
                 run.out);
    assert_string_equal(PQgetvalue(result, 0, 0), "3600");
    assert_string_equal(PQgetvalue(result, 0, 1), "3");
    assert_string_equal(PQgetvalue(result, 0, 2), "2");
    assert_string_equal(PQgetvalue(result, 0, 3), "t");
    PQclear(result);
    run_clear(&run);

    /* the text form says the same; the default retention comes from $OUTBOX_RETENTION */
    setenv("OUTBOX_RETENTION", "3h", 1);
    RUN_CTL(&run, NULL, "--database-url", db->url, "status");
    unsetenv("OUTBOX_RETENTION");
    assert_exit(&run, 0);
    assert_non_null(strstr(run.out, "3, of them 1 past the retention of 10800s"));
    run_clear(&run);

    RUN_CTL(&run, NULL, "--database-url", db->url, "status", "--retention", "soon");
    assert_exit(&run, 2);
    assert_non_null(strstr(run.err, "--retention"));
    run_clear(&run);
}

/*
 * Keys held up by their head: k-dead (dead head, two rows behind it),
 * k-retry (head failed once, retry in an hour), k-running (head on its
 * second attempt now); k-fine and k-done are not blocked (a first attempt
 * running, only succeeded rows), nor are rows without a key. Queue 'many'
 * has 25 keys with a dead head, more than status lists.
 */
static void
insert_blocked_keys(PGconn *conn)
{
    exec_ok(conn,
            "INSERT INTO outbox.job (queue, payload, ordering_key, state, attempts, worker_id,"
            "                        lease_until, finished_at, last_error, run_at) VALUES"
            " ('a', '{}', 'k-done', 'succeeded', 1, NULL, NULL, now(), 'old', now()),"
            " ('a', '{}', 'k-dead', 'dead', 10, NULL, NULL, now(), 'WRONGTYPE wrong kind', now()),"
            " ('a', '{}', 'k-dead', 'ready', 0, NULL, NULL, NULL, NULL, now()),"
            " ('a', '{}', 'k-dead', 'ready', 0, NULL, NULL, NULL, NULL, now()),"
            " ('a', '{}', 'k-retry', 'ready', 1, NULL, NULL, NULL, 'nack',"
            "  now() + interval '1 hour'),"
            " ('a', '{}', 'k-retry', 'ready', 0, NULL, NULL, NULL, NULL, now()),"
            " ('a', '{}', 'k-running', 'running', 2, 'w1', now() + interval '1 minute', NULL,"
            "  'lease expired', now()),"
            " ('a', '{}', 'k-fine', 'running', 1, 'w1', now() + interval '1 minute', NULL, NULL,"
            "  now()),"
            " ('a', '{}', 'k-fine', 'ready', 0, NULL, NULL, NULL, NULL, now()),"
            " ('a', '{}', NULL, 'dead', 3, NULL, NULL, now(), 'no key', now()),"
            " ('a', '{}', 'k-dead', 'dead', 10, NULL, NULL, now(), 'later dead', now())");
    exec_ok(conn, "INSERT INTO outbox.job (queue, payload, ordering_key, state, attempts,"
                  "                        finished_at, last_error)"
                  " SELECT 'many', '{}', 'key-' || g, 'dead', 1, now(), 'gone'"
                  "   FROM generate_series(1, 25) AS g");
}

static void
test_status_shows_blocked_keys(void **state)
{
    struct testdb *db = test_database(state);
    const char *params[1];
    struct ctl_run run;
    PGresult *result;

    migrate_ok(db);
    insert_blocked_keys(db->conn);

    RUN_CTL(&run, NULL, "--database-url", db->url, "status", "--json");
    assert_exit(&run, 0);
    params[0] = run.out;
    result = PQexecParams(db->conn,
                          "SELECT q->>'queue', (q->>'blocked_keys')::int,"
                          "       jsonb_array_length(q->'blocked'),"
                          "       b->>'ordering_key', b->>'head_state', b->>'last_error',"
                          "       (b->>'waiting')::int, (b->>'attempts')::int,"
                          "       (b->>'head_job_id')::bigint = (SELECT min(job_id) FROM outbox.job"
                          "                                        WHERE queue = 'a'"
                          "                                          AND ordering_key = b->>'ordering_key'"
                          "                                          AND state <> 'succeeded'),"
                          "       (b->>'retry_in_seconds')::float8 > 3000"
                          "  FROM jsonb_array_elements($1::jsonb->'queues') AS q,"
                          "       jsonb_array_elements(q->'blocked') WITH ORDINALITY AS e(b, n)"
                          " WHERE q->>'queue' = 'a'"
                          " ORDER BY n",
                          1, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(result) != PGRES_TUPLES_OK)
        fail_msg("status --json is not the expected JSON: %s\n%s", PQerrorMessage(db->conn),
                 run.out);
    /* oldest head first: k-dead, k-retry, k-running */
    assert_int_equal(PQntuples(result), 3);
    assert_int_equal(atoi(PQgetvalue(result, 0, 1)), 3);
    assert_int_equal(atoi(PQgetvalue(result, 0, 2)), 3);
    assert_string_equal(PQgetvalue(result, 0, 3), "k-dead");
    assert_string_equal(PQgetvalue(result, 0, 4), "dead");
    assert_string_equal(PQgetvalue(result, 0, 5), "WRONGTYPE wrong kind");
    assert_int_equal(atoi(PQgetvalue(result, 0, 6)), 2); /* ready rows behind it, not the dead one */
    assert_int_equal(atoi(PQgetvalue(result, 0, 7)), 10);
    assert_string_equal(PQgetvalue(result, 1, 3), "k-retry");
    assert_string_equal(PQgetvalue(result, 1, 4), "ready");
    assert_string_equal(PQgetvalue(result, 1, 5), "nack");
    assert_int_equal(atoi(PQgetvalue(result, 1, 6)), 1);
    assert_string_equal(PQgetvalue(result, 1, 9), "t");
    assert_string_equal(PQgetvalue(result, 2, 3), "k-running");
    assert_string_equal(PQgetvalue(result, 2, 4), "running");
    assert_string_equal(PQgetvalue(result, 2, 5), "lease expired");
    for (int row = 0; row < 3; row++)
        assert_string_equal(PQgetvalue(result, row, 8), "t");
    PQclear(result);

    /* a queue with more blocked keys than are listed: all counted, the oldest 20 shown */
    result = PQexecParams(db->conn,
                          "SELECT (q->>'blocked_keys')::int, jsonb_array_length(q->'blocked'),"
                          "       q->'blocked'->0->>'ordering_key'"
                          "  FROM jsonb_array_elements($1::jsonb->'queues') AS q"
                          " WHERE q->>'queue' = 'many'",
                          1, NULL, params, NULL, NULL, 0);
    assert_int_equal(PQresultStatus(result), PGRES_TUPLES_OK);
    assert_int_equal(PQntuples(result), 1);
    assert_int_equal(atoi(PQgetvalue(result, 0, 0)), 25);
    assert_int_equal(atoi(PQgetvalue(result, 0, 1)), 20);
    assert_string_equal(PQgetvalue(result, 0, 2), "key-1");
    PQclear(result);
    run_clear(&run);

    /* the table form lists them too */
    RUN_CTL(&run, NULL, "--database-url", db->url, "status");
    assert_exit(&run, 0);
    assert_non_null(strstr(run.out, "BLOCKED KEYS"));
    assert_non_null(strstr(run.out, "blocked ordering keys"));
    assert_non_null(strstr(run.out, "k-dead"));
    assert_non_null(strstr(run.out, "WRONGTYPE wrong kind"));
    assert_non_null(strstr(run.out, "retry in "));
    assert_non_null(strstr(run.out, "retrying"));
    assert_null(strstr(run.out, "k-fine"));
    assert_null(strstr(run.out, "k-done"));
    assert_null(strstr(run.out, "key-21"));
    run_clear(&run);

    /* once the heads are done (or a dead head is deleted), no key is blocked */
    exec_ok(db->conn, "DELETE FROM outbox.job WHERE queue = 'many'");
    exec_ok(db->conn, "UPDATE outbox.job SET state = 'succeeded', finished_at = now(),"
                      "       worker_id = NULL, lease_until = NULL"
                      " WHERE ordering_key IN ('k-running', 'k-retry') OR queue = 'a' AND"
                      "       ordering_key = 'k-dead' AND state = 'dead'");
    RUN_CTL(&run, NULL, "--database-url", db->url, "status");
    assert_exit(&run, 0);
    assert_null(strstr(run.out, "blocked ordering keys"));
    run_clear(&run);
}

/*
 * Rows that already hold an infinite run_at (written before the schema
 * refused them, or by a direct UPDATE): status still answers, with finite
 * ages. A -infinity row has waited since it was created; a key whose head
 * retries at +infinity never retries.
 */
static void
test_status_survives_infinite_times(void **state)
{
    struct testdb *db = test_database(state);
    const char *params[1];
    struct ctl_run run;
    PGresult *result;

    migrate_ok(db);
    exec_ok(db->conn,
            "INSERT INTO outbox.job (queue, payload, ordering_key, attempts, last_error, created_at)"
            " VALUES ('a', '{}', NULL, 0, NULL, now() - interval '50 seconds'),"
            "        ('b', '{}', 'k', 1, 'nack', now()), ('b', '{}', 'k', 0, NULL, now())");
    exec_ok(db->conn, "UPDATE outbox.job SET run_at = '-infinity' WHERE queue = 'a'");
    exec_ok(db->conn, "UPDATE outbox.job SET run_at = 'infinity' WHERE queue = 'b'"
                      " AND attempts = 1");

    RUN_CTL(&run, NULL, "--database-url", db->url, "status", "--json");
    assert_exit(&run, 0);
    params[0] = run.out;
    result = PQexecParams(db->conn,
                          "SELECT (q->>'oldest_ready_age_seconds')::float8 BETWEEN 49 AND 3600,"
                          "       q->'blocked'->0->>'ordering_key',"
                          "       jsonb_typeof(q->'blocked'->0->'retry_in_seconds')"
                          "  FROM jsonb_array_elements($1::jsonb->'queues') AS q ORDER BY q->>'queue'",
                          1, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(result) != PGRES_TUPLES_OK)
        fail_msg("status --json is not the expected JSON: %s\n%s", PQerrorMessage(db->conn),
                 run.out);
    assert_int_equal(PQntuples(result), 2);
    assert_string_equal(PQgetvalue(result, 0, 0), "t");
    assert_string_equal(PQgetvalue(result, 1, 1), "k");
    assert_string_equal(PQgetvalue(result, 1, 2), "null");
    PQclear(result);
    run_clear(&run);

    RUN_CTL(&run, NULL, "--database-url", db->url, "status");
    assert_exit(&run, 0);
    assert_non_null(strstr(run.out, "never"));
    run_clear(&run);
}

/*
 * A key is blocked by any head that keeps it from moving, not only by a dead
 * or retrying one: a running row no relay can have claimed (attempt 0, a
 * lease of a hundred years), or one whose lease expired before the reaper
 * came; a first attempt running under a normal lease is not blocking.
 */
static void
test_status_shows_keys_blocked_by_odd_heads(void **state)
{
    struct testdb *db = test_database(state);
    struct ctl_run run;

    migrate_ok(db);
    exec_ok(db->conn,
            "INSERT INTO outbox.job (queue, payload, ordering_key, state, attempts, worker_id,"
            "                        lease_until, held) VALUES"
            " ('a', '{}', 'k-squat', 'running', 0, 'squatter', now() + interval '100 years', false),"
            " ('a', '{}', 'k-squat', 'ready', 0, NULL, NULL, true),"
            " ('a', '{}', 'k-expired', 'running', 1, 'gone', now() - interval '1 minute', false),"
            " ('a', '{}', 'k-fine', 'running', 1, 'w1', now() + interval '1 minute', false),"
            " ('a', '{}', 'k-fine', 'ready', 0, NULL, NULL, true)");

    RUN_CTL(&run, NULL, "--database-url", db->url, "status");
    assert_exit(&run, 0);
    assert_non_null(strstr(run.out, "blocked ordering keys"));
    assert_non_null(strstr(run.out, "k-squat"));
    assert_non_null(strstr(run.out, "k-expired"));
    assert_null(strstr(run.out, "k-fine"));
    run_clear(&run);
}

/* ---- dead rows --------------------------------------------------------- */

static void
test_dead_list_shows_last_error(void **state)
{
    struct testdb *db = test_database(state);
    struct ctl_run run;
    char *id;

    migrate_ok(db);
    exec_ok(db->conn, "INSERT INTO outbox.job (queue, payload, state, attempts, max_attempts,"
                      " finished_at, last_error) VALUES"
                      " ('mail', '{}', 'dead', 3, 3, now(), 'broker said no'),"
                      " ('mail', '{}', 'succeeded', 1, 3, now(), 'earlier failure')");
    id = query_value(db->conn, "SELECT job_id FROM outbox.job WHERE state = 'dead'");

    RUN_CTL(&run, NULL, "--database-url", db->url, "dead", "list");
    assert_exit(&run, 0);
    assert_non_null(strstr(run.out, "broker said no"));
    assert_non_null(strstr(run.out, id));
    assert_null(strstr(run.out, "earlier failure"));
    run_clear(&run);

    RUN_CTL(&run, NULL, "--database-url", db->url, "dead", "list", "--queue", "other", "--limit",
            "5");
    assert_exit(&run, 0);
    assert_null(strstr(run.out, "broker said no"));
    run_clear(&run);
    free(id);
}

static void
test_dead_retry_adds_attempts(void **state)
{
    struct testdb *db = test_database(state);
    struct ctl_run run;
    char *id;
    PGresult *result;

    migrate_ok(db);
    exec_ok(db->conn,
            "INSERT INTO outbox.job (queue, payload, state, attempts, max_attempts,"
            " finished_at, last_error, run_at) VALUES"
            " ('mail', '{}', 'dead', 3, 3, now(), 'broker said no', now() - interval '1 day'),"
            " ('sms', '{}', 'dead', 4, 4, now(), 'gateway down', now())");
    id = query_value(db->conn, "SELECT job_id FROM outbox.job WHERE queue = 'mail'");

    RUN_CTL(&run, NULL, "--database-url", db->url, "dead", "retry", "--job", id, "--extra-attempts",
            "2");
    assert_exit(&run, 0);
    assert_non_null(strstr(run.out, "retried 1 dead job"));
    run_clear(&run);

    result = query(db->conn, "SELECT state, attempts, max_attempts, finished_at IS NULL,"
                             "       run_at > now() - interval '1 minute'"
                             "  FROM outbox.job ORDER BY queue");
    assert_int_equal(PQntuples(result), 2);
    assert_string_equal(PQgetvalue(result, 0, 0), "ready");
    assert_string_equal(PQgetvalue(result, 0, 1), "3");
    assert_string_equal(PQgetvalue(result, 0, 2), "5");
    assert_string_equal(PQgetvalue(result, 0, 3), "t");
    assert_string_equal(PQgetvalue(result, 0, 4), "t");
    assert_string_equal(PQgetvalue(result, 1, 0), "dead"); /* another job: untouched */
    PQclear(result);

    /* by queue, with the default of one more attempt */
    RUN_CTL(&run, NULL, "--database-url", db->url, "dead", "retry", "--queue", "sms");
    assert_exit(&run, 0);
    run_clear(&run);
    assert_int_equal(query_number(db->conn, "SELECT max_attempts FROM outbox.job "
                                            "WHERE queue = 'sms' AND state = 'ready'"),
                     5);
    free(id);
}

/* ---- purge ------------------------------------------------------------- */

static void
test_purge_deletes_only_old_succeeded(void **state)
{
    struct testdb *db = test_database(state);
    struct ctl_run run;

    migrate_ok(db);
    /* more old rows than one batch holds, so purge must loop */
    exec_ok(db->conn, "INSERT INTO outbox.job (queue, payload, state, attempts, finished_at)"
                      " SELECT 'bulk', '{}', 'succeeded', 1, now() - interval '2 hours'"
                      "   FROM generate_series(1, 12000)");
    exec_ok(db->conn,
            "INSERT INTO outbox.job (queue, payload, state, attempts, max_attempts, finished_at,"
            "                        idempotency_key) VALUES"
            " ('q', '{}', 'succeeded', 1, 3, now() - interval '10 minutes', 'recent'),"
            " ('q', '{}', 'ready', 0, 3, NULL, 'ready'),"
            " ('q', '{}', 'dead', 3, 3, now() - interval '3 hours', 'dead')");

    RUN_CTL(&run, NULL, "--database-url", db->url, "purge", "--older-than", "1h");
    assert_exit(&run, 0);
    assert_non_null(strstr(run.out, "purged 12000 "));
    run_clear(&run);
    assert_int_equal(query_number(db->conn, "SELECT count(*) FROM outbox.job"), 3);
    assert_int_equal(query_number(db->conn, "SELECT count(*) FROM outbox.job "
                                            "WHERE idempotency_key IN ('recent', 'ready', 'dead')"),
                     3);

    /* nothing left to purge is not an error */
    RUN_CTL(&run, NULL, "--database-url", db->url, "purge", "--older-than", "1h");
    assert_exit(&run, 0);
    assert_non_null(strstr(run.out, "purged 0 "));
    run_clear(&run);
}

/* ---- enqueue ----------------------------------------------------------- */

/* Parses stdout that must be exactly one positive job id. */
static long long
printed_id(const struct ctl_run *run)
{
    char *end;
    long long id = strtoll(run->out, &end, 10);

    assert_true(id > 0);
    assert_string_equal(end, "\n");
    return id;
}

static void
test_enqueue_prints_id(void **state)
{
    struct testdb *db = test_database(state);
    struct ctl_run run;
    long long first, again, other;
    char sql[128];

    migrate_ok(db);
    RUN_CTL(&run, NULL, "--database-url", db->url, "enqueue", "--queue", "orders", "--payload",
            "{\"n\": 1}", "--key", "k1");
    assert_exit(&run, 0);
    first = printed_id(&run);
    run_clear(&run);

    RUN_CTL(&run, NULL, "--database-url", db->url, "enqueue", "--queue", "orders", "--payload",
            "{\"n\": 2}", "--key", "k1");
    assert_exit(&run, 0);
    again = printed_id(&run);
    run_clear(&run);
    assert_int_equal(again, first);

    RUN_CTL(&run, NULL, "--database-url", db->url, "enqueue", "--queue", "orders", "--payload",
            "[1, 2]");
    assert_exit(&run, 0);
    other = printed_id(&run);
    run_clear(&run);
    assert_true(other != first);

    snprintf(sql, sizeof(sql), "SELECT payload->>'n' FROM outbox.job WHERE job_id = %lld", first);
    assert_int_equal(query_number(db->conn, sql), 1);
    assert_int_equal(
        query_number(db->conn, "SELECT count(*) FROM outbox.job WHERE state = 'ready'"), 2);

    /* a payload that is not JSON is a runtime error and adds nothing */
    RUN_CTL(&run, NULL, "--database-url", db->url, "enqueue", "--queue", "orders", "--payload",
            "{not json");
    assert_exit(&run, 1);
    assert_int_equal(count_lines(run.err), 1);
    run_clear(&run);
    assert_int_equal(query_number(db->conn, "SELECT count(*) FROM outbox.job"), 2);
}

/* ---- the database URL -------------------------------------------------- */

static void
test_database_url_from_environment(void **state)
{
    struct testdb *db = test_database(state);
    struct ctl_run run;
    char *unreachable;

    RUN_CTL(&run, db->url, "migrate");
    assert_exit(&run, 0);
    run_clear(&run);

    /* the command line wins over the environment */
    assert_true(asprintf(&unreachable, "postgresql://nobody@127.0.0.1:1/none") > 0);
    RUN_CTL(&run, unreachable, "--database-url", db->url, "status");
    assert_exit(&run, 0);
    run_clear(&run);
    free(unreachable);
}

/* ---- errors ------------------------------------------------------------ */

/* Runs outboxctl with args; it must exit 2 with one line naming want. */
static void
usage_fails(const char *want, const char *const *args)
{
    struct ctl_process process = {0};
    struct ctl_run run;

    start_ctl(&process, NULL, args);
    finish_ctl(&process, &run);
    assert_exit(&run, 2);
    assert_string_equal(run.out, "");
    assert_int_equal(count_lines(run.err), 1);
    if (strstr(run.err, want) == NULL)
        fail_msg("usage error '%s' does not name '%s'", run.err, want);
    run_clear(&run);
}

static void
test_bad_usage_exits_2(void **state)
{
    const char *url = "postgresql://nobody@127.0.0.1:1/none";

    (void)state;
    usage_fails("frob", (const char *const[]){"--database-url", url, "frob", NULL});
    usage_fails("--frob", (const char *const[]){"--database-url", url, "status", "--frob", NULL});
    usage_fails("--limit", (const char *const[]){"--database-url", url, "dead", "list", "--limit",
                                                 "ten", NULL});
    usage_fails("--limit", (const char *const[]){"--database-url", url, "dead", "list", "--limit",
                                                 "-3", NULL});
    usage_fails("--job",
                (const char *const[]){"--database-url", url, "dead", "retry", "--job", "0", NULL});
    usage_fails("--extra-attempts", (const char *const[]){"--database-url", url, "dead", "retry",
                                                          "--extra-attempts", "2x", NULL});
    usage_fails("--older-than", (const char *const[]){"--database-url", url, "purge",
                                                      "--older-than", "5 minutes", NULL});
    usage_fails("--older-than", (const char *const[]){"--database-url", url, "purge", NULL});
    usage_fails("--payload",
                (const char *const[]){"--database-url", url, "enqueue", "--queue", "q", NULL});
    usage_fails("--queue",
                (const char *const[]){"--database-url", url, "enqueue", "--queue", NULL});
    usage_fails("dead", (const char *const[]){"--database-url", url, "dead", "bury", NULL});
    usage_fails("command", (const char *const[]){"--database-url", url, NULL});
    usage_fails("database URL", (const char *const[]){"status", NULL});
}

/* Runs outboxctl with args; it must exit 2 with exactly the line want on stderr. */
static void
usage_says(const char *want, const char *const *args)
{
    struct ctl_run run;

    run_ctl(&run, NULL, args);
    assert_exit(&run, 2);
    assert_string_equal(run.out, "");
    assert_string_equal(run.err, want);
    run_clear(&run);
}

/* The subcommand words: groups name their subcommands, --help after a group prints the usage. */
static void
test_subcommand_dispatch(void **state)
{
    struct ctl_run run;

    (void)state;
    usage_says("outboxctl: 'dead' needs a subcommand: list or retry (see outboxctl --help)\n",
               (const char *const[]){"dead", NULL});
    usage_says("outboxctl: unknown subcommand 'bury' for 'dead': use list or retry"
               " (see outboxctl --help)\n",
               (const char *const[]){"dead", "bury", NULL});
    usage_says("outboxctl: 'inbox' needs a subcommand: purge (see outboxctl --help)\n",
               (const char *const[]){"inbox", NULL});
    usage_says("outboxctl: unknown subcommand 'list' for 'inbox': use purge"
               " (see outboxctl --help)\n",
               (const char *const[]){"inbox", "list", NULL});
    usage_says("outboxctl: unknown command 'deadlist' (see outboxctl --help)\n",
               (const char *const[]){"deadlist", NULL});
    usage_says("outboxctl: unknown option '--x' for 'dead list' (see outboxctl --help)\n",
               (const char *const[]){"dead", "list", "--x", NULL});
    usage_says("outboxctl: 'inbox purge' needs --older-than DURATION (see outboxctl --help)\n",
               (const char *const[]){"inbox", "purge", NULL});
    for (size_t i = 0; i < 3; i++) {
        static const char *const group[] = {"dead", "inbox", "paused"};

        RUN_CTL(&run, NULL, group[i], "--help");
        assert_exit(&run, 0);
        assert_string_equal(run.err, "");
        assert_true(strncmp(run.out, "usage: outboxctl ", 17) == 0);
        run_clear(&run);
    }
}

static void
test_unreachable_database_hides_password(void **state)
{
    struct ctl_run run;
    char url[256];

    (void)state;
    snprintf(url, sizeof(url), "postgresql://outbox:%s@127.0.0.1:%d/outbox", SECRET, harness_closed_port());
    RUN_CTL(&run, NULL, "--database-url", url, "status");
    assert_exit(&run, 1);
    assert_int_equal(count_lines(run.err), 1);
    assert_non_null(strstr(run.err, "unable to connect"));
    assert_null(strstr(run.err, SECRET));
    assert_null(strstr(run.out, SECRET));
    run_clear(&run);

    /* the same in conninfo form, from the environment */
    snprintf(url, sizeof(url), "host=127.0.0.1 port=%d user=outbox password=%s", harness_closed_port(),
             SECRET);
    RUN_CTL(&run, url, "migrate");
    assert_exit(&run, 1);
    assert_null(strstr(run.err, SECRET));
    run_clear(&run);

    /* a URL libpq cannot parse quotes the bad piece: here the password */
    RUN_CTL(&run, NULL, "--database-url", "postgresql://outbox:" SECRET "%zz@127.0.0.1/outbox",
            "status");
    assert_exit(&run, 2);
    assert_int_equal(count_lines(run.err), 1);
    assert_non_null(strstr(run.err, "--database-url"));
    assert_null(strstr(run.err, SECRET));
    run_clear(&run);
}

static void
test_wrong_password_is_not_echoed(void **state)
{
    struct testdb *db = test_database(state);
    struct ctl_run run;
    char *url;

    /* a role with a password; the server trusts everyone, so check a bad db name instead */
    assert_true(asprintf(&url, "%s%s", db->url,
                         strchr(db->url, '?') ? "&password=" SECRET : "?password=" SECRET) > 0);
    url[strstr(url, db->name) - url + 1] = 'X'; /* a database that does not exist */
    RUN_CTL(&run, NULL, "--database-url", url, "status");
    assert_exit(&run, 1);
    assert_null(strstr(run.err, SECRET));
    assert_int_equal(count_lines(run.err), 1);
    run_clear(&run);
    free(url);
}


/* ---- third-round hardening ----------------------------------------------- */

/* db's URL with a session that writes times as "Tue Dec 01 18:29:00 2026 CST" (malloc'd). */
static char *
shanghai_url(const struct testdb *db)
{
    char *url = NULL;

    assert_true(asprintf(&url,
                         "%s%soptions=-c%%20DateStyle%%3DPostgres"
                         "%%20-c%%20TimeZone%%3DAsia%%2FShanghai",
                         db->url, strchr(db->url, '?') != NULL ? "&" : "?") > 0);
    return url;
}

/*
 * Under DateStyle Postgres and TimeZone Asia/Shanghai the session writes
 * "CST", which reads back as US Central, 14 hours off: replay's range and
 * its batch cursor, purge's and the inbox purge's cutoffs must not move.
 * 2 061 rows finished in the last 50 minutes (three replay batches), 10
 * finished 5 hours ago.
 */
static void
test_times_survive_session_settings(void **state)
{
    struct testdb *db = test_database(state);
    char *url, *value;
    struct ctl_run run;

    migrate_ok(db);
    url = shanghai_url(db);
    exec_ok(db->conn, "INSERT INTO outbox.job (queue, payload, state, attempts, finished_at)"
                      " SELECT 'mix', '{}', 'succeeded', 1, now() - g * interval '1 second'"
                      "   FROM generate_series(1, 2061) AS g");
    exec_ok(db->conn, "INSERT INTO outbox.job (queue, payload, state, attempts, finished_at)"
                      " SELECT 'mix', '{}', 'succeeded', 1, now() - interval '5 hours'"
                      "   FROM generate_series(1, 10)");
    RUN_CTL(&run, NULL, "--database-url", url, "replay", "--queue", "mix", "--since", "1h",
            "--dry-run");
    assert_exit(&run, 0);
    if (strstr(run.out, "would replay 2061 ") == NULL)
        fail_msg("replay --since 1h --dry-run: %s", run.out);
    run_clear(&run);
    RUN_CTL(&run, NULL, "--database-url", url, "replay", "--queue", "mix", "--since", "1h");
    assert_exit(&run, 0);
    if (strstr(run.out, "replayed 2061 ") == NULL)
        fail_msg("replay --since 1h: %s", run.out);
    run_clear(&run);
    assert_int_equal(
        query_number(db->conn, "SELECT count(*) FROM outbox.job WHERE state = 'ready'"), 2061);

    /* purge --older-than 0: every succeeded row, and only those */
    exec_ok(db->conn, "INSERT INTO outbox.job (queue, payload, state, attempts, finished_at)"
                      " VALUES ('mix', '{}', 'succeeded', 1, now() - interval '1 minute')");
    RUN_CTL(&run, NULL, "--database-url", url, "purge", "--older-than", "0");
    assert_exit(&run, 0);
    run_clear(&run);
    assert_int_equal(query_number(db->conn, "SELECT count(*) FROM outbox.job"
                                            " WHERE state = 'succeeded'"),
                     0);
    assert_int_equal(query_number(db->conn, "SELECT count(*) FROM outbox.job"), 2061);

    /* the inbox purge's cutoff: 2 hours old goes, 10 minutes old stays */
    exec_ok(db->conn, "INSERT INTO outbox.inbox (consumer, message_id, accepted_at) VALUES"
                      " ('c', 'old', now() - interval '2 hours'),"
                      " ('c', 'new', now() - interval '10 minutes')");
    exec_ok(db->conn, "INSERT INTO outbox.inbox_key (consumer, ordering_key, last_job_id,"
                      " accepted_at) VALUES ('c', 'idle', 7, now() - interval '2 hours'),"
                      " ('c', 'busy', 9, now() - interval '10 minutes')");
    RUN_CTL(&run, NULL, "--database-url", url, "inbox", "purge", "--older-than", "1h");
    assert_exit(&run, 0);
    run_clear(&run);
    value = query_value(db->conn, "SELECT string_agg(ordering_key, ',') FROM outbox.inbox_key");
    assert_string_equal(value, "busy");
    free(value);
    value = query_value(db->conn, "SELECT string_agg(message_id, ',') FROM outbox.inbox");
    assert_string_equal(value, "new");
    free(value);
    free(url);
}

/* --retention 0 keeps succeeded rows, as the help says: status takes it and says so. */
static void
test_status_retention_zero(void **state)
{
    struct testdb *db = test_database(state);
    struct ctl_run run;

    migrate_ok(db);
    exec_ok(db->conn, "INSERT INTO outbox.job (queue, payload, state, attempts, finished_at)"
                      " VALUES ('q', '{}', 'succeeded', 1, now() - interval '3 days')");
    RUN_CTL(&run, NULL, "--database-url", db->url, "status", "--retention", "0");
    assert_exit(&run, 0);
    assert_non_null(strstr(run.out, "1, kept (retention 0)"));
    run_clear(&run);
    RUN_CTL(&run, NULL, "--database-url", db->url, "status", "--json", "--retention", "0");
    assert_exit(&run, 0);
    assert_non_null(strstr(run.out, "\"succeeded_past_retention_rows\":0"));
    run_clear(&run);
}

/*
 * A schema at version 4 is named as such by every command and by the
 * relay's store, not as missing or by the first absent column.
 */
static void
test_old_schema_is_named(void **state)
{
    static const char *const commands[][6] = {
        {"status"},
        {"dead", "list"},
        {"paused"},
        {"pause", "orders"},
        {"replay", "--queue", "orders", "--since", "1h"},
        {"enqueue", "--queue", "orders", "--payload", "{}"},
        {"purge", "--older-than", "1d"},
        {"inbox", "purge", "--older-than", "1d"},
    };
    struct testdb *db = test_database(state);
    char want[160];
    struct outbox_error err;
    outbox_store *store;

    migrate_ok(db);
    exec_ok(db->conn, "DELETE FROM outbox.schema_migrations WHERE version > 4");
    snprintf(want, sizeof(want),
             "outbox schema is at version 4, this build needs %d: run 'outboxctl migrate'",
             migrate_files[migrate_file_count - 1].version);
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
        const char *args[10] = {"--database-url", db->url};
        size_t n = 2;
        struct ctl_run run;

        for (size_t a = 0; a < 6 && commands[i][a] != NULL; a++)
            args[n++] = commands[i][a];
        args[n] = NULL;
        run_ctl(&run, NULL, args);
        assert_exit(&run, 1);
        if (strstr(run.err, want) == NULL || count_lines(run.err) != 1)
            fail_msg("outboxctl %s said: %s", commands[i][0], run.err);
        run_clear(&run);
    }
    store = outbox_store_connect(db->url, "worker", &err);
    assert_null(store);
    assert_int_equal(err.code, OUTBOX_ERR_SCHEMA);
    assert_non_null(strstr(err.message, want));
}

/*
 * pause and resume print the ordering key as paused and status do, control
 * characters made spaces; a queue name the schema refuses is a usage error.
 * --ordering-key and --idempotency-key name what the old --key meant.
 */
static void
test_pause_names_and_key_options(void **state)
{
    struct testdb *db = test_database(state);
    struct ctl_run run;
    long long first;

    migrate_ok(db);
    RUN_CTL(&run, NULL, "--database-url", db->url, "pause", "orders", "--key", "k\n\x1b[31m");
    assert_exit(&run, 0);
    assert_null(strchr(run.out, '\x1b'));
    assert_int_equal(count_lines(run.out), 1);
    assert_non_null(strstr(run.out, "ordering key 'k  [31m'"));
    run_clear(&run);
    RUN_CTL(&run, NULL, "--database-url", db->url, "resume", "orders", "--ordering-key",
            "k\n\x1b[31m");
    assert_exit(&run, 0);
    assert_null(strchr(run.out, '\x1b'));
    assert_non_null(strstr(run.out, "resumed ordering key 'k  [31m'"));
    run_clear(&run);
    RUN_CTL(&run, NULL, "--database-url", db->url, "pause", "orders", "--ordering-key", "k2");
    assert_exit(&run, 0);
    run_clear(&run);
    assert_int_equal(query_number(db->conn, "SELECT count(*) FROM outbox.paused"
                                            " WHERE ordering_key = 'k2'"),
                     1);
    usage_fails("invalid queue name",
                (const char *const[]){"--database-url", db->url, "pause", "bad queue", NULL});
    usage_fails("invalid queue name",
                (const char *const[]){"--database-url", db->url, "resume", "bad\x1bqueue", NULL});
    usage_fails("ordering key",
                (const char *const[]){"--database-url", db->url, "pause", "q", "--ordering-key",
                                      "", NULL});
    usage_fails("invalid queue name",
                (const char *const[]){"--database-url", db->url, "enqueue", "--queue", "a b",
                                      "--payload", "{}", NULL});
    usage_fails("invalid queue name",
                (const char *const[]){"--database-url", db->url, "replay", "--queue", "a/b",
                                      "--since", "1h", NULL});

    RUN_CTL(&run, NULL, "--database-url", db->url, "enqueue", "--queue", "q", "--payload", "{}",
            "--idempotency-key", "once");
    assert_exit(&run, 0);
    first = printed_id(&run);
    run_clear(&run);
    RUN_CTL(&run, NULL, "--database-url", db->url, "enqueue", "--queue", "q", "--payload", "{}",
            "--key", "once");
    assert_exit(&run, 0);
    assert_int_equal(printed_id(&run), first);
    run_clear(&run);
}

int
main(void)
{
#define DB_TEST(name) cmocka_unit_test_setup_teardown(name, setup_database, teardown_database)
    const struct CMUnitTest tests[] = {
        DB_TEST(test_migrate_creates_schema),
        DB_TEST(test_migrate_again_applies_nothing),
        DB_TEST(test_migrate_003_on_existing_rows),
        DB_TEST(test_concurrent_migrate),
        DB_TEST(test_status_without_schema),
        DB_TEST(test_status_json_counts),
        DB_TEST(test_status_leaves_the_watchs_look_out),
        DB_TEST(test_status_retention_and_infinite_times),
        DB_TEST(test_status_shows_blocked_keys),
        DB_TEST(test_status_survives_infinite_times),
        DB_TEST(test_status_shows_keys_blocked_by_odd_heads),
        DB_TEST(test_dead_list_shows_last_error),
        DB_TEST(test_dead_retry_adds_attempts),
        DB_TEST(test_purge_deletes_only_old_succeeded),
        DB_TEST(test_enqueue_prints_id),
        DB_TEST(test_database_url_from_environment),
        DB_TEST(test_wrong_password_is_not_echoed),
        DB_TEST(test_times_survive_session_settings),
        DB_TEST(test_status_retention_zero),
        DB_TEST(test_old_schema_is_named),
        DB_TEST(test_pause_names_and_key_options),
        cmocka_unit_test(test_bad_usage_exits_2),
        cmocka_unit_test(test_subcommand_dispatch),
        cmocka_unit_test(test_unreachable_database_hides_password),
    };
#undef DB_TEST

    return cmocka_run_group_tests(tests, NULL, NULL);
}
