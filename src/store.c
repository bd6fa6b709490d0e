/*
 * store.c - the worker side of the outbox protocol, outbox_enqueue() and
 * outbox_inbox_accept().
 *
 * Every statement is prepared once per connection and takes bound
 * parameters only. Each call is one statement in autocommit, so every
 * claim, extend, complete, fail, release, reap and cleanup is its own short
 * READ COMMITTED transaction and no row lock outlives the call.
 *
 * Fenced writes (extend, complete, fail, release) first lock the named rows
 * in a MATERIALIZED CTE, then update only those still owned: state running,
 * same worker, same generation, lease in the future, checked with
 * clock_timestamp() after the lock is held, so time spent waiting for the
 * lock never counts in the owner's favour. Rows not returned are "lease lost".
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <poll.h>
#include <time.h>

#include "buffer.h"
#include "clock.h"
#include "error.h"
#include "migrate.h"
#include "outbox.h"

/*
 * The server cancels a statement after STORE_STATEMENT_TIMEOUT (and a lock
 * wait as long); if no answer came STORE_STATEMENT_DEADLINE_MS after we
 * began to wait, the server is stalled and the connection is dropped.
 */
#define STORE_STATEMENT_TIMEOUT "10s"
#define STORE_STATEMENT_DEADLINE_MS 12000

/* At most this many statements are sent ahead of their results: the four
 * callers may send, and a read of the pauses ahead of a claim. */
#define STORE_QUEUE_MAX 5
/*
 * Pauses are read again before a claim once they are this old (seconds): a
 * pause then stops claims within this, plus one turn for the claim sent
 * ahead, well inside --poll-interval + 1 s. A read of the tiny table five
 * times a second costs a pipeline about 0.05 % of a core.
 */
#define STORE_PAUSES_MAX_AGE 0.2

/* The pauses as claim parameters (array literals), from SQL_PAUSES. */
struct pauses {
    bool any;
    char *queues;     /* whole queues paused */
    char *key_queues; /* with keys: the (queue, key) pairs paused */
    char *keys;
    double read_at; /* monotonic seconds; 0: read before the next claim */
    bool pending;   /* a read is sent ahead and not collected yet */
    double sent_at; /* when that read was sent */
};

/*
 * Every statement the store prepares, by name in the code (a typo cannot
 * compile) and by its server-side name in STATEMENTS.
 */
enum statement {
    STMT_CLAIM_ALL,
    STMT_CLAIM_QUEUES,
    STMT_CLAIM_ALL_PAUSED,
    STMT_CLAIM_QUEUES_PAUSED,
    STMT_PAUSES,
    STMT_EXTEND,
    STMT_COMPLETE,
    STMT_COMPLETE_DELETE,
    STMT_RELEASE,
    STMT_FAIL,
    STMT_REAP,
    STMT_BACKLOG,
    STMT_HORIZON,
    STMT_SWEEP_HELD,
    STMT_COUNT,
};

struct outbox_store {
    PGconn *conn;
    char *worker_id;
    bool listening;
    bool block_on_dead_head; /* ordering: a dead head keeps its key blocked */
    bool delete_on_success;  /* complete deletes the row instead of marking it succeeded */
    char *sweep_queue;       /* where the sweep of held rows goes on; NULL: from the start */
    char *sweep_key;
    /* statements sent in pipeline mode whose results are not collected yet, oldest first */
    enum statement queued[STORE_QUEUE_MAX];
    int queued_count;
    struct pauses pauses;
};

/* ---- SQL: the only place that knows the worker protocol's statements ---- */

/*
 * The claim. The candidate scan follows job_ready_idx (or job_ready_queue_idx
 * with a queue filter) and stops after $2 unlocked rows; SKIP LOCKED passes
 * over rows another claim is taking right now. A row with an ordering key is
 * a candidate only when no earlier row of its key is unfinished: that earlier
 * row is still 'ready' in this statement's snapshot even while another relay
 * holds it locked and uncommitted, so a key never has two rows in flight.
 *
 * Pauses (outbox.paused) reach the claim as constant arrays the store reads
 * every STORE_PAUSES_MAX_AGE seconds, never as a join: with nothing paused
 * the claim is the plain statement, and with pauses the planner sees the
 * paused names themselves, so its estimates stay those of the plain claim
 * (a join with outbox.paused misjudged them by orders of magnitude, enough
 * to JIT-compile every claim). Paused queues are left out by a comparison
 * per candidate, paused keys by a hash of the (queue, key) pairs built once.
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
    " FROM candidate WHERE j.job_id = candidate.job_id"                                            \
    " RETURNING j.job_id, j.attempts, j.max_attempts, j.queue, j.payload::text,"                   \
    "           j.headers::text, j.ordering_key, extract(epoch FROM j.created_at)::float8,"         \
    "           j.replays, j.exchange, j.routing_key"

/* Paused queues ($N), and paused keys as (queue, key) pairs ($N+1, $N+2). */
#define PAUSE_FILTER(queues, key_queues, keys)                                                     \
    "   AND c.queue <> ALL (" queues "::text[])"                                                   \
    "   AND (c.ordering_key IS NULL OR (c.queue, c.ordering_key) NOT IN ("                         \
    "     SELECT * FROM unnest(" key_queues "::text[], " keys "::text[])))"

#define QUEUE_FILTER " AND c.queue = ANY ($5::text[])"

static const char SQL_CLAIM_ALL[] = CLAIM_CANDIDATES("", "");
static const char SQL_CLAIM_QUEUES[] = CLAIM_CANDIDATES(QUEUE_FILTER, "");
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
    "  SELECT j.job_id FROM outbox.job AS j JOIN input USING (job_id)"                             \
    "  ORDER BY j.job_id FOR UPDATE OF j)"

/* The ownership check, evaluated on the locked, latest row version. */
#define STILL_OWNED                                                                                \
    " WHERE j.job_id = input.job_id AND j.job_id IN (SELECT job_id FROM owned)"                    \
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
    "  UPDATE outbox.job AS h SET held = false FROM next_of_key AS n"                              \
    "  WHERE h.job_id = n.job_id AND h.held)"

