/*
 * store_producer.c - the producer and consumer side: outbox_enqueue(),
 * outbox_enqueue_many() and the inbox, on the caller's own connection.
 *
 * Every call needs the caller's open, healthy transaction, so the row
 * commits or rolls back with the caller's data; nothing here commits,
 * prepares or keeps state between calls.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "store_array.h"
#include "store_exec.h"

/* clang-format off */
static const char SQL_INBOX_ACCEPT[] = "SELECT outbox.inbox_accept($1, $2)";
static const char SQL_INBOX_ACCEPT_KEY[] = "SELECT outbox.inbox_accept($1, $2, $3)";

static const char SQL_ENQUEUE[] =
    "SELECT outbox.enqueue($1, $2::jsonb, $3, coalesce($4::jsonb, '{}'), $5,"
    " now() + make_interval(secs => $6), $7, $8, $9, $10)";

/* With the message's own trace context, which the caller's headers and the session's yield to. */
static const char SQL_ENQUEUE_TRACED[] =
    "SELECT outbox.enqueue($1, $2::jsonb, $3,"
    " outbox.trace_headers(coalesce($4::jsonb, '{}'), $11, $12), $5,"
    " now() + make_interval(secs => $6), $7, $8, $9, $10)";

/* One row per job id, in payload order. */
static const char SQL_ENQUEUE_BATCH[] =
    "SELECT unnest(outbox.enqueue_batch($1, $2::jsonb[], $3::text[], $4::text[],"
    " coalesce($5::jsonb, '{}'), $6, now() + make_interval(secs => $7), $8, $9, $10))";

/* With the messages' own trace context, as SQL_ENQUEUE_TRACED. */
static const char SQL_ENQUEUE_BATCH_TRACED[] =
    "SELECT unnest(outbox.enqueue_batch($1, $2::jsonb[], $3::text[], $4::text[],"
    " outbox.trace_headers(coalesce($5::jsonb, '{}'), $11, $12), $6,"
    " now() + make_interval(secs => $7), $8, $9, $10))";
/* clang-format on */

/* ---- producer and consumer side ------------------------------------------- */

/*
 * 0 when conn is inside an open, healthy transaction and free for a
 * synchronous statement, else fills err for action: pipeline mode or a
 * command still in progress (the caller's own asynchronous query) are the
 * caller's state to settle, as are an aborted or missing transaction.
 */
static int
require_transaction(PGconn *conn, const char *action, struct outbox_error *err)
{
    if (PQpipelineStatus(conn) != PQ_PIPELINE_OFF)
        return outbox_error_set(err, OUTBOX_ERR_STATE,
                                "unable to %s: the connection is in pipeline mode (this call runs"
                                " its statement synchronously: leave pipeline mode first)",
                                action);
    switch (PQtransactionStatus(conn)) {
    case PQTRANS_INTRANS:
        return 0;
    case PQTRANS_INERROR:
        return outbox_error_set(err, OUTBOX_ERR_STATE, "unable to %s: the transaction is aborted",
                                action);
    case PQTRANS_ACTIVE:
        return outbox_error_set(err, OUTBOX_ERR_STATE,
                                "unable to %s: a command is still in progress on the connection"
                                " (read all its results first)",
                                action);
    case PQTRANS_UNKNOWN:
        return outbox_error_from_pg(err, conn, NULL, "unable to use the connection");
    case PQTRANS_IDLE:
        break;
    }
    return outbox_error_set(err, OUTBOX_ERR_STATE,
                            "unable to %s: no open transaction on the connection"
                            " (BEGIN first, so the row commits with your data)",
                            action);
}

/* The context of an enqueue error: the queue name quoted, control characters as '?'. */
static const char *
enqueue_context(char *out, size_t size, const char *queue)
{
    char quoted[201];

    snprintf(out, size, "unable to enqueue to '%s'", outbox_error_quote(quoted, sizeof(quoted), queue));
    return out;
}

