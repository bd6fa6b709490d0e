/*
 * cause_log.c - see cause_log.h.
 */
#include "cause_log.h"

#include <stdio.h>
#include <string.h>

#include "clock.h"

bool
cause_log_due(struct cause_log *log, const char *text, unsigned long *repeats)
{
    double now = clock_monotonic_seconds();

    if (log->logged_at > 0 && strncmp(log->text, text, sizeof(log->text) - 1) == 0 &&
        now - log->logged_at < CAUSE_LOG_EVERY_SECONDS) {
        log->repeats++;
        return false;
    }
    *repeats = log->repeats;
    log->repeats = 0;
    log->logged_at = now;
    snprintf(log->text, sizeof(log->text), "%s", text);
    return true;
}
