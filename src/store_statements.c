/*
 * store_statements.c - every statement a store prepares, and what each needs.
 *
 * The SQL the store sends on its own connection lives here and nowhere
 * else, one row of store_statements[] per statement: its server-side name,
 * its text (bound parameters only), and the privileges it needs, which the
 * privilege audit walks. A new statement names its needs in its row: the
 * tables it reads or writes, the functions it calls, and
 * outbox.headers_are_strings() when it updates outbox.job (the CHECK
 * constraint called it on every update before migration 013, which states
 * the rule in the constraint itself; older schemas still call it).
 *
 * Each statement runs alone in autocommit, so every claim, extend,
 * complete, fail, release, reap and cleanup batch is its own short READ
 * COMMITTED transaction and no row lock outlives the call. Fenced writes
 * (extend, complete, fail, release) first lock the named rows in a
 * MATERIALIZED CTE, then update only those still owned: state running, same
 * worker, same generation, lease in the future, checked with
 * clock_timestamp() after the lock is held, so time spent waiting for the
 * lock never counts in the owner's favour. Rows not returned are "lease lost".
 *
 * Lock order: a statement that waits for row locks of outbox.job takes all
 * of them in one pass in job_id order, before it updates any row (claims,
 * reaps and cleanups skip locked rows and never wait). Two statements
 * waiting on each other would each hold a row the other wants next, which
 * one ascending order rules out.
 */
#include "outbox.h"
#include "store_row.h"
#include "store_statements.h"

/*
 * The rows of outbox.job whose job_id the CTE cte lists, found through the
 * primary key. A join with the CTE leaves the plan to the row estimates, and
 * a claim or mark of 500 rows against a table of some 20 000 (a small
 * database's queue with its succeeded rows kept for retention) was planned
 * as a hash join over a sequential scan of the whole table, on every call:
 * 500 index probes cost about as much by the planner's page costs, and a
 * tenth as much when the pages are cached. An array built at run time is
 * estimated small, so the primary key is used whatever the table's size.
 */
#define ROW_OF(cte) "j.job_id = ANY (ARRAY(SELECT job_id FROM " cte "))"

/*
 * The claim. The candidate scan follows job_ready_idx (or job_ready_queue_idx
 * with a queue filter) and stops after $2 unlocked rows; SKIP LOCKED passes
 * over rows another claim is taking right now. A row with an ordering key is
 * a candidate only when no earlier row of its key is unfinished: that earlier
 * row is still 'ready' in this statement's snapshot even while another relay
 * holds it locked and uncommitted, so a key never has two rows in flight.
 *
 * Pauses (outbox.paused) reach the claim as constant arrays the store reads
 * every STORE_PAUSES_MAX_AGE_SECONDS, never as a join: with nothing paused
 * the claim is the plain statement, and with pauses the planner sees the
 * paused names themselves, so its estimates stay those of the plain claim
 * (a join with outbox.paused misjudged them by orders of magnitude, enough
 * to JIT-compile every claim). Paused queues are left out by a comparison
 * per candidate, paused keys by a hash of the (queue, key) pairs built once.
 *
 * The copy may be older than the claim's snapshot by more than that age: a
 * claim sent while a broker stalled the turn, or queued behind a statement
 * a lock held up, runs seconds later. So each claim checks once, in its own
 * snapshot, that every pause in outbox.paused is in its copy (an
 * uncorrelated subquery: one scan of the small table, a filter of the whole
 * statement that leaves the estimates of the candidate scan alone); when
 * one is not, it claims nothing until the store's next read of the pauses
 * (due by then: the copy is older than the pause).
 */
