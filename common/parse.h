/*
 * parse.h - parsing command-line values: durations and bounded integers.
 *
 * Pure functions: no I/O, no allocation. The whole text must be a value;
 * signs, spaces and trailing characters are rejected. Messages quote the
 * offending text (control characters as ?) so a caller can print them as
 * they are, on one line.
 */
#ifndef OUTBOX_PARSE_H
#define OUTBOX_PARSE_H

#include <stdint.h>

#include "outbox.h"

/* The longest duration accepted: 100 years of 365 days. */
#define PARSE_DURATION_MAX_SECONDS ((int64_t)100 * 365 * 86400)

/*
 * Parses a duration of one or more <digits><unit> parts, units s, m, h, d
 * (e.g. "90s", "15m", "24h", "7d", "1h30m"), or a bare "0", into seconds. Returns 0, or -1
 * with OUTBOX_ERR_INVALID for bad syntax or a total over
 * PARSE_DURATION_MAX_SECONDS.
 */
int parse_duration(const char *text, int64_t *seconds, struct outbox_error *err);

/* Like parse_duration, in milliseconds, also accepting the unit "ms" (e.g. "250ms", "1s500ms"). */
int parse_duration_ms(const char *text, int64_t *milliseconds, struct outbox_error *err);

/*
 * Parses a decimal integer in [min, max] (digits only, min >= 0). Returns
 * 0, or -1 with OUTBOX_ERR_INVALID.
 */
int parse_integer(const char *text, int64_t min, int64_t max, int64_t *value,
                  struct outbox_error *err);

#endif