/* The statements below keep their own layout. */
/* clang-format off */
static const char SQL_COMPLETE[] =
    LOCK_OWNED(LEASE_INPUT) ", finished AS ("
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
    LOCK_OWNED(LEASE_INPUT) ", finished AS ("
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
static const char SQL_FAIL[] = LOCK_OWNED(
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
    " FROM overdue WHERE j.job_id = overdue.job_id"
    " RETURNING j.state = 'dead'";


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

/*
 * The sweep of waiting rows: the first held row of up to $1 keys after the
 * cursor ($2, $3), found by a loose scan of job_held_idx (one probe per key),
 * stops waiting when no earlier row of its key is unfinished. That repairs
 * the one race the immediate release cannot see: a key's head finishing
 * while a producer's insert of the next row is not yet committed.
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
    " freed AS ("
    "  UPDATE outbox.job AS j SET held = false FROM firsts AS f"
    "  WHERE j.job_id = f.job_id AND j.held"
    "    AND NOT EXISTS (SELECT 1 FROM outbox.job AS e"
    "      WHERE e.queue = f.queue AND e.ordering_key = f.ordering_key AND e.job_id < f.job_id"
    "        AND (e.state IN ('ready', 'running') OR ($4 AND e.state = 'dead')))"
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
 * was created.
 */
static const char SQL_BACKLOG[] =
    "SELECT queue, coalesce(b.ready, 0), coalesce(b.age, 0), coalesce(p.whole, false),"
    "       coalesce(p.keys, 0)"
    " FROM (SELECT queue, count(*) AS ready,"
    "       greatest(coalesce(extract(epoch FROM now()) - extract(epoch FROM least("
    "           min(run_at) FILTER (WHERE isfinite(run_at)),"
    "           min(created_at) FILTER (WHERE NOT isfinite(run_at) AND isfinite(created_at)))),"
    "         0), 0)::float8 AS age"
    "       FROM outbox.job WHERE state = 'ready' AND run_at <= now() GROUP BY queue) AS b"
    " FULL JOIN (SELECT queue, bool_or(ordering_key IS NULL) AS whole, count(ordering_key) AS keys"
    "            FROM outbox.paused GROUP BY queue) AS p USING (queue)";

static const char SQL_HORIZON[] =
    "SELECT extract(epoch FROM now() - xact_start)::float8, pid,"
    " left(coalesce(application_name, ''), 63), left(coalesce(state, ''), 31)"
    " FROM pg_stat_activity"
    " WHERE pid <> pg_backend_pid() AND xact_start IS NOT NULL"
    "   AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)"
    " ORDER BY xact_start LIMIT 1";

/*
 * What the relay needs, in the order it is reported, each with whether the
 * session's role has it: USAGE on the schema, SELECT, UPDATE and (when $1)
 * DELETE on outbox.job, SELECT on outbox.paused (the claim reads it), and
 * EXECUTE on every function the statements above call, the CHECK
 * constraint's outbox.headers_are_strings() included (it runs on every
 * mark). Objects are found through the catalogs, which need no privilege,
 * so a missing USAGE is reported instead of failing the lookup. A function
 * this server does not have (extract() is one before PostgreSQL 14) is not
 * listed. A new statement of the relay that calls another function, or
 * reads another table, adds it here.
 */
static const char SQL_PRIVILEGES[] =
    "WITH schema AS (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = 'outbox'),"
    " job AS (SELECT c.oid FROM pg_catalog.pg_class AS c JOIN schema AS n ON n.oid = c.relnamespace"
    "         WHERE c.relname = 'job'),"
    " called (position, schema_name, name, arguments) AS (VALUES"
    "  (1, 'outbox', 'headers_are_strings', 'jsonb'),"
    "  (2, 'pg_catalog', 'make_interval',"
    "   'integer,integer,integer,integer,integer,integer,double precision'),"
    "  (3, 'pg_catalog', 'clock_timestamp', ''), (4, 'pg_catalog', 'statement_timestamp', ''),"
    "  (5, 'pg_catalog', 'now', ''), (6, 'pg_catalog', 'unnest', 'anyarray'),"
    "  (7, 'pg_catalog', 'extract', 'text,timestamp with time zone'),"
    "  (8, 'pg_catalog', 'count', ''), (9, 'pg_catalog', 'min', 'timestamp with time zone'),"
    "  (10, 'pg_catalog', 'left', 'text,integer'), (11, 'pg_catalog', 'pg_backend_pid', ''),"
    "  (12, 'pg_catalog', 'isfinite', 'timestamp with time zone'),"
    "  (13, 'pg_catalog', 'bool_or', 'boolean'), (14, 'pg_catalog', 'count', '\"any\"'),"
    "  (15, 'pg_catalog', 'array_agg', 'anynonarray'),"
    "  (16, 'pg_catalog', 'pg_try_advisory_xact_lock', 'bigint'),"
    "  (17, 'pg_catalog', 'pg_table_size', 'regclass'),"
    "  (18, 'pg_catalog', 'pg_indexes_size', 'regclass')),"
    " needed (position, what, granted) AS ("
    "  SELECT 1, 'USAGE on schema outbox', has_schema_privilege(oid, 'USAGE') FROM schema"
    "  UNION ALL SELECT 2, 'SELECT on table outbox.job', has_table_privilege(oid, 'SELECT') FROM job"
    "  UNION ALL SELECT 3, 'UPDATE on table outbox.job', has_table_privilege(oid, 'UPDATE') FROM job"
    "  UNION ALL SELECT 4, 'DELETE on table outbox.job', has_table_privilege(oid, 'DELETE') FROM job"
    "   WHERE $1"
    "  UNION ALL SELECT 5, 'SELECT on table outbox.paused', has_table_privilege(c.oid, 'SELECT')"
    "   FROM pg_catalog.pg_class AS c JOIN schema AS n ON n.oid = c.relnamespace"
    "   WHERE c.relname = 'paused'"
    "  UNION ALL SELECT 10 + f.position, 'EXECUTE on function '"
    "    || CASE WHEN f.schema_name = 'pg_catalog' THEN '' ELSE f.schema_name || '.' END"
    "    || f.name || '(' || f.arguments || ')', has_function_privilege(p.oid, 'EXECUTE')"
    "   FROM called AS f JOIN pg_catalog.pg_namespace AS n ON n.nspname = f.schema_name"
    "   JOIN pg_catalog.pg_proc AS p ON p.pronamespace = n.oid AND p.proname = f.name"
    "    AND array_to_string(p.proargtypes::regtype[], ',') = f.arguments)"
    " SELECT what, current_user FROM needed WHERE NOT granted ORDER BY position LIMIT 1";

/* clang-format on */

static const struct prepared_statement {
    const char *name;
    const char *sql;
} STATEMENTS[STMT_COUNT] = {
    [STMT_CLAIM_ALL] = {"outbox_claim_all", SQL_CLAIM_ALL},
    [STMT_CLAIM_QUEUES] = {"outbox_claim_queues", SQL_CLAIM_QUEUES},
    [STMT_CLAIM_ALL_PAUSED] = {"outbox_claim_all_paused", SQL_CLAIM_ALL_PAUSED},
    [STMT_CLAIM_QUEUES_PAUSED] = {"outbox_claim_queues_paused", SQL_CLAIM_QUEUES_PAUSED},
    [STMT_PAUSES] = {"outbox_pauses", SQL_PAUSES},
    [STMT_EXTEND] = {"outbox_extend", SQL_EXTEND},
    [STMT_COMPLETE] = {"outbox_complete", SQL_COMPLETE},
    [STMT_COMPLETE_DELETE] = {"outbox_complete_delete", SQL_COMPLETE_DELETE},
    [STMT_RELEASE] = {"outbox_release", SQL_RELEASE},
    [STMT_FAIL] = {"outbox_fail", SQL_FAIL},
    [STMT_REAP] = {"outbox_reap", SQL_REAP},
    [STMT_BACKLOG] = {"outbox_backlog", SQL_BACKLOG},
    [STMT_HORIZON] = {"outbox_horizon", SQL_HORIZON},
    [STMT_SWEEP_HELD] = {"outbox_sweep_held", SQL_SWEEP_HELD},
};
/* ---- PostgreSQL array literals -------------------------------------------- */

/*
 * An array literal built element by element ("{1,2,3}", "{\"a\",\"b\"}"),
 * passed as one text parameter and cast by the statement. Allocation
 * failures surface once, from array_finish().
 */
struct pg_array {
    struct buffer text;
    size_t count;
};

/* Starts the next element: the opening brace or a comma. */
static void
array_next(struct pg_array *a)
{
    buffer_putc(&a->text, a->count++ == 0 ? '{' : ',');
}

static void
array_add_int(struct pg_array *a, long long value)
{
    array_next(a);
    buffer_printf(&a->text, "%lld", value);
}

static void
array_add_double(struct pg_array *a, double value)
{
    array_next(a);
    buffer_printf(&a->text, "%.3f", value);
}

static void
array_add_bool(struct pg_array *a, bool value)
{
    array_next(a);
    buffer_putc(&a->text, value ? 't' : 'f');
}

/* An unquoted NULL element. */
static void
array_add_null(struct pg_array *a)
{
    array_next(a);
    buffer_puts(&a->text, "NULL");
}

/* A double-quoted element: any text, with '"' and '\' escaped. */
static void
array_add_text(struct pg_array *a, const char *text)
{
    array_next(a);
    buffer_putc(&a->text, '"');
    for (; text != NULL && *text != '\0'; text++) {
        if (*text == '"' || *text == '\\')
            buffer_putc(&a->text, '\\');
        buffer_putc(&a->text, *text);
    }
    buffer_putc(&a->text, '"');
}

/* Closes the literal; its text, or NULL when out of memory. */
static const char *
array_finish(struct pg_array *a)
{
    if (a->count == 0)
        buffer_putc(&a->text, '{');
    buffer_putc(&a->text, '}');
    return a->text.failed ? NULL : a->text.data;
}

static void
array_clear(struct pg_array *a)
{
    buffer_clear(&a->text);
    a->count = 0;
}

/* ---- helpers ---------------------------------------------------------------- */

/* Index of job_id in an id-sorted position table, for marking done[]. */
struct position {
    int64_t job_id;
    size_t index;
};

static int
compare_position(const void *a, const void *b)
{
    const struct position *x = a, *y = b;

    return (x->job_id > y->job_id) - (x->job_id < y->job_id);
}

/*
 * Sets done[i] for every row whose job_id the result returned (column 0),
 * and dead[i] from column 1 when dead is not NULL; stores the rows matched
 * in *changed when not NULL. Returns 0, or -1 when out of memory.
 */
static int
mark_returned(const PGresult *result, const int64_t *job_ids, size_t count, bool *done, bool *dead,
              size_t *changed, struct outbox_error *err)
{
    struct position *positions = malloc(count * sizeof(*positions));
    int rows = PQntuples(result);
    size_t matched = 0;

    if (positions == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    for (size_t i = 0; i < count; i++) {
        positions[i].job_id = job_ids[i];
        positions[i].index = i;
        if (done != NULL)
            done[i] = false;
        if (dead != NULL)
            dead[i] = false;
    }
    qsort(positions, count, sizeof(*positions), compare_position);
    for (int r = 0; r < rows; r++) {
        struct position key = {.job_id = strtoll(PQgetvalue(result, r, 0), NULL, 10)};
        struct position *found =
            bsearch(&key, positions, count, sizeof(*positions), compare_position);

        if (found == NULL)
            continue;
        matched++;
        if (done != NULL)
            done[found->index] = true;
        if (dead != NULL && PQnfields(result) > 1)
            dead[found->index] = PQgetvalue(result, r, 1)[0] == 't';
    }
    free(positions);
    if (changed != NULL)
        *changed = matched;
    return 0;
}

/*
 * Waits until the next result can be read without blocking, for at most
 * STORE_STATEMENT_DEADLINE_MS: libpq itself would wait for ever on a
 * server that stopped answering (a stopped backend, a frozen host whose
 * kernel still acknowledges). On expiry the error is a transient
 * OUTBOX_ERR_TIMEOUT: the caller drops the connection and makes a new one,
 * and rows claimed meanwhile come back after their lease.
 */
static int
await_result(outbox_store *store, const char *context, struct outbox_error *err)
{
    int64_t deadline = clock_monotonic_ms() + STORE_STATEMENT_DEADLINE_MS;

    if (PQflush(store->conn) < 0)
        return outbox_error_from_pg(err, store->conn, NULL, context);
    while (PQisBusy(store->conn)) {
        int64_t remaining = deadline - clock_monotonic_ms();
        struct pollfd pfd = {.fd = PQsocket(store->conn), .events = POLLIN};

        if (remaining <= 0)
            return outbox_error_set(err, OUTBOX_ERR_TIMEOUT,
                                    "%s: the database did not answer within %d s (server stalled"
                                    " or unreachable); dropping the connection",
                                    context, STORE_STATEMENT_DEADLINE_MS / 1000);
        if (pfd.fd < 0)
            return outbox_error_set(err, OUTBOX_ERR_CONNECTION, "%s: database connection is closed",
                                    context);
        if (poll(&pfd, 1, (int)remaining) > 0 && !PQconsumeInput(store->conn))
            return outbox_error_from_pg(err, store->conn, NULL, context);
    }
    return 0;
}

/*
 * Collects the results of a statement sent outside pipeline mode within the
 * deadline and returns the last one (libpq's PQexec does the same without a
 * deadline), or NULL with err.
 */
static PGresult *
await_last_result(outbox_store *store, const char *context, struct outbox_error *err)
{
    PGresult *last = NULL, *next;

    for (;;) {
        if (await_result(store, context, err) != 0) {
            PQclear(last);
            return NULL;
        }
        next = PQgetResult(store->conn);
        if (next == NULL)
            break;
        PQclear(last);
        last = next;
    }
    if (last == NULL)
        outbox_error_from_pg(err, store->conn, NULL, context);
    return last;
}

/* Runs sql (one or more statements, no parameters) within the deadline; its last result. */
static PGresult *
exec_bounded(outbox_store *store, const char *sql, const char *context, struct outbox_error *err)
{
    if (!PQsendQuery(store->conn, sql)) {
        outbox_error_from_pg(err, store->conn, NULL, context);
        return NULL;
    }
    return await_last_result(store, context, err);
}

/* Runs a prepared statement, checking for the expected result status. */
static PGresult *
run_prepared(outbox_store *store, enum statement statement, int nparams, const char *const *values,
             ExecStatusType expected, const char *context, struct outbox_error *err)
{
    PGresult *result;

    if (!PQsendQueryPrepared(store->conn, STATEMENTS[statement].name, nparams, values, NULL, NULL,
                             0)) {
        outbox_error_from_pg(err, store->conn, NULL, context);
        return NULL;
    }
    result = await_last_result(store, context, err);
    if (result != NULL && PQresultStatus(result) != expected) {
        outbox_error_from_pg(err, store->conn, result, context);
        PQclear(result);
        return NULL;
    }
    return result;
}

/*
 * Queued statements. queue_prepared() sends a statement without waiting:
 * the connection enters libpq's pipeline mode and a Sync follows the
 * statement, so it runs and commits as its own transaction while the caller
 * does something else. collect_prepared() waits for the oldest queued
 * statement's result; results come back in the order sent. With nothing
 * queued the connection leaves pipeline mode, so the plain calls work again.
 */
static int
queue_prepared(outbox_store *store, enum statement statement, int nparams,
               const char *const *values, const char *context, struct outbox_error *err)
{
    if (store->queued_count == STORE_QUEUE_MAX)
        return outbox_error_set(err, OUTBOX_ERR_INVALID, "%s: too many statements queued", context);
    if (PQpipelineStatus(store->conn) == PQ_PIPELINE_OFF && !PQenterPipelineMode(store->conn))
        return outbox_error_from_pg(err, store->conn, NULL, context);
    if (!PQsendQueryPrepared(store->conn, STATEMENTS[statement].name, nparams, values, NULL, NULL,
                             0) ||
        !PQpipelineSync(store->conn))
        return outbox_error_from_pg(err, store->conn, NULL, context);
    store->queued[store->queued_count++] = statement;
    return 0;
}

/* Whether a statement is one of the claims (claim_receive collects whichever was sent). */
static bool
is_claim(enum statement statement)
{
    return statement == STMT_CLAIM_ALL || statement == STMT_CLAIM_QUEUES ||
           statement == STMT_CLAIM_ALL_PAUSED || statement == STMT_CLAIM_QUEUES_PAUSED;
}

/* statement is the one queued first (any claim stands for every claim). */
static PGresult *
collect_prepared(outbox_store *store, enum statement statement, ExecStatusType expected,
                 const char *context, struct outbox_error *err)
{
    PGresult *result, *extra;

    if (store->queued_count == 0 ||
        (store->queued[0] != statement && !(is_claim(statement) && is_claim(store->queued[0])))) {
        outbox_error_set(
            err, OUTBOX_ERR_INVALID, "%s: results collected out of order (%s)", context,
            store->queued_count > 0 ? "another statement was sent first" : "nothing was sent");
        return NULL;
    }
    store->queued_count--;
    memmove(store->queued, store->queued + 1, (size_t)store->queued_count * sizeof(*store->queued));

    if (await_result(store, context, err) != 0)
        return NULL;
    result = PQgetResult(store->conn);
    /* the statement's results end with NULL, then comes its Sync */
    for (;;) {
        if (await_result(store, context, err) != 0) {
            PQclear(result);
            return NULL;
        }
        if ((extra = PQgetResult(store->conn)) == NULL)
            break;
        PQclear(extra);
    }
    if (await_result(store, context, err) != 0) {
        PQclear(result);
        return NULL;
    }
    extra = PQgetResult(store->conn);
    if (PQresultStatus(result) != expected || PQresultStatus(extra) != PGRES_PIPELINE_SYNC) {
        outbox_error_from_pg(err, store->conn, PQresultStatus(result) != expected ? result : extra,
                             context);
        PQclear(result);
        PQclear(extra);
        return NULL;
    }
    PQclear(extra);
    if (store->queued_count == 0 && !PQexitPipelineMode(store->conn)) {
        outbox_error_from_pg(err, store->conn, NULL, context);
        PQclear(result);
        return NULL;
    }
    return result;
}

/* ---- pauses ---------------------------------------------------------------- */

/*
 * Keeps the pauses of a SQL_PAUSES result, as of read_at: when the statement
 * was sent, not when its result came back (a busy turn may lie between);
 * -1 when out of memory.
 */
static int
pauses_keep(outbox_store *store, const PGresult *result, double read_at, struct outbox_error *err)
{
    struct pauses *p = &store->pauses;
    char *queues = strdup(PQgetvalue(result, 0, 1));
    char *key_queues = strdup(PQgetvalue(result, 0, 2));
    char *keys = strdup(PQgetvalue(result, 0, 3));

    if (queues == NULL || key_queues == NULL || keys == NULL) {
        free(queues);
        free(key_queues);
        free(keys);
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    }
    free(p->queues);
    free(p->key_queues);
    free(p->keys);
    p->queues = queues;
    p->key_queues = key_queues;
    p->keys = keys;
    p->any = strtoll(PQgetvalue(result, 0, 0), NULL, 10) > 0;
    p->read_at = read_at;
    return 0;
}

/* Reads the pauses now; nothing may be queued. */
static int
pauses_read(outbox_store *store, struct outbox_error *err)
{
    double sent_at = clock_monotonic_seconds();
    PGresult *result = run_prepared(store, STMT_PAUSES, 0, NULL, PGRES_TUPLES_OK,
                                    "unable to read 'outbox.paused'", err);
    int rc;

    if (result == NULL)
        return -1;
    rc = pauses_keep(store, result, sent_at, err);
    PQclear(result);
    return rc;
}

/*
 * Before a claim: pauses older than STORE_PAUSES_MAX_AGE are read again, at
 * once when nothing is queued (an idle relay), else sent ahead of the claim
 * and kept for the next one (a busy relay, one turn later).
 */
static int
pauses_refresh(outbox_store *store, struct outbox_error *err)
{
    struct pauses *p = &store->pauses;

    if (p->pending || clock_monotonic_seconds() - p->read_at < STORE_PAUSES_MAX_AGE)
        return 0;
    if (store->queued_count == 0)
        return pauses_read(store, err);
    if (queue_prepared(store, STMT_PAUSES, 0, NULL, "unable to read 'outbox.paused'", err) != 0)
        return -1;
    p->pending = true;
    p->sent_at = clock_monotonic_seconds();
    return 0;
}

int
outbox_store_refresh_pauses(outbox_store *store, struct outbox_error *err)
{
    if (store->queued_count > 0 || store->pauses.pending ||
        clock_monotonic_seconds() - store->pauses.read_at < STORE_PAUSES_MAX_AGE)
        return 0;
    return pauses_read(store, err);
}

/* Collects a read of the pauses sent ahead of the claim being collected. */
static int
pauses_collect(outbox_store *store, struct outbox_error *err)
{
    PGresult *result;
    int rc;

    if (!store->pauses.pending)
        return 0;
    store->pauses.pending = false;
    result = collect_prepared(store, STMT_PAUSES, PGRES_TUPLES_OK, "unable to read 'outbox.paused'",
                              err);
    if (result == NULL)
        return -1;
    rc = pauses_keep(store, result, store->pauses.sent_at, err);
    PQclear(result);
    return rc;
}

/* ---- connection ------------------------------------------------------------ */

/* A privilege the relay needs and role lacks: a configuration error, SQLSTATE 42501. */
static int
missing_privilege(struct outbox_error *err, const char *role, const char *what)
{
    char quoted[64];

    outbox_error_set(err, OUTBOX_ERR_CONFIG,
                     "role '%s' lacks %s (grant it the outbox_relay role of"
                     " sql/roles/outbox_relay_role.sql)",
                     outbox_error_quote(quoted, sizeof(quoted), role), what);
    if (err != NULL)
        memcpy(err->sqlstate, "42501", 6);
    return -1;
}

/*
 * The first privilege the session's role lacks (SQL_PRIVILEGES), DELETE
 * included when with_delete: -1 with missing_privilege()'s error, or 0.
 */
static int
check_privileges(outbox_store *store, bool with_delete, struct outbox_error *err)
{
    const char *values[1] = {with_delete ? "true" : "false"};
    PGresult *result;
    int rc = 0;

    if (!PQsendQueryParams(store->conn, SQL_PRIVILEGES, 1, NULL, values, NULL, NULL, 0))
        return outbox_error_from_pg(err, store->conn, NULL, "unable to read the role's privileges");
    result = await_last_result(store, "unable to read the role's privileges", err);
    if (result == NULL)
        return -1;
    if (PQresultStatus(result) != PGRES_TUPLES_OK)
        rc = outbox_error_from_pg(err, store->conn, result, "unable to read the role's privileges");
    else if (PQntuples(result) > 0)
        rc = missing_privilege(err, PQgetvalue(result, 0, 1), PQgetvalue(result, 0, 0));
    PQclear(result);
    return rc;
}

int
outbox_store_check_privileges(outbox_store *store, struct outbox_error *err)
{
    return check_privileges(store, true, err);
}

outbox_store *
outbox_store_connect(const char *database_url, const char *worker_id, struct outbox_error *err)
{
    /*
     * Defaults come before dbname so the URL's own settings win. Every wait
     * on the server is bounded: connect_timeout the connection; keepalives
     * (idle 10 s, then 3 probes 5 s apart) notice a peer that vanished while
     * the connection is idle; tcp_user_timeout drops it when data sent stays
     * unacknowledged for 15 s (a host gone mid-statement); the server's
     * statement_timeout a slow statement; and STORE_STATEMENT_DEADLINE_MS on
     * our side a server that stopped answering altogether (await_result).
     */
    const char *keywords[] = {"fallback_application_name",
                              "connect_timeout",
                              "keepalives",
                              "keepalives_idle",
                              "keepalives_interval",
                              "keepalives_count",
                              "tcp_user_timeout",
                              "dbname",
                              NULL};
    const char *values[] = {"outbox-relay", "10", "1", "10", "5", "3", "15000", database_url, NULL};
    outbox_store *store;
    PGresult *result = NULL;

    if (database_url == NULL || worker_id == NULL || worker_id[0] == '\0') {
        outbox_error_set(err, OUTBOX_ERR_INVALID, "database URL and worker id are required");
        return NULL;
    }
    store = calloc(1, sizeof(*store));
    if (store == NULL || (store->worker_id = strdup(worker_id)) == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        goto fail;
    }
    store->conn = PQconnectdbParams(keywords, values, 1);
    if (store->conn == NULL || PQstatus(store->conn) != CONNECTION_OK) {
        outbox_error_from_connect(err, store->conn, database_url,
                                  "unable to connect to the database");
        /* a refused password is not worth retrying */
        if (store->conn != NULL && strstr(PQerrorMessage(store->conn), "authentication") != NULL)
            err->code = OUTBOX_ERR_CONFIG;
        goto fail;
    }

    /*
     * The relay's own commits (claim, mark) may be lost in a database crash
     * without losing a message: a lost claim or mark only leads to another
     * publish, which at-least-once delivery allows. Business commits, made
     * on the producers' connections, stay durable.
     */
    /*
     * Custom plans: the fenced writes take arrays whose length the planner
     * must see, or after five runs a generic plan that guesses one row turns
     * a 500-row complete into a quadratic join. No JIT: every statement here
     * runs for milliseconds, and a claim the planner costs high (a paused
     * queue holding every ready row, say) spent a second and more compiling.
     */
    result = exec_bounded(store,
                          "SET synchronous_commit = off; SET statement_timeout = '"
                          STORE_STATEMENT_TIMEOUT "';"
                          " SET plan_cache_mode = force_custom_plan;"
                          " SET lock_timeout = '" STORE_STATEMENT_TIMEOUT "'; SET jit = off;"
                          " SET default_transaction_isolation = 'read committed';"
                          /* the catalogs: to_regclass() fails without USAGE */
                          " SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class AS c"
                          "  JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace"
                          "  WHERE n.nspname = 'outbox' AND c.relname = 'job'),"
                          " has_schema_privilege((SELECT oid FROM pg_catalog.pg_namespace"
                          "  WHERE nspname = 'outbox'), 'USAGE'), current_user,"
                          /* the role's or the database's default, not a standby's */
                          " current_setting('transaction_read_only') = 'on'"
                          "  AND NOT pg_catalog.pg_is_in_recovery()",
                          "unable to set up the database session", err);
    if (result == NULL)
        goto fail;
    if (PQresultStatus(result) != PGRES_TUPLES_OK) {
        outbox_error_from_pg(err, store->conn, result, "unable to set up the database session");
        goto fail;
    }
    if (PQgetvalue(result, 0, 0)[0] != 't') {
        outbox_error_set(err, OUTBOX_ERR_SCHEMA,
                         "table 'outbox.job' not found: run 'outboxctl migrate' first");
        goto fail;
    }
    if (PQgetvalue(result, 0, 1)[0] != 't') {
        missing_privilege(err, PQgetvalue(result, 0, 2), "USAGE on schema outbox");
        goto fail;
    }
    /*
     * A primary whose sessions are read-only for this role or database
     * (default_transaction_read_only) would fail every claim for ever; a
     * standby is left to the claim's error, which reconnects (failover).
     */
    if (PQgetvalue(result, 0, 3)[0] == 't') {
        char quoted[64];

        outbox_error_set(err, OUTBOX_ERR_CONFIG,
                         "sessions of role '%s' are read-only (default_transaction_read_only is"
                         " on for the role or the database): the relay must update outbox.job",
                         outbox_error_quote(quoted, sizeof(quoted), PQgetvalue(result, 0, 2)));
        if (err != NULL)
            memcpy(err->sqlstate, "25006", 6);
        goto fail;
    }
    PQclear(result);
    result = NULL;
    if (outbox_schema_check(store->conn, err) != 0)
        goto fail;
    /*
     * What every turn needs, named now rather than failing a claim later;
     * DELETE (retention) only in outbox_store_check_privileges(), since
     * --retention 0 never deletes.
     */
    if (check_privileges(store, false, err) != 0)
        goto fail;

    for (size_t i = 0; i < sizeof(STATEMENTS) / sizeof(STATEMENTS[0]); i++) {
        char context[96];

        snprintf(context, sizeof(context), "unable to prepare '%s'", STATEMENTS[i].name);
        if (!PQsendPrepare(store->conn, STATEMENTS[i].name, STATEMENTS[i].sql, 0, NULL)) {
            outbox_error_from_pg(err, store->conn, NULL, context);
            goto fail;
        }
        result = await_last_result(store, context, err);
        if (result == NULL)
            goto fail;
        if (PQresultStatus(result) != PGRES_COMMAND_OK) {
            outbox_error_from_pg(err, store->conn, result, context);
            if (err != NULL && err->code == OUTBOX_ERR_INTERNAL)
                err->code = OUTBOX_ERR_SCHEMA; /* an old or altered schema */
            goto fail;
        }
        PQclear(result);
        result = NULL;
    }
    /* a relay started during a pause must not claim one batch of it */
    if (pauses_read(store, err) != 0)
        goto fail;
    return store;

fail:
    PQclear(result);
    outbox_store_free(store);
    return NULL;
}

void
outbox_store_free(outbox_store *store)
{
    if (store == NULL)
        return;
    PQfinish(store->conn);
    free(store->worker_id);
    free(store->sweep_queue);
    free(store->sweep_key);
    free(store->pauses.queues);
    free(store->pauses.key_queues);
    free(store->pauses.keys);
    free(store);
}

PGconn *
outbox_store_conn(outbox_store *store)
{
    return store->conn;
}

void
outbox_store_set_block_on_dead_head(outbox_store *store, bool block)
{
    store->block_on_dead_head = block;
}

void
outbox_store_set_delete_on_success(outbox_store *store, bool delete_rows)
{
    store->delete_on_success = delete_rows;
}

int
outbox_store_wait(outbox_store *store, int timeout_ms, bool *notified, struct outbox_error *err)
{
    struct pollfd pfd;
    PGnotify *notify;
    int ready;

    *notified = false;
    if (!store->listening) {
        PGresult *result =
            exec_bounded(store, "LISTEN outbox_job", "unable to listen on 'outbox_job'", err);

        if (result == NULL)
            return -1;
        if (PQresultStatus(result) != PGRES_COMMAND_OK) {
            outbox_error_from_pg(err, store->conn, result, "unable to listen on 'outbox_job'");
            PQclear(result);
            return -1;
        }
        PQclear(result);
        store->listening = true;
    }

    /* a notification may already have arrived with an earlier result */
    while ((notify = PQnotifies(store->conn)) != NULL) {
        *notified = true;
        PQfreemem(notify);
    }
    if (*notified || timeout_ms <= 0)
        return 0;

    pfd.fd = PQsocket(store->conn);
    pfd.events = POLLIN;
    pfd.revents = 0;
    if (pfd.fd < 0)
        return outbox_error_set(err, OUTBOX_ERR_CONNECTION, "database connection is closed");
    ready = poll(&pfd, 1, timeout_ms);
    if (ready <= 0)
        return 0; /* timeout, or a signal: the caller checks its flags */
    if (!PQconsumeInput(store->conn))
        return outbox_error_from_pg(err, store->conn, NULL, "database connection lost");
    while ((notify = PQnotifies(store->conn)) != NULL) {
        *notified = true;
        PQfreemem(notify);
    }
    /* outbox.resume() notifies: the next claim reads the pauses first */
    if (*notified)
        store->pauses.read_at = 0;
    return 0;
}

/* ---- claim ----------------------------------------------------------------- */

static int
compare_job(const void *a, const void *b)
{
    const struct outbox_job *x = a, *y = b;

    return (x->job_id > y->job_id) - (x->job_id < y->job_id);
}

int
outbox_claim_send(outbox_store *store, const char *const *queues, size_t queue_count, int limit,
                  int lease_seconds, struct outbox_error *err)
{
    char limit_text[16], lease_text[16];
    struct pg_array queue_array = {0};
    const char *values[8];
    enum statement statement;
    int rc, count;

    if (limit <= 0 || lease_seconds <= 0)
        return outbox_error_set(err, OUTBOX_ERR_INVALID, "claim limit and lease must be positive");
    if (pauses_refresh(store, err) != 0)
        return -1;
    snprintf(limit_text, sizeof(limit_text), "%d", limit);
    snprintf(lease_text, sizeof(lease_text), "%d", lease_seconds);
    values[0] = store->worker_id;
    values[1] = limit_text;
    values[2] = lease_text;
    values[3] = store->block_on_dead_head ? "true" : "false";
    if (queue_count > 0) {
        for (size_t i = 0; i < queue_count; i++)
            array_add_text(&queue_array, queues[i]);
        if ((values[4] = array_finish(&queue_array)) == NULL) {
            array_clear(&queue_array);
            return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        }
    }
    count = queue_count > 0 ? 5 : 4;
    if (store->pauses.any) {
        values[count++] = store->pauses.queues;
        values[count++] = store->pauses.key_queues;
        values[count++] = store->pauses.keys;
        statement = queue_count > 0 ? STMT_CLAIM_QUEUES_PAUSED : STMT_CLAIM_ALL_PAUSED;
    } else {
        statement = queue_count > 0 ? STMT_CLAIM_QUEUES : STMT_CLAIM_ALL;
    }
    rc = queue_prepared(store, statement, count, values, "unable to claim jobs from 'outbox.job'",
                        err);
    array_clear(&queue_array);
    return rc;
}

int
outbox_claim_receive(outbox_store *store, struct outbox_batch *batch, struct outbox_error *err)
{
    PGresult *result;
    int rows;

    memset(batch, 0, sizeof(*batch));
    if (pauses_collect(store, err) != 0)
        return -1;
    result = collect_prepared(store, STMT_CLAIM_ALL, PGRES_TUPLES_OK,
                              "unable to claim jobs from 'outbox.job'", err);
    if (result == NULL)
        return -1;

    rows = PQntuples(result);
    if (rows == 0) {
        PQclear(result);
        return 0;
    }
    batch->jobs = calloc((size_t)rows, sizeof(*batch->jobs));
    if (batch->jobs == NULL) {
        /* the rows stay claimed until their lease expires and the reaper frees them */
        PQclear(result);
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    }
    for (int r = 0; r < rows; r++) {
        struct outbox_job *job = &batch->jobs[r];

        job->job_id = strtoll(PQgetvalue(result, r, 0), NULL, 10);
        job->generation = (int32_t)strtol(PQgetvalue(result, r, 1), NULL, 10);
        job->max_attempts = (int32_t)strtol(PQgetvalue(result, r, 2), NULL, 10);
        job->queue = PQgetvalue(result, r, 3);
        job->payload = PQgetvalue(result, r, 4);
        job->payload_len = (size_t)PQgetlength(result, r, 4);
        job->headers = PQgetvalue(result, r, 5);
        job->ordering_key = PQgetisnull(result, r, 6) ? NULL : PQgetvalue(result, r, 6);
        job->created_at = strtod(PQgetvalue(result, r, 7), NULL);
        if (!isfinite(job->created_at))
            job->created_at = 0; /* an infinite created_at has no age */
        job->replays = (int32_t)strtol(PQgetvalue(result, r, 8), NULL, 10);
        job->exchange = PQgetisnull(result, r, 9) ? NULL : PQgetvalue(result, r, 9);
        job->routing_key = PQgetisnull(result, r, 10) ? NULL : PQgetvalue(result, r, 10);
    }
    qsort(batch->jobs, (size_t)rows, sizeof(*batch->jobs), compare_job);
    batch->count = (size_t)rows;
    batch->storage = result;
    return 0;
}

int
outbox_claim(outbox_store *store, const char *const *queues, size_t queue_count, int limit,
             int lease_seconds, struct outbox_batch *batch, struct outbox_error *err)
{
    memset(batch, 0, sizeof(*batch));
    if (outbox_claim_send(store, queues, queue_count, limit, lease_seconds, err) != 0)
        return -1;
    return outbox_claim_receive(store, batch, err);
}

void
outbox_batch_release_memory(struct outbox_batch *batch)
{
    if (batch == NULL)
        return;
    PQclear(batch->storage);
    free(batch->jobs);
    memset(batch, 0, sizeof(*batch));
}

/* ---- fenced writes --------------------------------------------------------- */

/* Sends one of the lease-set statements (extend, complete, release) without waiting. */
static int
lease_write_send(outbox_store *store, enum statement statement, const char *context,
                 const struct outbox_lease *leases, size_t count, const char *extra_param,
                 struct outbox_error *err)
{
    struct pg_array ids = {0}, generations = {0};
    const char *values[4];
    int rc;

    if (count == 0)
        return 0;
    for (size_t i = 0; i < count; i++) {
        array_add_int(&ids, (long long)leases[i].job_id);
        array_add_int(&generations, (long long)leases[i].generation);
    }
    values[0] = store->worker_id;
    values[1] = array_finish(&ids);
    values[2] = array_finish(&generations);
    values[3] = extra_param;
    if (values[1] == NULL || values[2] == NULL)
        rc = outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    else
        rc = queue_prepared(store, statement, extra_param ? 4 : 3, values, context, err);
    array_clear(&ids);
    array_clear(&generations);
    return rc;
}

/*
 * Collects the result of a fenced write sent for the rows job_ids[0..count-1]
 * and marks done[] (and dead[]).
 */
static int
fenced_write_receive(outbox_store *store, enum statement statement, const char *context,
                     const int64_t *job_ids, size_t count, bool *done, bool *dead,
                     size_t *changed, struct outbox_error *err)
{
    PGresult *result;
    int rc;

    if (changed != NULL)
        *changed = 0;
    if (count == 0)
        return 0;
    result = collect_prepared(store, statement, PGRES_TUPLES_OK, context, err);
    if (result == NULL)
        return -1;
    rc = mark_returned(result, job_ids, count, done, dead, changed, err);
    PQclear(result);
    return rc;
}

/* fenced_write_receive() for a lease set. */
static int
lease_write_receive(outbox_store *store, enum statement statement, const char *context,
                    const struct outbox_lease *leases, size_t count, bool *done, size_t *changed,
                    struct outbox_error *err)
{
    int64_t *job_ids = malloc((count > 0 ? count : 1) * sizeof(*job_ids));
    int rc;

    if (job_ids == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    for (size_t i = 0; i < count; i++)
        job_ids[i] = leases[i].job_id;
    rc = fenced_write_receive(store, statement, context, job_ids, count, done, NULL, changed, err);
    free(job_ids);
    return rc;
}

/* Runs one of the lease-set statements and waits for it. */
static int
fenced_lease_write(outbox_store *store, enum statement statement, const char *context,
                   const struct outbox_lease *leases, size_t count, const char *extra_param,
                   bool *done, size_t *changed, struct outbox_error *err)
{
    if (lease_write_send(store, statement, context, leases, count, extra_param, err) != 0)
        return -1;
    return lease_write_receive(store, statement, context, leases, count, done, changed, err);
}

int
outbox_extend(outbox_store *store, const struct outbox_lease *leases, size_t count,
              int lease_seconds, bool *done, size_t *changed, struct outbox_error *err)
{
    char lease_text[16];

    if (lease_seconds <= 0)
        return outbox_error_set(err, OUTBOX_ERR_INVALID, "lease must be positive");
    snprintf(lease_text, sizeof(lease_text), "%d", lease_seconds);
    return fenced_lease_write(store, STMT_EXTEND, "unable to extend leases", leases, count,
                              lease_text, done, changed, err);
}

#define COMPLETE_CONTEXT "unable to mark jobs succeeded"

/* The complete statement of the store's --on-success mode. */
static enum statement
complete_statement(const outbox_store *store)
{
    return store->delete_on_success ? STMT_COMPLETE_DELETE : STMT_COMPLETE;
}

int
outbox_complete(outbox_store *store, const struct outbox_lease *leases, size_t count, bool *done,
                size_t *changed, struct outbox_error *err)
{
    return fenced_lease_write(store, complete_statement(store), COMPLETE_CONTEXT, leases, count,
                              NULL, done, changed, err);
}

int
outbox_complete_send(outbox_store *store, const struct outbox_lease *leases, size_t count,
                     struct outbox_error *err)
{
    return lease_write_send(store, complete_statement(store), COMPLETE_CONTEXT, leases, count, NULL,
                            err);
}

int
outbox_complete_receive(outbox_store *store, const struct outbox_lease *leases, size_t count,
                        bool *done, size_t *changed, struct outbox_error *err)
{
    return lease_write_receive(store, complete_statement(store), COMPLETE_CONTEXT, leases, count,
                               done, changed, err);
}

#define RELEASE_CONTEXT "unable to release jobs"

int
outbox_release(outbox_store *store, const struct outbox_lease *leases, size_t count, bool *done,
               size_t *changed, struct outbox_error *err)
{
    return fenced_lease_write(store, STMT_RELEASE, RELEASE_CONTEXT, leases, count, NULL, done,
                              changed, err);
}

int
outbox_release_send(outbox_store *store, const struct outbox_lease *leases, size_t count,
                    struct outbox_error *err)
{
    return lease_write_send(store, STMT_RELEASE, RELEASE_CONTEXT, leases, count, NULL, err);
}

int
outbox_release_receive(outbox_store *store, const struct outbox_lease *leases, size_t count,
                       bool *done, size_t *changed, struct outbox_error *err)
{
    return lease_write_receive(store, STMT_RELEASE, RELEASE_CONTEXT, leases, count, done, changed,
                               err);
}

#define FAIL_CONTEXT "unable to record failed jobs"

int
outbox_fail_send(outbox_store *store, const struct outbox_failure *failures, size_t count,
                 struct outbox_error *err)
{
    struct pg_array ids = {0}, generations = {0}, errors = {0}, delays = {0}, permanent = {0};
    const char *values[7];
    int rc;

    if (count == 0)
        return 0;
    for (size_t i = 0; i < count; i++) {
        array_add_int(&ids, (long long)failures[i].job_id);
        array_add_int(&generations, (long long)failures[i].generation);
        array_add_text(&errors, failures[i].error ? failures[i].error : "");
        array_add_double(&delays, failures[i].retry_seconds > 0 ? failures[i].retry_seconds : 0.0);
        array_add_bool(&permanent, failures[i].permanent);
    }
    values[0] = store->worker_id;
    values[1] = array_finish(&ids);
    values[2] = array_finish(&generations);
    values[3] = array_finish(&errors);
    values[4] = array_finish(&delays);
    values[5] = array_finish(&permanent);
    values[6] = store->block_on_dead_head ? "true" : "false";
    if (values[1] == NULL || values[2] == NULL || values[3] == NULL || values[4] == NULL ||
        values[5] == NULL)
        rc = outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    else
        rc = queue_prepared(store, STMT_FAIL, 7, values, FAIL_CONTEXT, err);
    array_clear(&ids);
    array_clear(&generations);
    array_clear(&errors);
    array_clear(&delays);
    array_clear(&permanent);
    return rc;
}

int
outbox_fail_receive(outbox_store *store, const struct outbox_failure *failures, size_t count,
                    bool *done, bool *dead, size_t *changed, struct outbox_error *err)
{
    int64_t *job_ids = malloc((count > 0 ? count : 1) * sizeof(*job_ids));
    int rc;

    if (job_ids == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    for (size_t i = 0; i < count; i++)
        job_ids[i] = failures[i].job_id;
    rc = fenced_write_receive(store, STMT_FAIL, FAIL_CONTEXT, job_ids, count, done, dead, changed,
                              err);
    free(job_ids);
    return rc;
}

int
outbox_fail(outbox_store *store, const struct outbox_failure *failures, size_t count, bool *done,
            bool *dead, size_t *changed, struct outbox_error *err)
{
    if (outbox_fail_send(store, failures, count, err) != 0)
        return -1;
    return outbox_fail_receive(store, failures, count, done, dead, changed, err);
}

/* ---- maintenance ----------------------------------------------------------- */

int
outbox_reap(outbox_store *store, int limit, double retry_seconds, struct outbox_reap_result *out,
            struct outbox_error *err)
{
    char limit_text[16], delay_text[32];
    const char *values[2] = {limit_text, delay_text};
    PGresult *result;

    memset(out, 0, sizeof(*out));
    if (limit <= 0)
        return outbox_error_set(err, OUTBOX_ERR_INVALID, "reap limit must be positive");
    snprintf(limit_text, sizeof(limit_text), "%d", limit);
    snprintf(delay_text, sizeof(delay_text), "%.3f", retry_seconds > 0 ? retry_seconds : 0.0);
    result = run_prepared(store, STMT_REAP, 2, values, PGRES_TUPLES_OK,
                          "unable to reap expired leases", err);
    if (result == NULL)
        return -1;
    for (int r = 0; r < PQntuples(result); r++) {
        if (PQgetvalue(result, r, 0)[0] == 't')
            out->dead++;
        else
            out->ready++;
    }
    PQclear(result);
    return 0;
}

int
outbox_release_waiting(outbox_store *store, int key_limit, size_t *released,
                       struct outbox_error *err)
{
    char limit_text[16];
    const char *values[4];
    PGresult *result;
    long long looked_at;

    *released = 0;
    if (key_limit <= 0)
        return outbox_error_set(err, OUTBOX_ERR_INVALID, "sweep limit must be positive");
    snprintf(limit_text, sizeof(limit_text), "%d", key_limit);
    values[0] = limit_text;
    values[1] = store->sweep_queue ? store->sweep_queue : "";
    values[2] = store->sweep_key ? store->sweep_key : "";
    values[3] = store->block_on_dead_head ? "true" : "false";
    result = run_prepared(store, STMT_SWEEP_HELD, 4, values, PGRES_TUPLES_OK,
                          "unable to release waiting rows", err);
    if (result == NULL)
        return -1;
    *released = (size_t)strtoull(PQgetvalue(result, 0, 0), NULL, 10);
    looked_at = strtoll(PQgetvalue(result, 0, 1), NULL, 10);
    free(store->sweep_queue);
    free(store->sweep_key);
    store->sweep_queue = NULL;
    store->sweep_key = NULL;
    /* a short round reached the end: the next one starts over */
    if (looked_at >= key_limit && !PQgetisnull(result, 0, 2)) {
        store->sweep_queue = strdup(PQgetvalue(result, 0, 2));
        store->sweep_key = strdup(PQgetvalue(result, 0, 3));
    }
    PQclear(result);
    return 0;
}

/* ---- retention cleanup, shared with outboxctl purge ------------------------- */

/* clang-format off */
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
    "  DELETE FROM outbox.job AS j USING doomed AS d WHERE j.job_id = d.job_id RETURNING 1)"
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

int
outbox_cleanup_cutoff(PGconn *conn, double older_than_seconds, char *cutoff, size_t size,
                      struct outbox_error *err)
{
    char seconds_text[32];
    const char *values[1] = {seconds_text};
    PGresult *result;

    if (older_than_seconds < 0 || size == 0)
        return outbox_error_set(err, OUTBOX_ERR_INVALID,
                                "unable to delete old succeeded jobs: negative age");
    snprintf(seconds_text, sizeof(seconds_text), "%.3f", older_than_seconds);
    result = PQexecParams(conn, SQL_CLEANUP_CUTOFF, 1, NULL, values, NULL, NULL, 0);
    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        outbox_error_from_pg(err, conn, result, "unable to delete old succeeded jobs");
        PQclear(result);
        return -1;
    }
    if (strlen(PQgetvalue(result, 0, 0)) >= size) {
        PQclear(result);
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL,
                                "unable to delete old succeeded jobs: cutoff too long");
    }
    snprintf(cutoff, size, "%s", PQgetvalue(result, 0, 0));
    PQclear(result);
    return 0;
}

int
outbox_cleanup_batch(PGconn *conn, const char *cutoff, int limit,
                     struct outbox_cleanup_result *cleaned, struct outbox_error *err)
{
    char limit_text[16];
    const char *values[2] = {cutoff, limit_text};
    PGresult *result;

    *cleaned = (struct outbox_cleanup_result){0};
    if (limit <= 0)
        return outbox_error_set(err, OUTBOX_ERR_INVALID,
                                "unable to delete old succeeded jobs: limit must be positive");
    snprintf(limit_text, sizeof(limit_text), "%d", limit);
    result = PQexecParams(conn, SQL_CLEANUP_BATCH, 2, NULL, values, NULL, NULL, 0);
    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        outbox_error_from_pg(err, conn, result, "unable to delete old succeeded jobs");
        PQclear(result);
        return -1;
    }
    cleaned->locked = strcmp(PQgetvalue(result, 0, 0), "t") == 0;
    cleaned->deleted = (size_t)strtoull(PQgetvalue(result, 0, 1), NULL, 10);
    PQclear(result);
    return 0;
}

int
outbox_sample_table(PGconn *conn, double retention_seconds, struct outbox_table_sample *sample,
                    struct outbox_error *err)
{
    char retention_text[32];
    const char *values[1] = {retention_text};
    PGresult *result;

    memset(sample, 0, sizeof(*sample));
    snprintf(retention_text, sizeof(retention_text), "%.3f",
             retention_seconds > 0 ? retention_seconds : 0);
    result = PQexecParams(conn, SQL_TABLE_SAMPLE, 1, NULL, values, NULL, NULL, 0);
    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        outbox_error_from_pg(err, conn, result, "unable to read the size of 'outbox.job'");
        PQclear(result);
        return -1;
    }
    sample->table_bytes = strtoll(PQgetvalue(result, 0, 0), NULL, 10);
    sample->index_bytes = strtoll(PQgetvalue(result, 0, 1), NULL, 10);
    sample->dead_tuples = strtoll(PQgetvalue(result, 0, 2), NULL, 10);
    sample->succeeded_rows = strtoll(PQgetvalue(result, 0, 3), NULL, 10);
    sample->past_retention_rows = strtoll(PQgetvalue(result, 0, 4), NULL, 10);
    sample->oldest_past_retention_seconds = strtod(PQgetvalue(result, 0, 5), NULL);
    PQclear(result);
    return 0;
}