#define CLAIM_CANDIDATES(queue_filter, pause_filter)                                               \
    "WITH candidate AS MATERIALIZED ("                                                             \
    " SELECT c.job_id FROM outbox.job AS c"                                                        \
    " WHERE c.state = 'ready' AND NOT c.held AND c.run_at <= statement_timestamp()" queue_filter   \
    "   AND (c.ordering_key IS NULL OR NOT EXISTS ("                                               \
    "     SELECT 1 FROM outbox.job AS e"                                                           \
    "     WHERE e.queue = c.queue AND e.ordering_key = c.ordering_key AND e.job_id < c.job_id"     \
    "       AND (e.state IN ('ready', 'running') OR ($4 AND e.state = 'dead'))))" pause_filter     \
    " ORDER BY c.priority DESC, c.run_at, c.job_id"                                                \
    " LIMIT $2"                                                                                    \
    " FOR UPDATE SKIP LOCKED)"                                                                     \
    " UPDATE outbox.job AS j"                                                                      \
    " SET state = 'running', attempts = j.attempts + 1, worker_id = $1,"                           \
    "     lease_until = clock_timestamp() + make_interval(secs => $3)"                             \
    " WHERE " ROW_OF("candidate")                                                                  \
    " RETURNING j.job_id, j.attempts, j.max_attempts, j.queue, j.payload::text,"                   \
    "           j.headers::text, j.ordering_key, extract(epoch FROM j.created_at)::float8,"         \
    "           j.replays, j.exchange, j.routing_key, " STORE_SQL_MESSAGE_UID("j") ","            \
    "           CASE WHEN j.stream_epoch IS NOT NULL AND j.job_id >= 0"                            \
    "                THEN j.stream_epoch || ':' || j.stream_partition END,"                        \
    "           CASE WHEN j.stream_epoch IS NOT NULL AND j.job_id >= 0"                            \
    "                THEN lpad(j.xid::text, 20, '0') || lpad(j.job_id::text, 19, '0') END"

/* With no pause in the copy: none in the claim's snapshot either. */
#define NO_PAUSE_GATE "   AND NOT EXISTS (SELECT 1 FROM outbox.paused)"

/*
 * Paused queues ($N), and paused keys as (queue, key) pairs ($N+1, $N+2);
 * and no pause in the claim's snapshot that the copy misses.
 */
#define PAUSE_FILTER(queues, key_queues, keys)                                                     \
    "   AND c.queue <> ALL (" queues "::text[])"                                                   \
    "   AND (c.ordering_key IS NULL OR (c.queue, c.ordering_key) NOT IN ("                         \
    "     SELECT * FROM unnest(" key_queues "::text[], " keys "::text[])))"                        \
    "   AND NOT EXISTS (SELECT 1 FROM outbox.paused AS p"                                          \
    "     WHERE CASE WHEN p.ordering_key IS NULL THEN p.queue <> ALL (" queues "::text[])"         \
    "           ELSE (p.queue, p.ordering_key) NOT IN ("                                           \
    "             SELECT * FROM unnest(" key_queues "::text[], " keys "::text[])) END)"

#define QUEUE_FILTER " AND c.queue = ANY ($5::text[])"

static const char SQL_CLAIM_ALL[] = CLAIM_CANDIDATES("", NO_PAUSE_GATE);
static const char SQL_CLAIM_QUEUES[] = CLAIM_CANDIDATES(QUEUE_FILTER, NO_PAUSE_GATE);
static const char SQL_CLAIM_ALL_PAUSED[] = CLAIM_CANDIDATES("", PAUSE_FILTER("$5", "$6", "$7"));
static const char SQL_CLAIM_QUEUES_PAUSED[] =
    CLAIM_CANDIDATES(QUEUE_FILTER, PAUSE_FILTER("$6", "$7", "$8"));

/* The pauses as three array literals: whole queues, then (queue, key) pairs. */
static const char SQL_PAUSES[] =
    "SELECT count(*),"
    "       coalesce(array_agg(queue ORDER BY queue) FILTER (WHERE ordering_key IS NULL), '{}'),"
    "       coalesce(array_agg(queue ORDER BY queue, ordering_key)"
    "                FILTER (WHERE ordering_key IS NOT NULL), '{}'),"
    "       coalesce(array_agg(ordering_key ORDER BY queue, ordering_key)"
    "                FILTER (WHERE ordering_key IS NOT NULL), '{}')"
    " FROM outbox.paused";