/* One inbox accept: ordering_key NULL is the plain inbox, else the keyed one. */
static int
inbox_accept(PGconn *conn, const char *consumer, const char *message_id,
             const char *ordering_key, bool *accepted, struct outbox_error *err)
{
    const char *values[3] = {consumer, message_id, ordering_key};
    bool keyed = ordering_key != NULL;
    PGresult *result;

    if (accepted == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INVALID,
                                "inbox accept needs somewhere to store its answer (accepted is NULL)");
    *accepted = false;
    if (conn == NULL || consumer == NULL || consumer[0] == '\0' || message_id == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INVALID,
                                "inbox accept needs a consumer name and a message id");
    if (require_transaction(conn, "accept a message", err) != 0)
        return -1;
    result = PQexecParams(conn, keyed ? SQL_INBOX_ACCEPT_KEY : SQL_INBOX_ACCEPT, keyed ? 3 : 2,
                          NULL, values, NULL, NULL, 0);
    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        outbox_error_from_pg(err, conn, result, "unable to accept a message in 'outbox.inbox'");
        PQclear(result);
        return -1;
    }
    *accepted = PQgetvalue(result, 0, 0)[0] == 't';
    PQclear(result);
    return 0;
}

int
outbox_inbox_accept(PGconn *conn, const char *consumer, const char *message_id, bool *accepted,
                    struct outbox_error *err)
{
    return inbox_accept(conn, consumer, message_id, NULL, accepted, err);
}

int
outbox_inbox_accept_in_order(PGconn *conn, const char *consumer, const char *message_id,
                             const char *ordering_key, bool *accepted, struct outbox_error *err)
{
    return inbox_accept(conn, consumer, message_id, ordering_key, accepted, err);
}

/* 0 means the default of 10; a negative value goes to the database, which refuses it (22023). */
static int
attempts_or_default(int32_t max_attempts)
{
    return max_attempts == 0 ? 10 : (int)max_attempts;
}

int
outbox_enqueue(PGconn *conn, const struct outbox_message *message, int64_t *job_id,
               struct outbox_error *err)
{
    char priority[16], delay[32], max_attempts[16];
    const char *values[12];
    bool traced;
    PGresult *result;

    if (conn == NULL || message == NULL || message->queue == NULL || message->payload_json == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INVALID, "enqueue needs a queue and a payload");
    if (require_transaction(conn, "enqueue", err) != 0)
        return -1;
    snprintf(priority, sizeof(priority), "%d", (int)message->priority);
    snprintf(delay, sizeof(delay), "%.6f", message->delay_seconds);
    snprintf(max_attempts, sizeof(max_attempts), "%d", attempts_or_default(message->max_attempts));
    values[0] = message->queue;
    values[1] = message->payload_json;
    values[2] = message->idempotency_key;
    values[3] = message->headers_json;
    values[4] = priority;
    values[5] = delay;
    values[6] = max_attempts;
    values[7] = message->ordering_key;
    values[8] = message->exchange;
    values[9] = message->routing_key;
    values[10] = message->traceparent;
    values[11] = message->tracestate;
    traced = message->traceparent != NULL && message->traceparent[0] != '\0';
    result = PQexecParams(conn, traced ? SQL_ENQUEUE_TRACED : SQL_ENQUEUE, traced ? 12 : 10, NULL,
                          values, NULL, NULL, 0);
    if (PQresultStatus(result) != PGRES_TUPLES_OK) {
        char context[300];

        outbox_error_from_pg(err, conn, result,
                             enqueue_context(context, sizeof(context), message->queue));
        PQclear(result);
        return -1;
    }
    if (job_id != NULL)
        *job_id = strtoll(PQgetvalue(result, 0, 0), NULL, 10);
    PQclear(result);
    return 0;
}