/* ---- observation ----------------------------------------------------------- */

int
outbox_sample_backlog(outbox_store *store,
                      void (*each)(void *arg, const struct outbox_backlog *backlog), void *arg,
                      struct outbox_error *err)
{
    PGresult *result = run_prepared(store, STMT_BACKLOG, 0, NULL, PGRES_TUPLES_OK,
                                    "unable to sample the backlog", err);

    if (result == NULL)
        return -1;
    for (int r = 0; r < PQntuples(result); r++) {
        struct outbox_backlog backlog = {
            .queue = PQgetvalue(result, r, 0),
            .ready = strtoll(PQgetvalue(result, r, 1), NULL, 10),
            .oldest_ready_age = strtod(PQgetvalue(result, r, 2), NULL),
            .paused = PQgetvalue(result, r, 3)[0] == 't',
            .paused_keys = strtoll(PQgetvalue(result, r, 4), NULL, 10),
        };

        each(arg, &backlog);
    }
    PQclear(result);
    return 0;
}

int
outbox_sample_horizon(outbox_store *store, struct outbox_horizon *horizon, struct outbox_error *err)
{
    PGresult *result = run_prepared(store, STMT_HORIZON, 0, NULL, PGRES_TUPLES_OK,
                                    "unable to sample open transactions", err);

    memset(horizon, 0, sizeof(*horizon));
    if (result == NULL)
        return -1;
    if (PQntuples(result) > 0) {
        horizon->found = true;
        horizon->age_seconds = strtod(PQgetvalue(result, 0, 0), NULL);
        horizon->pid = (int)strtol(PQgetvalue(result, 0, 1), NULL, 10);
        snprintf(horizon->application, sizeof(horizon->application), "%s",
                 PQgetvalue(result, 0, 2));
        snprintf(horizon->state, sizeof(horizon->state), "%s", PQgetvalue(result, 0, 3));
    }
    PQclear(result);
    return 0;
}

