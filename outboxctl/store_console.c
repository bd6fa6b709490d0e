/*
 * store_console.c - the console's queries: overview, streams and chart
 * (see store_console.h; its dead rows are in store_dead.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "error.h"
#include "store_admin_sql.h"
#include "store_console.h"

/* clang-format off */

/* The rows of cursor c's partition still in the stream, as job_stream_idx holds them. */
#define STREAM_ROW_OF_CURSOR \
    " j.state = 'stream' AND j.queue = c.queue AND j.stream_partition = c.partition"

/*
 * Per queue: ready (due or not, held included), running and dead from
 * their partial indexes; succeeded exactly ($1 true) or as the planner's
 * share of the queue in the table minus the unfinished rows ($1 false),
 * with the margin of that share (the last column; 0 when exact).
 * Stream rows, counted as `outboxctl status` counts them, come from
 * job_stream_idx one partition at a time: those waiting after the cursor
 * always (their cost follows the lag), those published behind it only
 * with $1; beyond that the planner's share of a stream queue, minus the
 * exact counts, is its published estimate (its few succeeded rows, which
 * left the stream and were claimed, included). Queue names come from the
 * same indexes, the statistics, the pauses and the streams.
 */
static const char queues_sql[] =
    "WITH ready AS ("
    "    SELECT queue, count(*) AS n,"
    "           min(run_at) FILTER (WHERE run_at <= now() AND isfinite(run_at)) AS oldest"
    "      FROM outbox.job WHERE state = 'ready' AND NOT held GROUP BY queue),"
    " held AS (SELECT queue, count(*) AS n FROM outbox.job WHERE held GROUP BY queue),"
    " running AS (SELECT queue, count(*) AS n FROM outbox.job WHERE state = 'running' GROUP BY queue),"
    " dead AS (SELECT queue, count(*) AS n FROM outbox.job WHERE state = 'dead' GROUP BY queue),"
    " exact AS (SELECT queue, count(*) AS n FROM outbox.job"
    "            WHERE $1::boolean AND state = 'succeeded' GROUP BY queue),"
    " stream AS ("
    "    SELECT c.queue, sum(w.n) AS waiting, sum(p.n) AS published, min(w.oldest) AS oldest"
    "      FROM outbox.stream_cursor AS c"
    "     CROSS JOIN LATERAL (SELECT count(*) AS n,"
    "                                min(j.created_at) FILTER (WHERE isfinite(j.created_at)) AS oldest"
    "                           FROM outbox.job AS j WHERE" STREAM_ROW_OF_CURSOR
    "                            AND " STREAM_WAITING ") AS w"
    "     CROSS JOIN LATERAL (SELECT count(*) AS n FROM outbox.job AS j"
    "                          WHERE $1::boolean AND" STREAM_ROW_OF_CURSOR
    "                            AND " STREAM_PUBLISHED ") AS p"
    "     GROUP BY c.queue),"
    /*
     * The planner's sample of queue (pg_stats): a most common value's share
     * of reltuples; any other queue the share left over, spread evenly over
     * the distinct queues outside that list (as the planner itself assumes).
     * The margin is 1.96 standard errors of a share in a sample of the rows
     * ANALYZE read (300 x the column's statistics target), in rows.
     */
    " stats AS ("
    "    SELECT s.most_common_vals::text::text[] AS vals, s.most_common_freqs AS freqs,"
    "           s.histogram_bounds::text::text[] AS bounds, greatest(c.reltuples, 0) AS tuples,"
    "           (1 - s.null_frac - coalesce((SELECT sum(f) FROM unnest(s.most_common_freqs) AS f), 0))"
    "             / greatest(CASE WHEN s.n_distinct < 0 THEN -s.n_distinct * greatest(c.reltuples, 0)"
    "                             ELSE s.n_distinct END"
    "                        - coalesce(cardinality(s.most_common_freqs), 0), 1) AS other_freq,"
    "           least(greatest(c.reltuples, 1), 300.0 * CASE WHEN a.attstattarget > 0"
    "                 THEN a.attstattarget ELSE current_setting('default_statistics_target')::int"
    "                 END) AS sample"
    "      FROM pg_stats AS s CROSS JOIN pg_class AS c"
    "      JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attname = 'queue'"
    "     WHERE NOT $1::boolean AND s.schemaname = 'outbox' AND s.tablename = 'job'"
    "       AND s.attname = 'queue' AND c.oid = 'outbox.job'::regclass),"
    " estimate AS ("
    "    SELECT v.queue, v.freq FROM stats"
    "     CROSS JOIN unnest(stats.vals, stats.freqs) AS v(queue, freq)"
    "     WHERE v.queue IS NOT NULL),"
    " sampled AS ("
    "    SELECT b.queue FROM stats CROSS JOIN unnest(stats.bounds) AS b(queue)),"
    " names AS (SELECT queue FROM ready UNION SELECT queue FROM held UNION SELECT queue FROM running"
    "           UNION SELECT queue FROM dead UNION SELECT queue FROM exact"
    "           UNION SELECT queue FROM estimate UNION SELECT queue FROM sampled"
    "           UNION SELECT queue FROM outbox.paused UNION SELECT queue FROM stream),"
    " share AS ("
    "    SELECT n.queue, coalesce(e.freq, st.other_freq) AS freq, st.tuples, st.sample"
    "      FROM names AS n CROSS JOIN stats AS st LEFT JOIN estimate AS e USING (queue)),"
    " rest AS ("
    "    SELECT n.queue,"
    "           greatest(coalesce((f.freq * f.tuples)::bigint, 0) - coalesce(r.n, 0)"
    "                    - coalesce(h.n, 0) - coalesce(u.n, 0) - coalesce(d.n, 0)"
    "                    - coalesce(s.waiting, 0), 0) AS n,"
    "           coalesce(ceil(1.96 * sqrt(greatest(f.freq * (1 - f.freq), 0) / f.sample)"
    "                         * f.tuples), 0)::bigint AS margin"
    "      FROM names AS n LEFT JOIN share AS f USING (queue)"
    "      LEFT JOIN ready AS r USING (queue) LEFT JOIN held AS h USING (queue)"
    "      LEFT JOIN running AS u USING (queue) LEFT JOIN dead AS d USING (queue)"
    "      LEFT JOIN stream AS s USING (queue))"
    " SELECT n.queue, coalesce(r.n, 0) + coalesce(h.n, 0), coalesce(u.n, 0),"
    "        CASE WHEN $1::boolean THEN coalesce(x.n, 0) WHEN s.queue IS NULL THEN t.n ELSE 0 END,"
    "        coalesce(d.n, 0),"
    "        greatest(coalesce(extract(epoch FROM now())"
    "                          - extract(epoch FROM least(r.oldest, s.oldest)), 0), 0)::float8,"
    "        CASE WHEN $1::boolean THEN coalesce(s.published, 0) WHEN s.queue IS NULL THEN 0"
    "             ELSE t.n END,"
    "        coalesce(s.waiting, 0), s.queue IS NOT NULL,"
    "        CASE WHEN $1::boolean THEN 0 ELSE coalesce(t.margin, 0) END"
    "   FROM names AS n"
    "   LEFT JOIN ready AS r USING (queue) LEFT JOIN held AS h USING (queue)"
    "   LEFT JOIN running AS u USING (queue) LEFT JOIN dead AS d USING (queue)"
    "   LEFT JOIN exact AS x USING (queue) LEFT JOIN stream AS s USING (queue)"
    "   LEFT JOIN rest AS t USING (queue)"
    "  ORDER BY n.queue";

