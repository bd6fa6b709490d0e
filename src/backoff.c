/*
 * backoff.c - capped exponential retry delays with jitter.
 */
#include "outbox.h"

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
    if (random01 < 0)
        random01 = 0;
    if (random01 >= 1)
        random01 = 0.999999;
    /* "equal jitter": never less than half the delay, so retries still back off */
    return delay * (0.5 + random01 / 2);
}
