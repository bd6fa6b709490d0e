/*
 * store_row.h - reading a claimed row into an outbox_job.
 *
 * The claim and the stream read return the same leading columns in the same
 * order: job_id, generation, max_attempts, queue, payload, headers,
 * ordering_key, created_at (epoch seconds), replays, exchange, routing_key.
 * The job's strings point into the result, so the job lives no longer than
 * the PGresult it was read from.
 */
#ifndef OUTBOX_STORE_ROW_H
#define OUTBOX_STORE_ROW_H

#include <libpq-fe.h>

#include "outbox.h"

/*
 * Fills job from row of result (columns 0 to 10 as above; stream_order and
 * stream_place NULL); job borrows result's strings.
 */
void store_row_read_job(const PGresult *result, int row, struct outbox_job *job);

/* NULL for SQL NULL, else the cell's text. */
const char *store_row_text_or_null(const PGresult *result, int row, int column);

#endif