static const char small_table_sql[] =
    "SELECT pg_relation_size('outbox.job') <= $1::bigint";

static const char relays_sql[] =
    "SELECT worker_id, count(*),"
    "       extract(epoch FROM min(lease_until) - now())::float8,"
    "       extract(epoch FROM max(lease_until) - now())::float8"
    "  FROM outbox.job WHERE state = 'running' AND isfinite(lease_until)"
    " GROUP BY worker_id ORDER BY worker_id";

static const char lease_present_sql[] =
    "SELECT to_regclass('outbox.database_lease') IS NOT NULL";

static const char lease_sql[] =
    "SELECT " ISO_UTC("paused_at") ", paused_by, reason, owner, " ISO_UTC("lease_until")
    "  FROM outbox.database_lease";

static const char chart_start_sql[] =
    "SELECT floor(extract(epoch FROM now()) / 60)::bigint * 60 - 60 * ($1::int - 1)";

/*
 * The minute of each row from date_part() (float8), not extract() (numeric
 * since PostgreSQL 14): a third less CPU per row of the last hour.
 */
static const char chart_published_sql[] =
    "SELECT floor(date_part('epoch', finished_at) / 60)::bigint * 60, count(*)"
    "  FROM outbox.job WHERE state = 'succeeded' AND finished_at >= to_timestamp($1::bigint)"
    " GROUP BY 1";