/* Locks the rows named by the input lease arrays, in job_id order to avoid deadlocks. */
#define LOCK_OWNED(input)                                                                          \
    "WITH input AS (SELECT * FROM " input "),"                                                     \
    " owned AS MATERIALIZED ("                                                                     \
    "  SELECT j.job_id FROM outbox.job AS j WHERE " ROW_OF("input")                                \
    "  ORDER BY j.job_id FOR UPDATE OF j)"

/*
 * LOCK_OWNED for the marks that finish rows: with the named rows, the first
 * waiting (held) row of each of their keys, which RELEASE_NEXT_OF_KEY may
 * update, all in one pass in job_id order. Locked after the named rows in
 * the order of the keys instead, a mark and the sweep (or two marks) that
 * free the same waiting rows of two keys took them in opposite orders and
 * PostgreSQL killed one with "deadlock detected". The statement's snapshot
 * gives RELEASE_NEXT_OF_KEY the same first waiting rows as here.
 */
#define LOCK_OWNED_AND_NEXT(input)                                                                 \
    "WITH input AS (SELECT * FROM " input "),"                                                     \
    " named AS MATERIALIZED ("                                                                     \
    "  SELECT j.job_id, j.queue, j.ordering_key FROM outbox.job AS j WHERE " ROW_OF("input") "),"  \
    " owned AS MATERIALIZED ("                                                                     \
    "  SELECT j.job_id FROM outbox.job AS j WHERE " ROW_OF("(SELECT job_id FROM named UNION"         \
    "   SELECT (SELECT h.job_id FROM outbox.job AS h"                                              \
    "           WHERE h.held AND h.queue = n.queue AND h.ordering_key = n.ordering_key"            \
    "           ORDER BY h.job_id LIMIT 1)"                                                        \
    "   FROM named AS n WHERE n.ordering_key IS NOT NULL) AS l")                                   \
    "  ORDER BY j.job_id FOR UPDATE OF j)"

/* The ownership check, evaluated on the locked, latest row version. */
#define STILL_OWNED                                                                                \
    " WHERE j.job_id = input.job_id AND " ROW_OF("owned")                                          \
    "   AND j.state = 'running' AND j.worker_id = $1 AND j.attempts = input.generation"            \
    "   AND j.lease_until > clock_timestamp()"

#define LEASE_INPUT "unnest($2::bigint[], $3::int[]) AS l(job_id, generation)"

static const char SQL_EXTEND[] =
    LOCK_OWNED(LEASE_INPUT) " UPDATE outbox.job AS j"
                            " SET lease_until = clock_timestamp() + make_interval(secs => $4)"
                            " FROM input" STILL_OWNED " RETURNING j.job_id";

/*
 * When a row of an ordering key finishes, the key's next row (the first held
 * one) stops waiting. finished is a CTE of (job_id, queue, ordering_key, frees).
 */
#define RELEASE_NEXT_OF_KEY                                                                        \
    ", next_of_key AS ("                                                                           \
    "  SELECT (SELECT h.job_id FROM outbox.job AS h"                                               \
    "          WHERE h.held AND h.queue = f.queue AND h.ordering_key = f.ordering_key"             \
    "          ORDER BY h.job_id LIMIT 1) AS job_id"                                               \
    "  FROM finished AS f WHERE f.ordering_key IS NOT NULL AND f.frees),"                          \
    " released AS ("                                                                               \
    "  UPDATE outbox.job AS j SET held = false"                                                    \
    "  WHERE " ROW_OF("next_of_key") " AND j.held)"

/* The statements below keep their own layout. */
/* clang-format off */
static const char SQL_COMPLETE[] =
    LOCK_OWNED_AND_NEXT(LEASE_INPUT) ", finished AS ("
    " UPDATE outbox.job AS j"
    " SET state = 'succeeded', worker_id = NULL, lease_until = NULL,"
    "     finished_at = clock_timestamp()"
    " FROM input" STILL_OWNED
    " RETURNING j.job_id, j.queue, j.ordering_key, true AS frees)"
    RELEASE_NEXT_OF_KEY " SELECT job_id FROM finished";

/*
 * The complete of --on-success delete: the same lock, the same fence, the
 * same release of the key's next row, but the row goes instead of staying
 * as succeeded. A delete writes no new row version and no index entry (the
 * mark writes a version with entries in the primary key and
 * job_succeeded_idx, which retention deletes again later).
 */
