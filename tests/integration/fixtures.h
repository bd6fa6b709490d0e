/*
 * fixtures.h - what several integration tests set up the same way: running
 * the built programs (outboxctl, outbox-relay) to their end with their
 * output kept, PostgreSQL roles to run them as, and a Redis or a NATS
 * test's database, connection and names of its own.
 *
 * Like harness.h, these fail the current cmocka test on an error instead of
 * returning one. Include <cmocka.h> (with its prelude) before this header.
 */
#ifndef OUTBOX_TEST_FIXTURES_H
#define OUTBOX_TEST_FIXTURES_H

#include <stdbool.h>
#include <stddef.h>

#include <hiredis/hiredis.h>
#include <libpq-fe.h>

#include "nats_consumer.h"

/* The most arguments fixture_run_program() passes on. */
#define FIXTURE_MAX_ARGS 48

/*
 * Runs $OUTBOX_BIN/program (under $OUTBOX_VALGRIND when set) with the
 * arguments argv_tail (NULL-terminated) and waits up to timeout_ms for it.
 * Returns its exit status (128 + the signal when one ended it, -1 after
 * killing it at the timeout), with what it wrote to stdout and stderr in
 * output (size bytes, NUL-terminated, cut to fit).
 */
int fixture_run_program(const char *program, const char *const *argv_tail, char *output,
                        size_t size, int timeout_ms);

/* fixture_run_program() of outboxctl, 30 s at most. */
int fixture_run_outboxctl(const char *const *argv_tail, char *output, size_t size);

/* The file OUTBOX_SOURCE_DIR/relative as a malloc'd string; fails the test when unreadable. */
char *fixture_read_source_file(const char *relative);

/* The file at path (a relay's log, say) as a malloc'd string; "" when it cannot be read. */
char *fixture_read_file(const char *path);

/*
 * Runs sql/roles/outbox_relay_role.sql on conn: the group roles
 * outbox_relay, outbox_producer and outbox_reader with what each may do in
 * conn's database (the script is idempotent).
 */
void fixture_create_outbox_roles(PGconn *conn);

/*
 * Creates login role user, dropping one a failed run left behind first, then
 * runs grants on conn (SQL, "" for none), e.g. "GRANT outbox_relay TO u".
 * Drop it with fixture_drop_role().
 */
void fixture_create_login_role(PGconn *conn, const char *user, const char *grants);

/* Drops what user owns and its privileges in conn's database, then the role itself. */
void fixture_drop_role(PGconn *conn, const char *user);

/*
 * A malloc'd copy of the libpq URL url (postgresql://user@host:port/db) with
 * its userinfo replaced by user, without a password (the test server trusts
 * loopback).
 */
char *fixture_url_as(const char *url, const char *user);

/*
 * A TCP connection to 127.0.0.1:port whose reads and writes give up after
 * timeout_seconds; -1 when nothing accepts it.
 */
int fixture_connect_loopback(int port, int timeout_seconds);

/* True once 127.0.0.1:port accepts connections (a server started by a test is up). */
bool fixture_port_open(int port);

/* What a test of the database alone works in: a fresh database and a connection to it. */
struct fixture_database {
    char *url;
    PGconn *conn;
};

/*
 * cmocka setup and teardown for a test whose state is a struct
 * fixture_database: a fresh database with one connection, dropped after it.
 */
int fixture_database_setup(void **state);
int fixture_database_teardown(void **state);

/*
 * What a Redis test works in: a fresh database (url, conn), the Redis at
 * OUTBOX_TEST_REDIS_URL (broker, redis) and a key prefix no other test
 * uses, "<name>-<pid>-<n>:", with stream the prefix + a stream name.
 */
struct fixture_redis {
    char *url;
    PGconn *conn;
    redisContext *redis;
    const char *broker;
    char prefix[64];
    char stream[96];
};

/* Sets f up with a prefix made of name, stream the prefix + stream_name. */
void fixture_redis_open(struct fixture_redis *f, const char *name, const char *stream_name);

/*
 * Deletes f's keys (those of its prefix and of "{" + its prefix), closes its
 * connections and drops its database.
 */
void fixture_redis_close(struct fixture_redis *f);

/*
 * What a NATS test works in: a fresh database (url, conn), a consumer of
 * the NATS server (nats), and a JetStream stream name no other test uses,
 * "<name>-<pid>-<n>", with prefix its subjects' "<stream>.". made_stream:
 * the test created the stream, and closing deletes it.
 */
struct fixture_nats {
    char *url;
    PGconn *conn;
    nats_consumer *nats;
    const char *broker; /* OUTBOX_TEST_NATS_URL, NULL for a consumer connected otherwise */
    char prefix[72];
    char stream[64];
    bool made_stream;
};

/*
 * Sets f up with names made of name; nats is the consumer to use, or NULL
 * to connect one to OUTBOX_TEST_NATS_URL. f owns it from then on.
 */
void fixture_nats_open(struct fixture_nats *f, const char *name, nats_consumer *nats);

/* Deletes the stream f made, frees its consumer, closes f's connection and drops its database. */
void fixture_nats_close(struct fixture_nats *f);

#endif
