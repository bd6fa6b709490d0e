/*
 * harness.h - helpers for integration tests against the throwaway stack.
 *
 * tests/run.sh starts PostgreSQL, RabbitMQ, Redis and Kafka with tests/harness/stack.sh and
 * exports OUTBOX_TEST_* (see stack.sh), OUTBOX_BIN (absolute path of the built programs)
 * and OUTBOX_SOURCE_DIR (the repository root) before it runs each test binary.
 *
 * Every test gets its own database, cloned from outbox_template (the schema of sql/
 * already applied), and drops it on the way out. Helpers that talk to a server fail the
 * current cmocka test with a message naming what went wrong instead of returning an
 * error, so a test reads as the behaviour it checks. Include <cmocka.h> (with its
 * <stdarg.h> <stddef.h> <setjmp.h> <stdint.h> prelude) before this header.
 */
#ifndef OUTBOX_TEST_HARNESS_H
#define OUTBOX_TEST_HARNESS_H

#include <sys/types.h>

#include <libpq-fe.h>

/*
 * Returns the value of environment variable name; fails the test, saying to run the
 * test through tests/run.sh, when it is unset or empty.
 */
const char *harness_env(const char *name);

/*
 * Creates database outbox_test_<pid>_<counter> from outbox_template and returns a
 * malloc'd libpq URL to it; the caller passes it to harness_database_drop().
 */
char *harness_database_new(void);

/* Like harness_database_new(), but an empty database: no outbox schema (migrate tests). */
char *harness_database_new_empty(void);

/*
 * Drops the database url names, disconnecting any session still in it
 * (DROP DATABASE ... WITH (FORCE)), and frees url. NULL is a no-op.
 */
void harness_database_drop(char *url);

/* Connects to url (libpq URL or conninfo); fails the test when that does not work. */
PGconn *harness_connect(const char *url);

/* Runs sql (one or more statements); fails the test on any error. */
void harness_exec(PGconn *conn, const char *sql);

/*
 * Runs sql and returns the first column of the first row as a number; fails the test
 * when the query fails, returns no row, or that value is NULL.
 */
long long harness_query_ll(PGconn *conn, const char *sql);

/*
 * Writes into out the message id the relay gives row job_id of conn's
 * database (its n-th replay for replay > 0), as outbox.identity and the
 * row's message_uid say now (the row must still be there).
 */
void harness_message_id(PGconn *conn, long long job_id, int replay, char *out, size_t size);

/*
 * Returns a malloc'd path for a log file named after name in the stack directory
 * (OUTBOX_TEST_STACK_DIR/logs/<name>.log), so logs of failed runs sit next to the
 * servers' logs.
 */
char *harness_log_path(const char *name);

/*
 * Starts argv[0] (looked up in PATH when it has no slash) with stdin from /dev/null and
 * stdout + stderr appended to log_path, prefixed by the words of OUTBOX_VALGRIND when
 * that is set. The child is killed if the test process dies first. Returns its pid;
 * fails the test when it cannot fork.
 */
pid_t harness_spawn(const char *const argv[], const char *log_path);

/*
 * Waits up to timeout_ms for pid to exit and returns its exit status (128 + the signal
 * number when a signal ended it). On timeout it kills pid with SIGKILL, reaps it and
 * returns -1.
 */
int harness_wait_exit(pid_t pid, int timeout_ms);

/*
 * Runs tests/harness/stack.sh COMMAND $OUTBOX_TEST_STACK_DIR SERVICE (SERVICE may be
 * NULL), e.g. harness_stack("restart-service", "rabbitmq"), and returns its exit status
 * (0 when it worked).
 */
int harness_stack(const char *command, const char *service);

/*
 * Runs tests/harness/stack.sh args[0] $OUTBOX_TEST_STACK_DIR args[1] ... (NULL-terminated),
 * e.g. {"cluster-rabbitmqctl", "2", "stop_app", NULL}, and returns its exit status.
 */
int harness_stack_run(const char *const args[]);

/*
 * Reads $OUTBOX_TEST_STACK_DIR/env into this process's environment: after a test
 * started servers of its own with harness_stack_run({"start", ...}).
 */
void harness_stack_load_env(void);

/* A loopback TCP port with nothing listening: bound, then closed again. */
int harness_closed_port(void);

/*
 * A loopback port for a server a test starts (a relay's --metrics-addr):
 * nothing listens on it now, it lies in OUTBOX_TEST_PORT_RANGE ("LOW-HIGH",
 * default 20000-32000, below the kernel's ephemeral ports, which a
 * connection may take at any moment), and this process has not been given
 * it before.
 */
int harness_free_port(void);

/*
 * How many times longer than natively a program under test takes to start: 10
 * when OUTBOX_VALGRIND runs it under valgrind, else 1. Scales the waits for a
 * program to come up and stop; a deadline a test asserts stays as it is, or
 * relaxes under valgrind only as far as it still tells the behaviour apart.
 */
int harness_time_scale(void);

#endif
