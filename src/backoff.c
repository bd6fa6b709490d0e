/*
 * backoff.c - capped exponential retry delays with jitter.
 */
#include "backoff.h"

#include <stdlib.h>

#include "outbox.h"

/* "equal jitter": never less than half the delay, so retries still back off */
static double
equal_jitter(double delay, double random01)
{
    if (random01 < 0)
        random01 = 0;
    if (random01 >= 1)
        random01 = 0.999999;
    return delay * (0.5 + random01 / 2);
}

double
outbox_backoff_seconds(int attempt, double base_seconds, double cap_seconds, double random01)
{
    double delay = base_seconds;

    if (attempt < 1)
        attempt = 1;
    for (int i = 1; i < attempt && delay < cap_seconds; i++)
        delay *= 2;
    if (delay > cap_seconds)
        delay = cap_seconds;
    return equal_jitter(delay, random01);
}

struct backoff
backoff_make(double initial, double max, unsigned int seed)
{
    return (struct backoff){.initial = initial, .max = max, .current = 0, .seed = seed};
}

double
backoff_next(struct backoff *b)
{
    double delay = b->current > 0 ? b->current : b->initial;

    if (delay > b->max)
        delay = b->max;
    b->current = delay * 2 > b->max ? b->max : delay * 2;
    return equal_jitter(delay, (double)rand_r(&b->seed) / ((double)RAND_MAX + 1));
}

void
backoff_reset(struct backoff *b)
{
    b->current = 0;
}
