/*
 * option.h - one row of an option table: a command-line option, its
 * OUTBOX_<NAME> variable, its default, its validation and its --help line.
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

#endif