static const char SQL_COMPLETE_DELETE[] =
    LOCK_OWNED_AND_NEXT(LEASE_INPUT) ", finished AS ("
    " DELETE FROM outbox.job AS j"
    " USING input" STILL_OWNED
    " RETURNING j.job_id, j.queue, j.ordering_key, true AS frees)"
    RELEASE_NEXT_OF_KEY " SELECT job_id FROM finished";

/* A release hands back the attempt it took, so a clean stop costs no retry budget. */
static const char SQL_RELEASE[] =
    LOCK_OWNED(LEASE_INPUT) " UPDATE outbox.job AS j"
                            " SET state = 'ready', attempts = j.attempts - 1, worker_id = NULL,"
                            "     lease_until = NULL"
                            " FROM input" STILL_OWNED " RETURNING j.job_id";

#define GIVES_UP "(input.permanent OR j.attempts >= j.max_attempts)"

/* A row that dies releases the next row of its key, unless $7 (block on a dead head). */
static const char SQL_FAIL[] = LOCK_OWNED_AND_NEXT(
    "unnest($2::bigint[], $3::int[], $4::text[], $5::float8[], $6::bool[])"
    " AS f(job_id, generation, error, retry_seconds, permanent)") ", finished AS ("
    " UPDATE outbox.job AS j"
    " SET state = CASE WHEN " GIVES_UP " THEN 'dead' ELSE 'ready' END,"
    "     run_at = CASE WHEN " GIVES_UP " THEN j.run_at"
    "              ELSE clock_timestamp() + make_interval(secs => input.retry_seconds) END,"
    "     finished_at = CASE WHEN " GIVES_UP " THEN clock_timestamp() END,"
    "     worker_id = NULL, lease_until = NULL, last_error = input.error"
    " FROM input" STILL_OWNED
    " RETURNING j.job_id, j.state = 'dead' AS dead, j.queue, j.ordering_key,"
    "           j.state = 'dead' AND NOT $7 AS frees)"
    RELEASE_NEXT_OF_KEY " SELECT job_id, dead FROM finished";

/* Expired leases, oldest first; SKIP LOCKED lets many reapers share the work. */
static const char SQL_REAP[] =
    "WITH overdue AS MATERIALIZED ("
    " SELECT job_id FROM outbox.job"
    " WHERE state = 'running' AND lease_until <= statement_timestamp()"
    " ORDER BY lease_until, job_id LIMIT $1 FOR UPDATE SKIP LOCKED)"
    " UPDATE outbox.job AS j"
    " SET state = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'ready' END,"
    "     run_at = CASE WHEN j.attempts >= j.max_attempts THEN j.run_at"
    "              ELSE clock_timestamp() + make_interval(secs => $2) END,"
    "     finished_at = CASE WHEN j.attempts >= j.max_attempts THEN clock_timestamp() END,"
    "     last_error = 'lease expired (worker ' || j.worker_id || ', attempt ' || j.attempts || ')',"
    "     worker_id = NULL, lease_until = NULL"
    " WHERE " ROW_OF("overdue")
    " RETURNING j.state = 'dead'";

/*
 * The sweep of waiting rows: the first held row of up to $1 keys after the
 * cursor ($2, $3), found by a loose scan of job_held_idx (one probe per key),
 * stops waiting when no earlier row of its key is unfinished. That repairs
 * the one race the immediate release cannot see: a key's head finishing
 * while a producer's insert of the next row is not yet committed. The rows
 * are locked in job_id order, as the marks lock theirs, not in the keys'.
 */
