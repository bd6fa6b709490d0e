/*
 * fixtures.c - running the built programs and making roles, for integration tests.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "fixtures.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "harness.h"
#include "redis_consumer.h"

/* Runs so far; part of each run's log file name. */
static unsigned run_counter;

int
fixture_run_program(const char *program, const char *const *argv_tail, char *output, size_t size,
                    int timeout_ms)
{
    const char *argv[FIXTURE_MAX_ARGS + 2];
    char binary[512], name[128];
    char *log_path;
    size_t n = 0, len = 0;
    FILE *file;
    int status;

    snprintf(binary, sizeof(binary), "%s/%s", harness_env("OUTBOX_BIN"), program);
    argv[n++] = binary;
    for (size_t i = 0; argv_tail[i] != NULL; i++) {
        if (n > FIXTURE_MAX_ARGS)
            fail_msg("%s run with more than %d arguments", program, FIXTURE_MAX_ARGS);
        argv[n++] = argv_tail[i];
    }
    argv[n] = NULL;
    snprintf(name, sizeof(name), "%s-run-%d-%u", program, (int)getpid(), run_counter++);
    log_path = harness_log_path(name);
    unlink(log_path);
    status = harness_wait_exit(harness_spawn(argv, log_path), timeout_ms);
    file = fopen(log_path, "r");
    if (file != NULL) {
        len = fread(output, 1, size - 1, file);
        fclose(file);
    }
    output[len] = '\0';
    unlink(log_path);
    free(log_path);
    return status;
}

int
fixture_run_outboxctl(const char *const *argv_tail, char *output, size_t size)
{
    return fixture_run_program("outboxctl", argv_tail, output, size, 30000);
}

/* The whole file at path, malloc'd; NULL when it cannot be opened. */
static char *
read_file(const char *path)
{
    FILE *file = fopen(path, "r");
    long size;
    char *text;

    if (file == NULL)
        return NULL;
    fseek(file, 0, SEEK_END);
    size = ftell(file);
    fseek(file, 0, SEEK_SET);
    text = malloc((size_t)size + 1);
    assert_non_null(text);
    assert_int_equal(fread(text, 1, (size_t)size, file), (size_t)size);
    text[size] = '\0';
    fclose(file);
    return text;
}

char *
fixture_read_file(const char *path)
{
    char *text = read_file(path);

    if (text == NULL) {
        text = strdup("");
        assert_non_null(text);
    }
    return text;
}

char *
fixture_read_source_file(const char *relative)
{
    char path[1024];
    char *text;

    snprintf(path, sizeof(path), "%s/%s", harness_env("OUTBOX_SOURCE_DIR"), relative);
    text = read_file(path);
    if (text == NULL)
        fail_msg("cannot open %s", path);
    return text;
}

void
fixture_create_outbox_roles(PGconn *conn)
{
    char *script = fixture_read_source_file("sql/roles/outbox_relay_role.sql");

    harness_exec(conn, script);
    free(script);
}

void
fixture_create_login_role(PGconn *conn, const char *user, const char *grants)
{
    size_t size = strlen(grants) + 3 * strlen(user) + 128;
    char *sql = malloc(size);

    assert_non_null(sql);
    /* the notice of a role that was not there is noise in the test's output */
    snprintf(sql, size,
             "SET client_min_messages = warning; DROP ROLE IF EXISTS %s; CREATE ROLE %s LOGIN;"
             " RESET client_min_messages; %s",
             user, user, grants);
    harness_exec(conn, sql);
    free(sql);
}

void
fixture_drop_role(PGconn *conn, const char *user)
{
    char sql[256];

    snprintf(sql, sizeof(sql), "DROP OWNED BY %s; DROP ROLE %s", user, user);
    harness_exec(conn, sql);
}

char *
fixture_url_as(const char *url, const char *user)
{
    const char *scheme_end = strstr(url, "://");
    const char *at, *rest;
    char *out;

    assert_non_null(scheme_end);
    at = strchr(scheme_end + 3, '@');
    rest = at != NULL ? at + 1 : scheme_end + 3;
    out = malloc(strlen(url) + strlen(user) + 2);
    assert_non_null(out);
    sprintf(out, "%.*s%s@%s", (int)(scheme_end + 3 - url), url, user, rest);
    return out;
}

int
fixture_database_setup(void **state)
{
    struct fixture_database *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    f->url = harness_database_new();
    f->conn = harness_connect(f->url);
    *state = f;
    return 0;
}

int
fixture_database_teardown(void **state)
{
    struct fixture_database *f = *state;

    PQfinish(f->conn);
    harness_database_drop(f->url);
    free(f);
    return 0;
}

void
fixture_redis_open(struct fixture_redis *f, const char *name, const char *stream_name)
{
    static int counter;

    f->url = harness_database_new();
    f->conn = harness_connect(f->url);
    f->broker = harness_env("OUTBOX_TEST_REDIS_URL");
    f->redis = stream_consumer_connect(f->broker);
    assert_non_null(f->redis);
    snprintf(f->prefix, sizeof(f->prefix), "%s-%d-%d:", name, (int)getpid(), counter++);
    snprintf(f->stream, sizeof(f->stream), "%s%s", f->prefix, stream_name);
}

void
fixture_redis_close(struct fixture_redis *f)
{
    stream_consumer_delete_test_keys(f->redis, f->prefix);
    redisFree(f->redis);
    PQfinish(f->conn);
    harness_database_drop(f->url);
}

int
fixture_connect_loopback(int port, int timeout_seconds)
{
    struct sockaddr_in addr = {.sin_family = AF_INET};
    struct timeval timeout = {.tv_sec = timeout_seconds};
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    assert_true(fd >= 0);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons((uint16_t)port);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

bool
fixture_port_open(int port)
{
    int fd = fixture_connect_loopback(port, 1);

    if (fd < 0)
        return false;
    close(fd);
    return true;
}

void
fixture_nats_open(struct fixture_nats *f, const char *name, nats_consumer *nats)
{
    static int counter;

    f->url = harness_database_new();
    f->conn = harness_connect(f->url);
    if (nats == NULL) {
        f->broker = harness_env("OUTBOX_TEST_NATS_URL");
        nats = nats_consumer_connect(f->broker);
    }
    assert_non_null(nats);
    f->nats = nats;
    snprintf(f->stream, sizeof(f->stream), "%s-%d-%d", name, (int)getpid(), counter++);
    snprintf(f->prefix, sizeof(f->prefix), "%s.", f->stream);
}

void
fixture_nats_close(struct fixture_nats *f)
{
    if (f->made_stream)
        nats_consumer_delete_stream(f->nats, f->stream);
    nats_consumer_free(f->nats);
    PQfinish(f->conn);
    harness_database_drop(f->url);
}
