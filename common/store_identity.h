/*
 * store_identity.h - the database's identity and history epoch
 * (sql/015_identity.sql), and the message ids made of them.
 *
 * A relay publishes each row under a message id unique across databases
 * and across the histories of one database (failovers, restores):
 *
 *   <database_id>:<epoch>:<job_id>          a row
 *   <database_id>:<epoch>:<job_id>.r<n>     the row's n-th replay
 *
 * A database migrated with rows from an earlier release keeps the bare job
 * id ("<job_id>", "<job_id>.r<n>") until an operator switches its form;
 * the keys a broker deduplicates on internally (Redis' records) always use
 * the full form. The epoch is observed on each new connection: a connection
 * never outlives a history change (a promotion or a restore ends it).
 */
#ifndef OUTBOX_STORE_IDENTITY_H
#define OUTBOX_STORE_IDENTITY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "outbox.h"

/* A database id: 1-40 characters of [A-Za-z0-9_-]. */
#define STORE_DATABASE_ID_MAX 41

/* The longest message id, with its NUL: 40 + ":" + 10 + ":" + 19 + ".r" + 10. */
#define STORE_MESSAGE_ID_MAX 88

struct store_identity {
    char database_id[STORE_DATABASE_ID_MAX];
    int32_t epoch;          /* the history, from 1; grows at each history change */
    bool job_form;          /* consumers see the bare job id (a database of an earlier release) */
    char history[STORE_DATABASE_ID_MAX + 12]; /* "<database_id>:<epoch>" */
};

/*
 * Reads the identity on conn through outbox.identity_observe(), which first
 * bumps the epoch when the cluster or its timeline changed since recorded.
 * conn must be idle, on a primary. 0, or -1 with err filled
 * (OUTBOX_ERR_SCHEMA before migration 015).
 */
int store_identity_observe(PGconn *conn, struct store_identity *out, struct outbox_error *err);

/*
 * Writes the message id of a row (replay: times it was replayed, 0 for
 * none) into out (STORE_MESSAGE_ID_MAX bytes): the consumers' form when
 * full is false, the full form whatever the database's form when full is
 * true (for keys a broker deduplicates on internally).
 */
void store_message_id_format(const struct store_identity *identity, int64_t job_id, int32_t replay,
                             bool full, char *out);

#endif
