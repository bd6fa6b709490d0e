/*
 * store_row.c - a claimed row read into an outbox_job (see store_row.h).
 */
#include "store_row.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

const char *
store_row_text_or_null(const PGresult *result, int row, int column)
{
    return PQgetisnull(result, row, column) ? NULL : PQgetvalue(result, row, column);
}

void
store_row_copy_cell(char *out, size_t size, const PGresult *result, int row, int column)
{
    snprintf(out, size, "%s", PQgetvalue(result, row, column));
}

void
store_row_read_job(const PGresult *result, int row, struct outbox_job *job)
{
    job->job_id = strtoll(PQgetvalue(result, row, 0), NULL, 10);
    job->generation = (int32_t)strtol(PQgetvalue(result, row, 1), NULL, 10);
    job->max_attempts = (int32_t)strtol(PQgetvalue(result, row, 2), NULL, 10);
    job->queue = PQgetvalue(result, row, 3);
    job->payload = PQgetvalue(result, row, 4);
    job->payload_len = (size_t)PQgetlength(result, row, 4);
    job->headers = PQgetvalue(result, row, 5);
    job->ordering_key = store_row_text_or_null(result, row, 6);
    job->created_at = strtod(PQgetvalue(result, row, 7), NULL);
    if (!isfinite(job->created_at))
        job->created_at = 0; /* an infinite created_at has no age */
    job->replays = (int32_t)strtol(PQgetvalue(result, row, 8), NULL, 10);
    job->exchange = store_row_text_or_null(result, row, 9);
    job->routing_key = store_row_text_or_null(result, row, 10);
    job->message_uid = PQgetvalue(result, row, 11);
    job->stream_order = NULL;
    job->stream_place = NULL;
}
