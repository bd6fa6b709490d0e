/*
 * backoff.h - a retry delay that doubles from initial up to max, with
 * "equal jitter": each delay is between half and all of the current step,
 * so retries still back off and threads that failed together spread out.
 *
 * Every reconnect and every pause after a refusal takes its delay from one
 * of these; a row's retry delay in the database uses outbox_backoff_seconds(),
 * the same scheme by attempt number.
 */
#ifndef OUTBOX_BACKOFF_H
#define OUTBOX_BACKOFF_H

struct backoff {
    double initial; /* seconds, the first delay's step */
    double max;     /* seconds, the longest step */
    double current; /* the next delay's step; 0 after backoff_reset() */
    unsigned int seed; /* rand_r() state of the jitter */
};

/* A backoff from initial to max seconds, jitter seeded with seed. */
struct backoff backoff_make(double initial, double max, unsigned int seed);

/* The next delay in seconds, then doubles the step (up to max). */
double backoff_next(struct backoff *b);

/* The next backoff_next() starts again at initial. */
void backoff_reset(struct backoff *b);

#endif