/*
 * Rows created since $1 (epoch seconds), per minute. A binary search over
 * the primary key finds the first job_id created since then (job ids grow
 * with created_at), in about 20 probes of one row each, so the count reads
 * only the rows of the last hour and never scans the table.
 */
static const char chart_enqueued_sql[] =
    "WITH RECURSIVE search(low, high) AS ("
    "    SELECT (SELECT min(job_id) FROM outbox.job), (SELECT max(job_id) FROM outbox.job)"
    "  UNION ALL"
    "    SELECT CASE WHEN p.after THEN s.low ELSE s.mid + 1 END,"
    "           CASE WHEN p.after THEN s.mid - 1 ELSE s.high END"
    "      FROM (SELECT low, high, low + (high - low) / 2 AS mid FROM search"
    "             WHERE low <= high) AS s"
    "     CROSS JOIN LATERAL (SELECT coalesce((SELECT j.created_at >= to_timestamp($1::bigint)"
    "                                            FROM outbox.job AS j WHERE j.job_id >= s.mid"
    "                                           ORDER BY j.job_id LIMIT 1), true) AS after) AS p"
    "), first AS (SELECT coalesce(max(low), 0) AS job_id FROM search WHERE low > high)"
    " SELECT floor(date_part('epoch', created_at) / 60)::bigint * 60, count(*)"
    "   FROM outbox.job"
    "  WHERE job_id >= (SELECT job_id FROM first) AND created_at >= to_timestamp($1::bigint)"
    "  GROUP BY 1";

/* clang-format on */

/* Sets *small when outbox.job is small enough to count succeeded rows exactly. */
static int
table_is_small(PGconn *conn, bool *small, struct outbox_error *err)
{
    char limit[24];
    const char *params[1] = {limit};
    PGresult *result;

    snprintf(limit, sizeof(limit), "%lld", (long long)STORE_CONSOLE_EXACT_BYTES);
    result = store_admin_exec(conn, small_table_sql, 1, params);
    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1)
        return store_admin_fail_clear(err, conn, result, "unable to read the size of 'outbox.job'");
    *small = strcmp(PQgetvalue(result, 0, 0), "t") == 0;
    PQclear(result);
    return 0;
}

static int
read_queues(PGconn *conn, struct store_console_overview *overview, struct outbox_error *err)
{
    struct store_status *status = &overview->status;
    const char *params[1] = {overview->succeeded_estimated ? "false" : "true"};
    PGresult *result = store_admin_exec(conn, queues_sql, 1, params);
    bool failed = false;

    if (PQresultStatus(result) != PGRES_TUPLES_OK)
        return store_admin_fail_clear(err, conn, result, "unable to count jobs per queue");
    store_admin_fill_queues(result, status, &failed);
    PQclear(result);
    if (failed)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    return 0;
}

