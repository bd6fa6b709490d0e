/*
 * relay_runner.h - running bin/outbox-relay from integration tests.
 *
 * The relay is a separate process, started from $OUTBOX_BIN (under
 * $OUTBOX_VALGRIND when set) with its output in a log file under /tmp that
 * the test prints when it fails. Waits are bounded; nothing loops forever.
 */
#ifndef OUTBOX_TESTS_RELAY_RUNNER_H
#define OUTBOX_TESTS_RELAY_RUNNER_H

#include <stdbool.h>
#include <sys/types.h>

#include <libpq-fe.h>

#define RELAY_MAX_ARGS 32

struct relay_process {
    pid_t pid;
    char log_path[128];
};

/*
 * Starts the relay with --database-url (none when database_url is NULL:
 * the extras then name --databases) and --broker plus the extra
 * arguments (NULL-terminated, may be NULL), --metrics-addr off unless the
 * extras name one, and --lease 5 unless the extras name one.
 */
void relay_start_process(struct relay_process *relay, const char *database_url, const char *broker,
                         const char *const *extra);

/* Waits up to timeout_ms for the relay to exit; its exit status, or -1 after killing it. */
int relay_wait(struct relay_process *relay, int timeout_ms);

/* Sends a signal, e.g. SIGTERM or SIGKILL. */
void relay_signal(struct relay_process *relay, int signo);

/* Runs the relay with --once to completion (60 s at most); its exit status. */
int relay_run_once(const char *database_url, const char *broker, const char *const *extra);

/*
 * Runs the relay with argv_tail to its end (30 s at most) through
 * fixture_run_program(): its exit status, stdout and stderr in output (size bytes).
 */
int relay_run_capture(const char *const *argv_tail, char *output, size_t size);

/* Prints the relay's log to stderr (for a failing test). */
void relay_dump_log(const struct relay_process *relay);

/* Wall-clock seconds since the epoch, as the relay's log timestamps count them. */
double wall_clock_seconds(void);

/*
 * Finds the first (or with last, the last) line of the relay's log stamped
 * at or after not_before (epoch seconds) that contains every one of the
 * NULL-terminated needles. Returns its timestamp in epoch seconds and
 * copies the line into line (size bytes, may be NULL), or returns -1 when
 * there is none.
 */
double relay_log_find(const struct relay_process *relay, double not_before, bool last,
                      const char *const *needles, char *line, size_t size);

/* GET /metrics from a relay started with --metrics-addr 127.0.0.1:port; malloc'd body or NULL. */
char *relay_scrape_metrics(int port);

/* Polls the first column of sql until it equals expected or timeout_ms passes; the last value. */
long long wait_for_value(PGconn *conn, const char *sql, long long expected, int timeout_ms);

/* Inserts count committed rows into queue with outbox.enqueue and returns nothing. */
void enqueue_rows(PGconn *conn, const char *queue, int count);

#endif