/* ---- producer and consumer side ------------------------------------------- */

/* OUTBOX_OK when conn is inside an open transaction, else fills err for action. */
static int
require_transaction(PGconn *conn, const char *action, struct outbox_error *err)
{
    switch (PQtransactionStatus(conn)) {
    case PQTRANS_INTRANS:
        return 0;
    case PQTRANS_INERROR:
        return outbox_error_set(err, OUTBOX_ERR_STATE, "unable to %s: the transaction is aborted",
                                action);
    default:
        return outbox_error_set(err, OUTBOX_ERR_STATE,
                                "unable to %s: no open transaction on the connection"
                                " (BEGIN first, so the row commits with your data)",
                                action);
    }
}

/* One inbox accept: ordering_key NULL is the plain inbox, else the keyed one. */
static int
inbox_accept(PGconn *conn, const char *consumer, const char *message_id,
             const char *ordering_key, bool *accepted, struct outbox_error *err)
{
    const char *values[3] = {consumer, message_id, ordering_key};
    bool keyed = ordering_key != NULL;
    PGresult *result;

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

/* Enqueueing needs the caller's open, healthy transaction. */
static int
check_producer_transaction(PGconn *conn, struct outbox_error *err)
{
    switch (PQtransactionStatus(conn)) {
    case PQTRANS_INTRANS:
        return 0;
    case PQTRANS_INERROR:
        return outbox_error_set(err, OUTBOX_ERR_STATE,
                                "unable to enqueue: the transaction is aborted");
    default:
        return outbox_error_set(err, OUTBOX_ERR_STATE,
                                "unable to enqueue: no open transaction on the connection"
                                " (BEGIN first, so the row commits with your data)");
    }
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
    if (check_producer_transaction(conn, err) != 0)
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

        snprintf(context, sizeof(context), "unable to enqueue to '%.200s'", message->queue);
        outbox_error_from_pg(err, conn, result, context);
        PQclear(result);
        return -1;
    }
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
            array_add_null(a);
        } else {
            array_add_text(a, value);
            *any = true;
        }
    }
}

