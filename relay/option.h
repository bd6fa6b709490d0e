/*
 * option.h - one row of an option table: a command-line option, its
 * OUTBOX_<NAME> variable, its default, its validation and its --help line;
 * and the readers of a row's text by its kind (option.c).
 *
 * config.c holds the relay's own table; each sink module declares the rows
 * of its broker's options beside its code (sink_internal.h), and config.c
 * reads them all from the sink registry. A row's offset is into the struct
 * its table fills: struct relay_config for the relay's rows, struct
 * sink_options for the options every broker reads, and a broker module's
 * own configuration struct for its rows (sink_option_group_target).
 */
#ifndef OUTBOX_OPTION_H
#define OUTBOX_OPTION_H

#include <stdbool.h>
#include <stddef.h>

/* How an option's text becomes a value. */
enum option_kind {
    OPTION_STRING,  /* char *, at most max_length bytes when max_length > 0 */
    OPTION_LIST,    /* comma-separated queue names (the relay's --queues) */
    OPTION_INT,     /* int within [min, max] */
    OPTION_INT64,   /* int64_t within [min, max] */
    OPTION_SECONDS, /* duration into double seconds, [min, max] */
    OPTION_MILLIS,  /* duration into int milliseconds (int or int64 by field size) */
    OPTION_FLAG,    /* bool, no argument on the command line */
    OPTION_CHOICE,  /* one of the words in choices, as its index (a bool for two) */
};

struct option_spec {
    const char *name; /* without the leading "--" */
    const char *metavar;
    enum option_kind kind;
    size_t offset;        /* field in the table's struct */
    size_t size;          /* field size */
    const char *fallback; /* default as text, parsed like user input; NULL: none */
    double min;
    double max;
    const char *choices; /* OPTION_CHOICE: "a|b" */
    const char *help;
    /*
     * Read from OUTBOX_<NAME> too. Settings are; the action flags (--once,
     * --check, --healthcheck, --help, --version) are not: a variable left in a service's
     * environment must not turn a normal start into something else.
     */
    bool from_environment;
    size_t max_length; /* OPTION_STRING: longest value in bytes; 0: any */
};

#define OPTION_FROM_ENVIRONMENT true
#define OPTION_COMMAND_LINE_ONLY false

/* offset and size of field f of struct type, for a row. */
#define OPTION_FIELD(type, f) offsetof(type, f), sizeof(((type *)0)->f)

struct outbox_error;

/* Longest user text quoted back in a message. */
#define OPTION_QUOTE_MAX 60

/*
 * Copies text for a message into out (OPTION_QUOTE_MAX + 1 bytes):
 * passwords redacted as url_redact does, also in whatever follows the
 * first '=' (as in "--database-url=URL"), at most OPTION_QUOTE_MAX
 * characters, control characters as '?', so a message never shows a
 * password and stays one line. Returns out.
 */
const char *option_quote(const char *text, char *out);

/*
 * Reads text into the field at base by spec's kind; source names where the
 * text came from ("--batch-size", "OUTBOX_BATCH_SIZE") in the error, which
 * is OUTBOX_ERR_CONFIG and quotes the text. 0 or -1.
 *   option_set_number    OPTION_INT, OPTION_INT64: a whole number in [min, max]
 *   option_set_duration  OPTION_SECONDS, OPTION_MILLIS: 250ms, 30s, 15m, 24h, 7d
 *   option_set_flag      OPTION_FLAG: 1/true/yes/on or 0/false/no/off (or "")
 *   option_set_choice    OPTION_CHOICE: one of the words of choices, as its index
 */
int option_set_number(const struct option_spec *spec, char *base, const char *text,
                      const char *source, struct outbox_error *err);
int option_set_duration(const struct option_spec *spec, char *base, const char *text,
                        const char *source, struct outbox_error *err);
int option_set_flag(char *base, const char *text, const char *source, struct outbox_error *err);
int option_set_choice(const struct option_spec *spec, char *base, const char *text,
                      const char *source, struct outbox_error *err);

#endif