static const char SQL_SWEEP_HELD[] =
    "WITH RECURSIVE keys AS ("
    "  (SELECT h.queue, h.ordering_key, h.job_id FROM outbox.job AS h"
    "   WHERE h.held AND (h.queue, h.ordering_key) > ($2::text, $3::text)"
    "   ORDER BY h.queue, h.ordering_key, h.job_id LIMIT 1)"
    " UNION ALL"
    "  (SELECT n.queue, n.ordering_key, n.job_id FROM keys AS k CROSS JOIN LATERAL ("
    "    SELECT h.queue, h.ordering_key, h.job_id FROM outbox.job AS h"
    "    WHERE h.held AND (h.queue, h.ordering_key) > (k.queue, k.ordering_key)"
    "    ORDER BY h.queue, h.ordering_key, h.job_id LIMIT 1) AS n)),"
    " firsts AS MATERIALIZED (SELECT * FROM keys LIMIT $1),"
    " free AS MATERIALIZED ("
    "  SELECT j.job_id FROM firsts AS f JOIN outbox.job AS j USING (job_id)"
    "  WHERE j.held"
    "    AND NOT EXISTS (SELECT 1 FROM outbox.job AS e"
    "      WHERE e.queue = f.queue AND e.ordering_key = f.ordering_key AND e.job_id < f.job_id"
    "        AND (e.state IN ('ready', 'running') OR ($4 AND e.state = 'dead')))"
    "  ORDER BY j.job_id FOR UPDATE OF j),"
    " freed AS ("
    "  UPDATE outbox.job AS j SET held = false"
    "  WHERE " ROW_OF("free") " AND j.held"
    "  RETURNING j.job_id)"
    " SELECT (SELECT count(*) FROM freed), (SELECT count(*) FROM firsts), last.queue,"
    "        last.ordering_key"
    " FROM (SELECT 1) AS one LEFT JOIN ("
    "  SELECT queue, ordering_key FROM firsts"
    "  ORDER BY queue DESC, ordering_key DESC LIMIT 1) AS last ON true";

/*
 * Ages are differences of epoch seconds, which never fail: a row holding an
 * infinite run_at (the schema refuses new ones since migration 003) would
 * make now() - run_at raise an error. A -infinity row has waited since it
 * was created. The ready rows are read in two halves, each from its partial
 * index (free: job_ready_queue_idx; held behind its key: job_held_idx): one
 * filter on state = 'ready' reads the whole table, succeeded and stream rows
 * included, every sample.
 */
static const char SQL_BACKLOG[] =
    "SELECT queue, coalesce(b.ready, 0), coalesce(b.age, 0), coalesce(p.whole, false),"
    "       coalesce(p.keys, 0)"
    " FROM (SELECT queue, count(*) AS ready,"
    "       greatest(coalesce(extract(epoch FROM now()) - extract(epoch FROM least("
    "           min(run_at) FILTER (WHERE isfinite(run_at)),"
    "           min(created_at) FILTER (WHERE NOT isfinite(run_at) AND isfinite(created_at)))),"
    "         0), 0)::float8 AS age"
    "       FROM (SELECT queue, run_at, created_at FROM outbox.job"
    "             WHERE state = 'ready' AND NOT held AND run_at <= now()"
    "             UNION ALL"
    "             SELECT queue, run_at, created_at FROM outbox.job"
    "             WHERE held AND state = 'ready' AND run_at <= now()) AS r"
    "       GROUP BY queue) AS b"
    " FULL JOIN (SELECT queue, bool_or(ordering_key IS NULL) AS whole, count(ordering_key) AS keys"
    "            FROM outbox.paused GROUP BY queue) AS p USING (queue)";

static const char SQL_HORIZON[] =
    "SELECT extract(epoch FROM now() - xact_start)::float8, pid,"
    " left(coalesce(application_name, ''), 63), left(coalesce(state, ''), 31)"
    " FROM pg_stat_activity"
    " WHERE pid <> pg_backend_pid() AND xact_start IS NOT NULL"
    "   AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)"
    " ORDER BY xact_start LIMIT 1";


static const char SQL_CLEANUP_CUTOFF[] =
    "SELECT to_char((clock_timestamp() - make_interval(secs => $1::float8)) AT TIME ZONE 'UTC',"
    " 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"')"; /* the same instant under any DateStyle */

/*
 * One batch: succeeded rows finished before the cutoff, oldest first, at
 * most $2, rows locked by others skipped. The transaction-scoped advisory
 * lock keeps cleanup batches of all relays and purges one at a time; when
 * another session holds it, the batch deletes nothing and says so.
 */