/* One enqueue_batch() call for messages[0..count-1], which share their options. */
static int
enqueue_group(PGconn *conn, const struct outbox_message *messages, size_t count, int64_t *job_ids,
              struct outbox_error *err)
{
    const struct outbox_message *first = &messages[0];
    struct pg_array payloads = {0}, idempotency_keys = {0}, ordering_keys = {0};
    char priority[16], delay[32], max_attempts[16];
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
    values[1] = array_finish(&payloads);
    values[2] = array_finish(&idempotency_keys);
    values[3] = array_finish(&ordering_keys);
    if (values[1] == NULL || values[2] == NULL || values[3] == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        goto cleanup;
    }
    snprintf(priority, sizeof(priority), "%d", (int)first->priority);
    snprintf(delay, sizeof(delay), "%.6f", first->delay_seconds);
    snprintf(max_attempts, sizeof(max_attempts), "%d", attempts_or_default(first->max_attempts));
    values[0] = first->queue;
    if (!any_idempotency_key)
        values[2] = NULL;
    if (!any_ordering_key)
        values[3] = NULL;
    values[4] = first->headers_json;
    values[5] = priority;
    values[6] = delay;
    values[7] = max_attempts;
    values[8] = first->exchange;
    values[9] = first->routing_key;
    values[10] = first->traceparent;
    values[11] = first->tracestate;
    traced = first->traceparent != NULL && first->traceparent[0] != '\0';
    result = PQexecParams(conn, traced ? SQL_ENQUEUE_BATCH_TRACED : SQL_ENQUEUE_BATCH,
                          traced ? 12 : 10, NULL, values, NULL, NULL, 0);
    if (PQresultStatus(result) != PGRES_TUPLES_OK) {
        char context[300];

        snprintf(context, sizeof(context), "unable to enqueue to '%.200s'", first->queue);
        outbox_error_from_pg(err, conn, result, context);
        goto cleanup;
    }
    if ((size_t)PQntuples(result) != count) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL,
                         "unable to enqueue to '%.200s': %d job ids returned for %zu rows",
                         first->queue, PQntuples(result), count);
        goto cleanup;
    }
    for (size_t i = 0; i < count; i++)
        job_ids[i] = strtoll(PQgetvalue(result, (int)i, 0), NULL, 10);
    rc = 0;

cleanup:
    PQclear(result);
    array_clear(&payloads);
    array_clear(&idempotency_keys);
    array_clear(&ordering_keys);
    return rc;
}

int
outbox_enqueue_many(PGconn *conn, const struct outbox_message *messages, size_t count,
                    int64_t *job_ids, struct outbox_error *err)
{
    size_t start = 0;

    if (conn == NULL || (count > 0 && (messages == NULL || job_ids == NULL)))
        return outbox_error_set(err, OUTBOX_ERR_INVALID, "enqueue needs a queue and a payload");
    for (size_t i = 0; i < count; i++) {
        if (messages[i].queue == NULL || messages[i].payload_json == NULL)
            return outbox_error_set(err, OUTBOX_ERR_INVALID,
                                    "enqueue needs a queue and a payload (message %zu has none)",
                                    i);
    }
    if (check_producer_transaction(conn, err) != 0)
        return -1;
    while (start < count) {
        size_t end = start + 1;

        while (end < count && same_batch(&messages[start], &messages[end]))
            end++;
        if (enqueue_group(conn, messages + start, end - start, job_ids + start, err) != 0)
            return -1;
        start = end;
    }
    return 0;
}
