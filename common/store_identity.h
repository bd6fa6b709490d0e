/*
 * store_identity.h - the database's identity and history epoch
 * (sql/015_identity.sql), and the message ids made of them and of the
 * row's own identity (sql/021_message_uid.sql).
 *
 * A relay publishes each row under a message id unique across databases
 * and across the histories of one database (copies, restores, failovers),
 * made of the uuid the row drew at its insert (form uid):
 *
 *   <database_id>:<message_uid>             a row
 *   <database_id>:<message_uid>.r<n>        the row's n-th replay
 *
 * A database of an earlier release keeps its consumers' form until an
 * operator switches it: "<database_id>:<epoch>:<job_id>" (form database)
 * or the bare job id (form job), ".r<n>" after either. The keys a broker
 * deduplicates on internally (Redis' dedup records, NATS' Nats-Msg-Id)
 * always use the form uid. The epoch is observed on each new connection:
 * a connection never outlives a history change the relay can see (a
 * promotion, a restore into another cluster ends it).
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

/* The longest message id, with its NUL: 40 + ":" + 36 (a uuid) + ".r" + 10, and some room. */
#define STORE_MESSAGE_ID_MAX 96

/* The form of the message ids consumers see (outbox.identity.id_form). */
enum store_id_form {
    STORE_ID_FORM_UID,      /* <database_id>:<message_uid> */
    STORE_ID_FORM_DATABASE, /* <database_id>:<epoch>:<job_id> (migration 015 to 020) */
    STORE_ID_FORM_JOB,      /* <job_id> (before migration 015) */
};

struct store_identity {
    char database_id[STORE_DATABASE_ID_MAX];
    int32_t epoch;          /* the history, from 1; grows at each history change seen */
    enum store_id_form form;
    bool history_changed;   /* this observation moved the epoch */
    char history[STORE_DATABASE_ID_MAX + 12]; /* "<database_id>:<epoch>" */
    /*
     * The history's name (sql/026): history, then "." and the token the
     * database drew when its epoch last moved, so two copies that moved on
     * from one history to the same epoch are told apart (a broker's order
     * records are named after it).
     */
    char history_name[STORE_DATABASE_ID_MAX + 26];
};

/*
 * Reads the identity on conn through outbox.identity_observe(), which first
 * bumps the epoch when the cluster or its timeline changed since recorded
 * (history_changed then). conn must be idle, on a primary. 0, or -1 with
 * err filled (OUTBOX_ERR_SCHEMA before migration 026).
 */
int store_identity_observe(PGconn *conn, struct store_identity *out, struct outbox_error *err);

/* The name of a form, as outbox.identity.id_form spells it. */
const char *store_id_form_name(enum store_id_form form);

/* Which id of a row store_message_id_format() writes. */
enum store_message_id_kind {
    STORE_MESSAGE_ID, /* the consumers' id, in the database's form */
    STORE_DEDUP_ID,   /* the form uid whatever the database's (keys a broker deduplicates on) */
};

/*
 * Writes the id of kind of a row (its job id, its message_uid text,
 * replay: times it was replayed, 0 for none) into out
 * (STORE_MESSAGE_ID_MAX bytes).
 */
void store_message_id_format(const struct store_identity *identity, int64_t job_id,
                             const char *message_uid, int32_t replay,
                             enum store_message_id_kind kind, char *out);

#endif