static const char SQL_CLEANUP_BATCH[] =
    "WITH lock AS MATERIALIZED ("
    "  SELECT pg_try_advisory_xact_lock(" OUTBOX_CLEANUP_LOCK_KEY ") AS held),"
    " doomed AS MATERIALIZED ("
    "  SELECT job_id FROM outbox.job"
    "   WHERE (SELECT held FROM lock) AND state = 'succeeded' AND finished_at < $1::timestamptz"
    "   ORDER BY finished_at LIMIT $2::integer"
    "   FOR UPDATE SKIP LOCKED),"
    " gone AS ("
    "  DELETE FROM outbox.job AS j WHERE " ROW_OF("doomed") " RETURNING 1)"
    " SELECT (SELECT held FROM lock), (SELECT count(*) FROM gone)";

/*
 * Size and cleanup figures of outbox.job. The counts use job_succeeded_idx;
 * $1 is the retention in seconds. The age is a difference of epoch seconds,
 * held within 1e9 s, so a finished_at at -infinity (written by hand) reads
 * as the largest age instead of failing the statement.
 */
static const char SQL_TABLE_SAMPLE[] =
    "SELECT pg_table_size(c.oid), pg_indexes_size(c.oid), coalesce(s.n_dead_tup, 0),"
    "       d.succeeded, d.overdue,"
    "       least(greatest(extract(epoch FROM now()) - extract(epoch FROM d.oldest) - $1::float8,"
    "                      0), 1e9)::float8"
    "  FROM pg_class AS c"
    "  LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid"
    "  CROSS JOIN (SELECT count(*) AS succeeded,"
    "                     count(*) FILTER (WHERE finished_at < now() - make_interval(secs => $1::float8))"
    "                       AS overdue,"
    "                     min(finished_at) AS oldest"
    "                FROM outbox.job WHERE state = 'succeeded') AS d"
    " WHERE c.oid = 'outbox.job'::regclass";
/* clang-format on */

/* ---- what each statement needs ------------------------------------------ */

#define READS(table) {STORE_NEED_TABLE, "outbox", table, "SELECT"}
#define UPDATES(table) {STORE_NEED_TABLE, "outbox", table, "UPDATE"}
#define DELETES(table) {STORE_NEED_TABLE, "outbox", table, "DELETE"}
#define CALLS(schema, name, arguments) {STORE_NEED_FUNCTION, schema, name, arguments}

/* The CHECK constraint on headers, before migration 013, ran it on every update of outbox.job. */
#define HEADERS_CHECK CALLS("outbox", "headers_are_strings", "jsonb")
#define MAKE_INTERVAL                                                                              \
    CALLS("pg_catalog", "make_interval",                                                           \
          "integer,integer,integer,integer,integer,integer,double precision")
#define CLOCK_TIMESTAMP CALLS("pg_catalog", "clock_timestamp", "")
#define STATEMENT_TIMESTAMP CALLS("pg_catalog", "statement_timestamp", "")
#define NOW CALLS("pg_catalog", "now", "")
#define UNNEST CALLS("pg_catalog", "unnest", "anyarray")
/* extract() is a function from PostgreSQL 14; before, the audit finds none and skips it */
#define EXTRACT_TIMESTAMP CALLS("pg_catalog", "extract", "text,timestamp with time zone")
#define COUNT_ROWS CALLS("pg_catalog", "count", "")
#define COUNT_VALUES CALLS("pg_catalog", "count", "\"any\"")
#define MIN_TIMESTAMP CALLS("pg_catalog", "min", "timestamp with time zone")

/* The fenced writes: the rows named by arrays, updated where still owned. */
#define FENCED_WRITE READS("job"), UPDATES("job"), HEADERS_CHECK, UNNEST, CLOCK_TIMESTAMP

#define CLAIM_NEEDS                                                                                \
    READS("job"), READS("paused"), UPDATES("job"), HEADERS_CHECK, MAKE_INTERVAL, CLOCK_TIMESTAMP,  \
        STATEMENT_TIMESTAMP, EXTRACT_TIMESTAMP
#define CLAIM_PAUSED_NEEDS CLAIM_NEEDS, UNNEST

