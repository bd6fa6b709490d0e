/*
 * store_connect.h - connecting a store with some of its steps left out, for
 * the relay's short visits of a list's databases. Not exported from the
 * library: outbox_store_connect() takes every step.
 */
#ifndef OUTBOX_STORE_CONNECT_H
#define OUTBOX_STORE_CONNECT_H

#include <stdbool.h>

#include "outbox.h"

/* The steps a connect may leave out; all false is outbox_store_connect(). */
struct store_connect_options {
    bool prepare_lazily; /* each statement prepared at its first run, not all at connect */
    bool checked;        /* an earlier connection passed the schema check and the audit */
    int lock_timeout_ms; /* the session's lock_timeout; 0: STORE_STATEMENT_TIMEOUT_SECONDS */
};

/* Connects as outbox_store_connect() does, leaving out what options say. NULL with err. */
outbox_store *store_connect(const char *database_url, const char *worker_id,
                            const struct store_connect_options *options, struct outbox_error *err);

#endif
