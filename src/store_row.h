/*
 * store_row.h - reading a claimed row into an outbox_job.
 *
 * The claim and the stream read return the same leading columns in the same
 * order: job_id, generation, max_attempts, queue, payload, headers,
 * ordering_key, created_at (epoch seconds), replays, exchange, routing_key,
 * message_uid (STORE_SQL_MESSAGE_UID). The job's strings point into the result, so the job lives no longer than
 * the PGresult it was read from.
 */
#ifndef OUTBOX_STORE_ROW_H
#define OUTBOX_STORE_ROW_H

#include <libpq-fe.h>

#include "outbox.h"

/*
 * The row's own identity, as text (sql/021_message_uid.sql): its
 * message_uid, or for a row inserted before migration 021 (NULL there) a
 * uuid made of its job id and insert time: the same for the row in every
 * history it is copied into, another for a row inserted under the same job
 * id in another history. j is the statement's alias of outbox.job. The time
 * is written as extract() gives it (numeric text), which no session setting
 * changes.
 */
#define STORE_SQL_MESSAGE_UID(j)                                                                   \
    "coalesce(" j ".message_uid, md5(" j ".job_id::text || '@' ||"                                 \
    " extract(epoch FROM " j ".created_at)::text)::uuid)::text"

/*
 * Fills job from row of result (columns 0 to 11 as above; stream_order and
 * stream_place NULL); job borrows result's strings.
 */
void store_row_read_job(const PGresult *result, int row, struct outbox_job *job);

/* NULL for SQL NULL, else the cell's text. */
const char *store_row_text_or_null(const PGresult *result, int row, int column);

/* Copies the cell's text into out, cut to size; "" for SQL NULL. */
void store_row_copy_cell(char *out, size_t size, const PGresult *result, int row, int column);

#endif
