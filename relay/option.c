/*
 * option.c - an option's text into its field, by the row's kind, and user
 * text quoted back in a message without a password (see option.h).
 */
#include "option.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "parse.h"
#include "redact.h"

const char *
option_quote(const char *text, char *out)
{
    char *redacted = url_redact(text), *value = NULL, *rest = NULL;
    size_t n = 0;

    /* "name=URL" is not a conninfo url_redact reads a password from: redact the URL too */
    if (redacted != NULL && (value = strchr(redacted, '=')) != NULL)
        rest = url_redact(value + 1);
    if (redacted == NULL || (value != NULL && rest == NULL)) {
        free(redacted);
        snprintf(out, OPTION_QUOTE_MAX + 1, "...");
        return out;
    }
    if (value != NULL) {
        n = (size_t)(value + 1 - redacted);
        if (n > OPTION_QUOTE_MAX)
            n = OPTION_QUOTE_MAX;
        memcpy(out, redacted, n);
        for (size_t i = 0; rest[i] != '\0' && n < OPTION_QUOTE_MAX; i++)
            out[n++] = rest[i];
    } else {
        for (size_t i = 0; redacted[i] != '\0' && n < OPTION_QUOTE_MAX; i++)
            out[n++] = redacted[i];
    }
    out[n] = '\0';
    free(rest);
    free(redacted);
    return outbox_error_quote(out, n + 1, out); /* in place */
}

int
option_set_number(const struct option_spec *spec, char *base, const char *text,
                  const char *source, struct outbox_error *err)
{
    char quoted[OPTION_QUOTE_MAX + 1];
    long long value;
    char *end;

    errno = 0;
    value = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < spec->min || value > spec->max)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "%s: expected a whole number from %.0f to %.0f, got '%s'", source,
                                spec->min, spec->max, option_quote(text, quoted));
    if (spec->kind == OPTION_INT)
        *(int *)base = (int)value;
    else
        *(int64_t *)base = value;
    return 0;
}

int
option_set_duration(const struct option_spec *spec, char *base, const char *text,
                    const char *source, struct outbox_error *err)
{
    char quoted[OPTION_QUOTE_MAX + 1];
    int64_t ms = 0;
    double value;

    if (parse_duration_ms(text, &ms, NULL) != 0)
        ms = -1;
    value = spec->kind == OPTION_MILLIS ? (double)ms : (double)ms / 1000.0;
    if (ms < 0 || value < spec->min || value > spec->max)
        return outbox_error_set(err, OUTBOX_ERR_CONFIG,
                                "%s: expected a duration such as 250ms, 30s, 15m, 24h or 7d"
                                " within range, got '%s'",
                                source, option_quote(text, quoted));
    if (spec->kind == OPTION_SECONDS)
        memcpy(base, &value, sizeof(value)); /* the field is a double */
    else if (spec->size == sizeof(int64_t))
        *(int64_t *)base = (int64_t)llround(value);
    else
        *(int *)base = (int)lround(value);
    return 0;
}

int
option_set_flag(char *base, const char *text, const char *source, struct outbox_error *err)
{
    char quoted[OPTION_QUOTE_MAX + 1];

    if (strcmp(text, "1") == 0 || strcmp(text, "true") == 0 || strcmp(text, "yes") == 0 ||
        strcmp(text, "on") == 0)
        *(bool *)base = true;
    else if (strcmp(text, "0") == 0 || strcmp(text, "false") == 0 || strcmp(text, "no") == 0 ||
             strcmp(text, "off") == 0 || text[0] == '\0')
        *(bool *)base = false;
    else
        return outbox_error_set(err, OUTBOX_ERR_CONFIG, "%s: expected true or false, got '%s'",
                                source, option_quote(text, quoted));
    return 0;
}

int
option_set_choice(const struct option_spec *spec, char *base, const char *text,
                  const char *source, struct outbox_error *err)
{
    char quoted[OPTION_QUOTE_MAX + 1];
    int index = 0;

    for (const char *p = spec->choices;; index++) {
        size_t len = strcspn(p, "|");

        if (strlen(text) == len && strncmp(p, text, len) == 0)
            break;
        if (p[len] == '\0')
            return outbox_error_set(err, OUTBOX_ERR_CONFIG, "%s: expected one of %s, got '%s'",
                                    source, spec->choices, option_quote(text, quoted));
        p += len + 1;
    }
    if (spec->size == sizeof(bool))
        *(bool *)base = index == 1;
    else
        *(int *)base = index;
    return 0;
}