static int
read_relays(PGconn *conn, struct store_console_overview *overview, struct outbox_error *err)
{
    PGresult *result = PQexec(conn, relays_sql);
    bool failed = false;
    int rows;

    if (PQresultStatus(result) != PGRES_TUPLES_OK)
        return store_admin_fail_clear(err, conn, result,
                                      "unable to list the relays holding leases");
    rows = PQntuples(result);
    if (rows > 0 && (overview->relays = calloc((size_t)rows, sizeof(*overview->relays))) == NULL)
        failed = true;
    for (int row = 0; row < rows && !failed; row++) {
        struct store_console_relay *relay = &overview->relays[row];

        overview->relay_count++;
        relay->worker_id = store_admin_text(result, row, 0, &failed);
        relay->rows = store_admin_int64(result, row, 1);
        relay->lease_min_seconds = store_admin_double(result, row, 2);
        relay->lease_max_seconds = store_admin_double(result, row, 3);
    }
    PQclear(result);
    if (failed)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    return 0;
}

int
store_console_overview(PGconn *conn, unsigned parts, struct store_console_overview *overview,
                       struct outbox_error *err)
{
    bool queues = (parts & STORE_CONSOLE_QUEUES) != 0, small = true;
    unsigned status_parts = ((parts & STORE_CONSOLE_TABLE) ? STORE_STATUS_TABLE : 0) |
                            ((parts & STORE_CONSOLE_BLOCKED) ? STORE_STATUS_BLOCKED : 0) |
                            (queues ? STORE_STATUS_BLOCKED_COUNTS : 0) |
                            ((parts & (STORE_CONSOLE_QUEUES | STORE_CONSOLE_PAUSED))
                                 ? STORE_STATUS_PAUSED : 0);

    memset(overview, 0, sizeof(*overview));
    if (store_admin_check_schema(conn, err) < 0 ||
        (queues && table_is_small(conn, &small, err) < 0))
        return -1;
    overview->succeeded_estimated = !small;
    if ((queues && read_queues(conn, overview, err) < 0) ||
        store_admin_status_parts(conn, status_parts, &overview->status, err) < 0 ||
        ((parts & STORE_CONSOLE_RELAYS) && read_relays(conn, overview, err) < 0)) {
        store_console_overview_clear(overview);
        return -1;
    }
    return 0;
}

void
store_console_overview_clear(struct store_console_overview *overview)
{
    if (overview == NULL)
        return;
    store_status_clear(&overview->status);
    for (size_t i = 0; i < overview->relay_count; i++)
        free(overview->relays[i].worker_id);
    free(overview->relays);
    memset(overview, 0, sizeof(*overview));
}

int
store_console_streams(PGconn *conn, struct store_console_streams *streams,
                      struct outbox_error *err)
{
    memset(streams, 0, sizeof(*streams));
    if (store_admin_check_schema(conn, err) < 0 ||
        stream_admin_lag(conn, &streams->partitions, &streams->count, err) < 0)
        return -1;
    if (streams->count > 0 && stream_admin_horizon(conn, &streams->horizon, err) < 0) {
        store_console_streams_clear(streams);
        return -1;
    }
    return 0;
}

void
store_console_streams_clear(struct store_console_streams *streams)
{
    if (streams == NULL)
        return;
    free(streams->partitions);
    memset(streams, 0, sizeof(*streams));
}

/* Adds the (minute, count) rows of result into column. */
static void
add_minutes(const PGresult *result, const struct store_console_chart *chart, int64_t *column)
{
    for (int row = 0; row < PQntuples(result); row++) {
        int64_t minute = store_admin_int64(result, row, 0);
        int64_t index = (minute - chart->minute_epoch[0]) / 60;

        if (index >= 0 && index < STORE_CONSOLE_CHART_MINUTES)
            column[index] += store_admin_int64(result, row, 1);
    }
}