const struct store_statement store_statements[STMT_COUNT] = {
    [STMT_CLAIM_ALL] = {"outbox_claim_all", SQL_CLAIM_ALL, {CLAIM_NEEDS}},
    [STMT_CLAIM_QUEUES] = {"outbox_claim_queues", SQL_CLAIM_QUEUES, {CLAIM_NEEDS}},
    [STMT_CLAIM_ALL_PAUSED] = {"outbox_claim_all_paused", SQL_CLAIM_ALL_PAUSED,
                               {CLAIM_PAUSED_NEEDS}},
    [STMT_CLAIM_QUEUES_PAUSED] = {"outbox_claim_queues_paused", SQL_CLAIM_QUEUES_PAUSED,
                                  {CLAIM_PAUSED_NEEDS}},
    [STMT_PAUSES] = {"outbox_pauses",
                     SQL_PAUSES,
                     {READS("paused"), COUNT_ROWS,
                      CALLS("pg_catalog", "array_agg", "anynonarray")}},
    [STMT_EXTEND] = {"outbox_extend", SQL_EXTEND, {FENCED_WRITE, MAKE_INTERVAL}},
    [STMT_COMPLETE] = {"outbox_complete", SQL_COMPLETE, {FENCED_WRITE}},
    [STMT_COMPLETE_DELETE] = {"outbox_complete_delete",
                              SQL_COMPLETE_DELETE,
                              {FENCED_WRITE, DELETES("job")}},
    [STMT_RELEASE] = {"outbox_release", SQL_RELEASE, {FENCED_WRITE}},
    [STMT_FAIL] = {"outbox_fail", SQL_FAIL, {FENCED_WRITE, MAKE_INTERVAL}},
    [STMT_REAP] = {"outbox_reap",
                   SQL_REAP,
                   {READS("job"), UPDATES("job"), HEADERS_CHECK, MAKE_INTERVAL, CLOCK_TIMESTAMP,
                    STATEMENT_TIMESTAMP}},
    [STMT_BACKLOG] = {"outbox_backlog",
                      SQL_BACKLOG,
                      {READS("job"), READS("paused"), NOW, EXTRACT_TIMESTAMP, COUNT_ROWS,
                       COUNT_VALUES, MIN_TIMESTAMP,
                       CALLS("pg_catalog", "isfinite", "timestamp with time zone"),
                       CALLS("pg_catalog", "bool_or", "boolean")}},
    [STMT_HORIZON] = {"outbox_horizon",
                      SQL_HORIZON,
                      {NOW, CALLS("pg_catalog", "extract", "text,interval"),
                       CALLS("pg_catalog", "left", "text,integer"),
                       CALLS("pg_catalog", "pg_backend_pid", "")}},
    [STMT_SWEEP_HELD] = {"outbox_sweep_held",
                         SQL_SWEEP_HELD,
                         {READS("job"), UPDATES("job"), HEADERS_CHECK, COUNT_ROWS}},
    [STMT_CLEANUP_CUTOFF] = {"outbox_cleanup_cutoff",
                             SQL_CLEANUP_CUTOFF,
                             {CLOCK_TIMESTAMP, MAKE_INTERVAL,
                              CALLS("pg_catalog", "timezone", "text,timestamp with time zone"),
                              CALLS("pg_catalog", "to_char", "timestamp without time zone,text")}},
    [STMT_CLEANUP_BATCH] = {"outbox_cleanup_batch",
                            SQL_CLEANUP_BATCH,
                            {READS("job"), UPDATES("job"), DELETES("job"), COUNT_ROWS,
                             CALLS("pg_catalog", "pg_try_advisory_xact_lock", "bigint")}},
    [STMT_TABLE_SAMPLE] = {"outbox_table_sample",
                           SQL_TABLE_SAMPLE,
                           {READS("job"), NOW, EXTRACT_TIMESTAMP, COUNT_ROWS, MAKE_INTERVAL,
                            MIN_TIMESTAMP, CALLS("pg_catalog", "pg_table_size", "regclass"),
                            CALLS("pg_catalog", "pg_indexes_size", "regclass")}},
};
