/*
 * wait.h - the relay's one way to wait: poll() on at most one file
 * descriptor and a stop latch, until a deadline.
 *
 * A latch is an eventfd that, once set, stays readable for good: every
 * wait on it ends at once and every later wait returns without blocking.
 * Setting it is async-signal-safe. Deadlines are monotonic seconds
 * (clock_monotonic_seconds()); WAIT_FOREVER has none. No thread ever
 * sleeps in slices or busy-polls a flag.
 */
#ifndef OUTBOX_WAIT_H
#define OUTBOX_WAIT_H

#include <stdbool.h>

#include "error.h"

#define WAIT_FOREVER (-1.0)

struct wait_latch {
    int fd; /* -1 until opened */
};

/* How a wait ended. */
enum wait_result {
    WAIT_TIMEOUT, /* the deadline passed */
    WAIT_READY,   /* fd is readable (or hung up) */
    WAIT_STOPPED, /* the stop latch is set */
};

/* Opens a latch, not set; 0, or -1 with err. */
int wait_latch_open(struct wait_latch *latch, struct outbox_error *err);
/* Closes it; a latch never opened (fd -1) is a no-op. */
void wait_latch_close(struct wait_latch *latch);
/* Sets it for good; async-signal-safe, harmless to repeat. */
void wait_latch_set(struct wait_latch *latch);
bool wait_latch_is_set(const struct wait_latch *latch);

/*
 * Waits until stop is set, fd (-1: none) is readable, or the deadline
 * passes, whichever comes first; stop wins when both are ready. A signal
 * does not end the wait early.
 */
enum wait_result wait_until(const struct wait_latch *stop, int fd, double deadline);

/* wait_until() with a deadline ms from now. */
enum wait_result wait_ms(const struct wait_latch *stop, int fd, int ms);

#endif