int
store_console_chart(PGconn *conn, int64_t from_epoch, struct store_console_chart *chart,
                    struct outbox_error *err)
{
    char minutes[8], start_text[24];
    const char *params[1] = {minutes};
    PGresult *result;

    memset(chart, 0, sizeof(*chart));
    snprintf(minutes, sizeof(minutes), "%d", STORE_CONSOLE_CHART_MINUTES);
    result = store_admin_exec(conn, chart_start_sql, 1, params);
    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1)
        return store_admin_fail_clear(err, conn, result,
                                      "unable to read the traffic of the last hour");
    chart->minute_epoch[0] = store_admin_int64(result, 0, 0);
    PQclear(result);
    for (int i = 1; i < STORE_CONSOLE_CHART_MINUTES; i++)
        chart->minute_epoch[i] = chart->minute_epoch[0] + 60 * i;
    snprintf(start_text, sizeof(start_text), "%lld",
             (long long)(from_epoch > chart->minute_epoch[0] ? from_epoch : chart->minute_epoch[0]));

    params[0] = start_text;
    result = store_admin_exec(conn, chart_published_sql, 1, params);
    if (PQresultStatus(result) != PGRES_TUPLES_OK)
        return store_admin_fail_clear(err, conn, result, "unable to count the rows published");
    add_minutes(result, chart, chart->published);
    PQclear(result);

    result = store_admin_exec(conn, chart_enqueued_sql, 1, params);
    if (PQresultStatus(result) != PGRES_TUPLES_OK)
        return store_admin_fail_clear(err, conn, result, "unable to count the rows enqueued");
    add_minutes(result, chart, chart->enqueued);
    PQclear(result);
    return 0;
}

/* The whole database's pause and lease, when migration 018 made them. */
static int
read_lease(PGconn *conn, struct store_console_database *database, struct outbox_error *err)
{
    PGresult *result = PQexec(conn, lease_present_sql);
    char **cells[] = {&database->paused_at, &database->paused_by, &database->pause_reason,
                      &database->lease_owner, &database->lease_until};
    bool failed = false;

    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1)
        return store_admin_fail_clear(err, conn, result, "unable to read the database lease");
    database->lease_present = strcmp(PQgetvalue(result, 0, 0), "t") == 0;
    PQclear(result);
    if (!database->lease_present)
        return 0;
    result = PQexec(conn, lease_sql);
    if (PQresultStatus(result) != PGRES_TUPLES_OK)
        return store_admin_fail_clear(err, conn, result, "unable to read the database lease");
    for (int column = 0; column < 5 && PQntuples(result) == 1; column++)
        *cells[column] = store_admin_text(result, 0, column, &failed);
    PQclear(result);
    return failed ? outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory") : 0;
}

int
store_console_database(PGconn *conn, struct store_console_database *database,
                       struct outbox_error *err)
{
    struct store_console_overview overview;

    memset(database, 0, sizeof(*database));
    if (store_console_overview(conn, STORE_CONSOLE_QUEUES, &overview, err) < 0)
        return -1;
    for (size_t i = 0; i < overview.status.queue_count; i++) {
        const struct store_queue_status *queue = &overview.status.queues[i];

        database->ready += queue->ready;
        database->running += queue->running;
        database->dead += queue->dead;
        database->waiting += queue->stream_waiting;
    }
    store_console_overview_clear(&overview);
    if (outbox_schema_version(conn, &database->schema_version, err) < 0 ||
        store_admin_identity(conn, &database->identity, &database->identity_present, err) < 0 ||
        read_lease(conn, database, err) < 0) {
        store_console_database_clear(database);
        return -1;
    }
    return 0;
}

void
store_console_database_clear(struct store_console_database *database)
{
    if (database == NULL)
        return;
    free(database->paused_at);
    free(database->paused_by);
    free(database->pause_reason);
    free(database->lease_owner);
    free(database->lease_until);
    memset(database, 0, sizeof(*database));
}
