/*
 * clock.h - the monotonic clock, for deadlines, timeouts and durations.
 *
 * One place for clock_gettime(CLOCK_MONOTONIC): it never jumps with the wall
 * clock, so a deadline computed from it holds across NTP steps. Wall-clock
 * time (row timestamps) is not here.
 */
#ifndef OUTBOX_CLOCK_H
#define OUTBOX_CLOCK_H

#include <stdint.h>
#include <sys/time.h>

/* Milliseconds since an arbitrary fixed origin. */
int64_t clock_monotonic_ms(void);

/* Seconds since the same origin, with sub-millisecond precision. */
double clock_monotonic_seconds(void);

/* A duration of ms milliseconds as a struct timeval, for client library timeouts; negative is 0. */
struct timeval timeval_from_ms(int64_t ms);

#endif
