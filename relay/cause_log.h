/*
 * cause_log.h - one log line a minute for a cause that repeats at every retry.
 *
 * A daemon that retries (a read-only role, a lock, a Redis without the
 * replicas --redis-wait asks for) meets the same cause again and again; a
 * line per retry floods the log and hides what changed. A cause_log keeps
 * the text of the last line it allowed: the same text is allowed again a
 * minute later at the earliest, with the number of repeats left out; another
 * text is allowed at once. One cause_log belongs to one thread.
 */
#ifndef OUTBOX_CAUSE_LOG_H
#define OUTBOX_CAUSE_LOG_H

#include <stdbool.h>

#include "timeouts.h" /* CAUSE_LOG_EVERY_SECONDS */

struct cause_log {
    double logged_at; /* monotonic seconds of the last line allowed; 0: never */
    unsigned long repeats; /* lines left out since then */
    char text[256];
};

/*
 * Whether a line about text is due now; when it is, *repeats gets the number
 * of lines left out since the last one and the log remembers text.
 */
bool cause_log_due(struct cause_log *log, const char *text, unsigned long *repeats);

#endif
