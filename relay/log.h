/*
 * log.h - one line per event, as text or JSON, for the daemons.
 *
 * An event is a level, a short lowercase message and optional key=value
 * fields given as a printf format:
 *
 *   log_event(OUTBOX_LOG_WARN, "publish failed",
 *             "job_id=%lld queue=%s reason=\"%s\"", (long long)id, queue, err.message);
 *
 * text: 2026-11-30T03:41:13.123Z warn  publish failed job_id=12 queue=orders reason="nack"
 * json: {"ts":"2026-11-30T03:41:13.123Z","level":"warn","msg":"publish failed","job_id":12,
 *        "queue":"orders","reason":"nack"}
 *
 * Field syntax: fields are separated by spaces; a value is either a bare word
 * (no spaces, no quotes) or a double-quoted string. A quoted value ends at the
 * quote that is followed by the end of the fields or by " key=", so a quoted
 * value may itself contain quotes and spaces (error messages from servers do).
 * In JSON, bare words that are integers or decimals become numbers and
 * true/false become booleans; everything else is a string. Text output
 * re-quotes values as needed and escapes control characters, so an event is
 * always exactly one line. Pass NULL as fields_format for an event without
 * fields.
 *
 * Every line is written with a single write(2) under a lock, so lines from
 * concurrent threads never interleave. All functions are thread-safe.
 * Passwords are never logged: pass URLs and conninfo strings through
 * url_redact() (url.h) before they reach a log call.
 *
 * Rate limiting: log_event_limited() logs an event with a given key at most
 * once per interval (10 s by default); the next line logged for that key
 * carries suppressed=N, the number of events dropped in between. Use it for
 * anything that can repeat in a loop (broker down, connection refused).
 */
#ifndef OUTBOX_LOG_H
#define OUTBOX_LOG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "outbox.h"
#include "timeouts.h" /* LOG_RATE_LIMIT_DEFAULT_MS */

/* Severity, lowest first. Names avoid the LOG_* macros of <syslog.h>. */
enum log_level {
    OUTBOX_LOG_DEBUG = 0, /* detail for developers: every claim, every batch */
    OUTBOX_LOG_INFO,      /* normal operation: started, connected, stopping */
    OUTBOX_LOG_WARN,      /* something failed and will be retried */
    OUTBOX_LOG_ERROR,     /* something failed and will not be retried */
};

/* Output shape of a line. */
enum log_format {
    OUTBOX_LOG_TEXT = 0, /* timestamp level message key=value... */
    OUTBOX_LOG_JSON,     /* one JSON object per line */
};

/*
 * Sets the minimum level logged, the format and the stream (NULL = stderr).
 * The stream is not closed by this module. Until called: info, text, stderr.
 */
void log_configure(enum log_level min_level, enum log_format format, FILE *out);

/* True when an event at level would be written (to skip costly formatting). */
bool log_enabled(enum log_level level);

/* Logs one event; see the header comment for the fields syntax. */
void log_event(enum log_level level, const char *msg, const char *fields_format, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * Like log_event(), but at most once per rate-limit interval for the same
 * key (up to 63 bytes are significant; NULL means no limit). The first line
 * after a suppressed period gets the field suppressed=N.
 */
void log_event_limited(const char *key, enum log_level level, const char *msg,
                       const char *fields_format, ...) __attribute__((format(printf, 4, 5)));

/* Sets the rate-limit interval in milliseconds (<= 0 restores the default). */
void log_set_rate_limit(int64_t interval_ms);

/*
 * Replaces the clock (milliseconds since the Unix epoch) used for
 * timestamps and rate limiting; NULL restores the real clock. For tests.
 */
void log_set_clock(int64_t (*now_ms)(void));

/*
 * Parses "debug" | "info" | "warn" | "error" and "text" | "json" (the values
 * of --log-level and --log-format). 0, or -1 with OUTBOX_ERR_CONFIG naming
 * the bad value.
 */
int log_level_parse(const char *text, enum log_level *level, struct outbox_error *err);
int log_format_parse(const char *text, enum log_format *format, struct outbox_error *err);

/* "debug", "info", "warn" or "error". */
const char *log_level_name(enum log_level level);

#endif
