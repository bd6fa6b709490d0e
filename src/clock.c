/*
 * clock.c - the monotonic clock.
 */
#include "clock.h"

#include <time.h>

int64_t
clock_monotonic_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

double
clock_monotonic_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct timeval
timeval_from_ms(int64_t ms)
{
    struct timeval tv;

    if (ms < 0)
        ms = 0;
    tv.tv_sec = (time_t)(ms / 1000);
    tv.tv_usec = (suseconds_t)(ms % 1000 * 1000);
    return tv;
}