/* Whether two optional strings are equal (both NULL counts as equal). */
static bool
same_text(const char *a, const char *b)
{
    return a == b || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

/* Whether b can go in the same enqueue_batch() call as a. */
static bool
same_batch(const struct outbox_message *a, const struct outbox_message *b)
{
    return strcmp(a->queue, b->queue) == 0 && same_text(a->headers_json, b->headers_json) &&
           a->priority == b->priority && a->max_attempts == b->max_attempts &&
           a->delay_seconds == b->delay_seconds && same_text(a->exchange, b->exchange) &&
           same_text(a->routing_key, b->routing_key) && same_text(a->traceparent, b->traceparent) &&
           same_text(a->tracestate, b->tracestate);
}

/*
 * Adds one array element per message: the string field at offset, or an
 * unquoted NULL. Stores whether any element was not NULL in *any.
 */
static void
array_add_field_of(struct pg_array *a, const struct outbox_message *messages, size_t count,
                   size_t offset, bool *any)
{
    *any = false;
    for (size_t i = 0; i < count; i++) {
        const char *value;

        memcpy(&value, (const char *)&messages[i] + offset, sizeof(value));
        if (value == NULL) {
            store_array_add_null(a);
        } else {
            store_array_add_text(a, value);
            *any = true;
        }
    }
}

/* The numbers among a group's options, as the text the statement takes. */
struct option_text {
    char priority[16];
    char delay[32];
    char max_attempts[16];
};

/* The options every message of a group shares (those of first) into values[4..11]. */
static void
group_option_values(const struct outbox_message *first, struct option_text *text,
                    const char *values[12])
{
    snprintf(text->priority, sizeof(text->priority), "%d", (int)first->priority);
    snprintf(text->delay, sizeof(text->delay), "%.6f", first->delay_seconds);
    snprintf(text->max_attempts, sizeof(text->max_attempts), "%d",
             attempts_or_default(first->max_attempts));
    values[4] = first->headers_json;
    values[5] = text->priority;
    values[6] = text->delay;
    values[7] = text->max_attempts;
    values[8] = first->exchange;
    values[9] = first->routing_key;
    values[10] = first->traceparent;
    values[11] = first->tracestate;
}

/* One enqueue_batch() call for messages[0..count-1], which share their options. */
static int
enqueue_group(PGconn *conn, const struct outbox_message *messages, size_t count, int64_t *job_ids,
              struct outbox_error *err)
{
    const struct outbox_message *first = &messages[0];
    struct pg_array payloads = {0}, idempotency_keys = {0}, ordering_keys = {0};
    struct option_text text;
    char context[300];
    const char *values[12];
    PGresult *result = NULL;
    bool any_payload, any_idempotency_key, any_ordering_key, traced;
    int rc = -1;

    array_add_field_of(&payloads, messages, count, offsetof(struct outbox_message, payload_json),
                       &any_payload);
    array_add_field_of(&idempotency_keys, messages, count,
                       offsetof(struct outbox_message, idempotency_key), &any_idempotency_key);
    array_add_field_of(&ordering_keys, messages, count,
                       offsetof(struct outbox_message, ordering_key), &any_ordering_key);
    values[1] = store_array_finish(&payloads);
    values[2] = store_array_finish(&idempotency_keys);
    values[3] = store_array_finish(&ordering_keys);
    if (values[1] == NULL || values[2] == NULL || values[3] == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        goto cleanup;
    }
    values[0] = first->queue;
    if (!any_idempotency_key)
        values[2] = NULL;
    if (!any_ordering_key)
        values[3] = NULL;
    group_option_values(first, &text, values);
    traced = first->traceparent != NULL && first->traceparent[0] != '\0';
    result = PQexecParams(conn, traced ? SQL_ENQUEUE_BATCH_TRACED : SQL_ENQUEUE_BATCH,
                          traced ? 12 : 10, NULL, values, NULL, NULL, 0);
    if (PQresultStatus(result) != PGRES_TUPLES_OK) {
        outbox_error_from_pg(err, conn, result, enqueue_context(context, sizeof(context), first->queue));
        goto cleanup;
    }
    if ((size_t)PQntuples(result) != count) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "%s: %d job ids returned for %zu rows",
                         enqueue_context(context, sizeof(context), first->queue),
                         PQntuples(result), count);
        goto cleanup;
    }
    for (size_t i = 0; job_ids != NULL && i < count; i++)
        job_ids[i] = strtoll(PQgetvalue(result, (int)i, 0), NULL, 10);
    rc = 0;

cleanup:
    PQclear(result);
    store_array_clear(&payloads);
    store_array_clear(&idempotency_keys);
    store_array_clear(&ordering_keys);
    return rc;
}

int
outbox_enqueue_many(PGconn *conn, const struct outbox_message *messages, size_t count,
                    int64_t *job_ids, struct outbox_error *err)
{
    size_t start = 0;

    if (conn == NULL || (count > 0 && messages == NULL))
        return outbox_error_set(err, OUTBOX_ERR_INVALID, "enqueue needs a queue and a payload");
    for (size_t i = 0; i < count; i++) {
        if (messages[i].queue == NULL || messages[i].payload_json == NULL)
            return outbox_error_set(err, OUTBOX_ERR_INVALID,
                                    "enqueue needs a queue and a payload (message %zu has none)",
                                    i);
    }
    if (require_transaction(conn, "enqueue", err) != 0)
        return -1;
    while (start < count) {
        size_t end = start + 1;

        while (end < count && same_batch(&messages[start], &messages[end]))
            end++;
        if (enqueue_group(conn, messages + start, end - start,
                          job_ids != NULL ? job_ids + start : NULL, err) != 0)
            return -1;
        start = end;
    }
    return 0;
}
