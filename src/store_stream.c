/*
 * store_stream.c - stream partitions: leases, the gap-free read, the cursor.
 *
 * Statements are prepared once per connection and take bound parameters
 * only. See store_stream.h for the rules, sql/009_stream.sql for the schema.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buffer.h"
#include "error.h"
#include "store_row.h"
#include "store_admin_lock.h"
#include "store_stream.h"
#include "timeouts.h"

struct stream_store {
    PGconn *conn;
    char *owner;
};

enum stream_statement {
    SSTMT_ACQUIRE,
    SSTMT_RENEW,
    SSTMT_RELEASE,
    SSTMT_READ,
    SSTMT_ADVANCE,
    SSTMT_LAG,
    SSTMT_HORIZON,
    SSTMT_CLEANUP,
    SSTMT_KEY_LATER,
    SSTMT_MEMBER,
    SSTMT_LEAVE,
    SSTMT_SURPLUS,
    SSTMT_KEY_CLEANUP,
    SSTMT_REBASE,
    SSTMT_COUNT,
};

/* ---- SQL ---------------------------------------------------------------------- */

/* The fence of every cursor write: this owner, this generation, a live lease. */
#define CURSOR_FENCE                                                                               \
    " WHERE c.queue = $2 AND c.partition = $3 AND c.owner = $1 AND c.generation = $4"              \
    "   AND c.lease_until > clock_timestamp()"

/*
 * The relays there are: live members (migration 010), the owners of live
 * leases (a relay that writes no member row counts too) and this one ($1).
 * A relay's fair share is all partitions divided by their number, rounded
 * up; "wanted" is how many more it may take (negative: its surplus).
 */
#define STREAM_SHARE_CTE                                                                           \
    "WITH owners AS ("                                                                             \
    " SELECT m.owner FROM outbox.stream_member AS m WHERE m.seen_until > clock_timestamp()"       \
    " UNION SELECT l.owner FROM outbox.stream_cursor AS l WHERE l.lease_until > clock_timestamp()" \
    " UNION SELECT $1::text),"                                                                     \
    " share AS ("                                                                                  \
    " SELECT ceil((SELECT count(*) FROM outbox.stream_cursor)::numeric"                           \
    "             / (SELECT count(*) FROM owners))"                                                \
    "        - (SELECT count(*) FROM outbox.stream_cursor AS l"                                    \
    "           WHERE l.owner = $1 AND l.lease_until > clock_timestamp()) AS wanted)"

/*
 * Free partitions, up to this owner's fair share. SKIP LOCKED: two relays
 * acquiring at once take different partitions.
 */
static const char SQL_ACQUIRE[] =
    STREAM_SHARE_CTE ","
    " free AS ("
    " SELECT f.queue, f.partition FROM outbox.stream_cursor AS f"
    " WHERE (f.lease_until IS NULL OR f.lease_until <= clock_timestamp())"
    "   AND ($4::text[] IS NULL OR f.queue = ANY ($4::text[]))"
    "   AND f.partition % $5 = $6"
    " ORDER BY f.lease_until NULLS FIRST, f.queue, f.partition"
    " LIMIT greatest(0, least($3::bigint, (SELECT wanted FROM share)::bigint))"
    " FOR UPDATE SKIP LOCKED)"
    " UPDATE outbox.stream_cursor AS c"
    " SET owner = $1, generation = nextval('outbox.stream_generation'),"
    "     lease_until = clock_timestamp() + make_interval(secs => $2)"
    " FROM free WHERE c.queue = free.queue AND c.partition = free.partition"
    "   AND (c.lease_until IS NULL OR c.lease_until <= clock_timestamp())"
    " RETURNING c.queue, c.partition, c.generation, c.cursor_xid::text, c.cursor_job_id,"
    "   (SELECT (extract(epoch FROM s.created_at) * 1000000)::bigint FROM outbox.stream AS s"
    "    WHERE s.queue = c.queue) || ':' || c.partition,"
    "   c.history_epoch, c.cursor_xid >= pg_snapshot_xmax(pg_current_snapshot())";

/*
 * The partitions this owner holds over its fair share that another member
 * holding less than its share publishes (its queues cover them), at most
 * the surplus.
 */
static const char SQL_SURPLUS[] =
    STREAM_SHARE_CTE ","
    " needy AS ("
    " SELECT m.queues FROM outbox.stream_member AS m"
    " WHERE m.seen_until > clock_timestamp() AND m.owner <> $1"
    "   AND (SELECT count(*) FROM outbox.stream_cursor AS l"
    "        WHERE l.owner = m.owner AND l.lease_until > clock_timestamp())"
    "       < ceil((SELECT count(*) FROM outbox.stream_cursor)::numeric"
    "              / (SELECT count(*) FROM owners)))"
    " SELECT c.queue, c.partition FROM outbox.stream_cursor AS c"
    " WHERE c.owner = $1 AND c.lease_until > clock_timestamp()"
    "   AND EXISTS (SELECT 1 FROM needy AS n WHERE n.queues IS NULL OR c.queue = ANY (n.queues))"
    " ORDER BY c.queue, c.partition DESC"
    " LIMIT greatest(0, -(SELECT wanted FROM share))::bigint";

/*
 * This relay is there for another lease's length ($2 seconds); members
 * gone for ten leases are forgotten on the way.
 */
static const char SQL_MEMBER[] =
    "WITH gone AS (DELETE FROM outbox.stream_member AS g"
    "              WHERE g.seen_until < clock_timestamp() - make_interval(secs => 10 * $2::float8))"
    " INSERT INTO outbox.stream_member AS m (owner, queues, seen_until)"
    " VALUES ($1, $3::text[], clock_timestamp() + make_interval(secs => $2::float8))"
    " ON CONFLICT (owner) DO UPDATE SET queues = excluded.queues, seen_until = excluded.seen_until";

static const char SQL_LEAVE[] = "DELETE FROM outbox.stream_member WHERE owner = $1";

static const char SQL_RENEW[] =
    "UPDATE outbox.stream_cursor AS c"
    " SET lease_until = clock_timestamp() + make_interval(secs => $5)" CURSOR_FENCE
    " RETURNING c.cursor_xid::text, c.cursor_job_id, c.history_epoch,"
    "   c.cursor_xid >= pg_snapshot_xmax(pg_current_snapshot())";

static const char SQL_REBASE[] =
    "SELECT r.cursor_xid, r.cursor_job_id, r.history_epoch"
    " FROM outbox.stream_rebase($1, $2, $3, $4, $5) AS r";

static const char SQL_RELEASE[] = "UPDATE outbox.stream_cursor AS c"
                                  " SET owner = NULL, lease_until = NULL" CURSOR_FENCE;

/*
 * The read follows job_stream_idx from the cursor on. xid < the horizon:
 * only transactions that have ended, so the rows read are every row that
 * will ever sort before the last one read. It is fenced like a write ($6
 * owner, $7 generation, in the same snapshot as the rows): an owner whose
 * lease ended, or whose stream was disabled and made again, reads nothing,
 * so it never publishes another lease's rows under its own stream's order.
 */
static const char SQL_READ[] =
    "SELECT j.job_id, j.attempts + 1, j.max_attempts, j.queue, j.payload::text, j.headers::text,"
    "       j.ordering_key, date_part('epoch', j.created_at), j.replays, j.exchange,"
    "       j.routing_key, j.xid::text, j.stream_from"
    " FROM outbox.job AS j"
    " WHERE j.state = 'stream' AND j.queue = $1 AND j.stream_partition = $2"
    "   AND (j.xid, j.job_id) > ($3::xid8, $4::bigint)"
    "   AND j.xid < pg_snapshot_xmin(pg_current_snapshot())"
    "   AND NOT EXISTS (SELECT 1 FROM outbox.paused AS p"
    "                   WHERE p.queue = $1 AND p.ordering_key IS NULL)"
    "   AND EXISTS (SELECT 1 FROM outbox.stream_cursor AS c"
    "               WHERE c.queue = $1 AND c.partition = $2 AND c.owner = $6"
    "                 AND c.generation = $7 AND c.lease_until > clock_timestamp())"
    " ORDER BY j.xid, j.job_id LIMIT $5";

/*
 * The cursor and the refused rows in one statement: the rows are written
 * only when the fenced cursor update found its row.
 */
static const char SQL_ADVANCE[] =
    "WITH c AS (UPDATE outbox.stream_cursor AS c"
    "  SET cursor_xid = $6::xid8, cursor_job_id = $7, advanced_at = now(),"
    "      lease_until = clock_timestamp() + make_interval(secs => $5)" CURSOR_FENCE
    "  RETURNING 1),"
    " m AS (UPDATE outbox.job AS j"
    "  SET state = CASE WHEN f.permanent OR j.attempts + 1 >= j.max_attempts THEN 'dead'"
    "                   WHEN f.stay THEN 'stream' ELSE 'ready' END,"
    "      stream_partition = CASE WHEN f.stay AND NOT f.permanent AND j.attempts + 1 < j.max_attempts"
    "                              THEN j.stream_partition END,"
    "      stream_from = CASE WHEN f.stay AND NOT f.permanent AND j.attempts + 1 < j.max_attempts"
    "                         THEN j.stream_from END,"
    "      attempts = j.attempts + 1, last_error = f.error,"
    "      run_at = clock_timestamp() + make_interval(secs => f.delay),"
    "      finished_at = CASE WHEN f.permanent OR j.attempts + 1 >= j.max_attempts THEN now() END"
    "  FROM unnest($8::bigint[], $9::text[], $10::bool[], $11::float8[], $12::bool[])"
    "       AS f(job_id, error, permanent, delay, stay)"
    "  WHERE j.job_id = f.job_id AND j.state = 'stream' AND EXISTS (SELECT 1 FROM c)"
    "  RETURNING 1)"
    " SELECT (SELECT count(*) FROM c), (SELECT count(*) FROM m)";

static const char SQL_LAG[] =
    "SELECT c.queue, c.partition,"
    "       CASE WHEN c.lease_until > clock_timestamp() THEN c.owner ELSE '' END,"
    "       (SELECT count(*) FROM (SELECT 1 FROM outbox.job AS j"
    "         WHERE j.state = 'stream' AND j.queue = c.queue AND j.stream_partition = c.partition"
    "           AND (j.xid, j.job_id) > (c.cursor_xid, c.cursor_job_id) LIMIT 100000) AS x),"
    "       coalesce(extract(epoch FROM now() - (SELECT j.created_at FROM outbox.job AS j"
    "         WHERE j.state = 'stream' AND j.queue = c.queue AND j.stream_partition = c.partition"
    "           AND (j.xid, j.job_id) > (c.cursor_xid, c.cursor_job_id)"
    "         ORDER BY j.xid, j.job_id LIMIT 1))::float8, 0),"
    "       CASE WHEN c.lease_until > clock_timestamp() THEN to_char(c.lease_until AT TIME ZONE"
    "            'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') ELSE '' END"
    " FROM outbox.stream_cursor AS c ORDER BY c.queue, c.partition";

/*
 * The oldest transaction with an xid, in any database of the cluster: what
 * pg_snapshot_xmin() waits for. A prepared transaction (no backend, pid 0)
 * holds it as a session's does, until COMMIT or ROLLBACK PREPARED.
 */
static const char SQL_HORIZON[] =
    "SELECT h.pid, h.usr, h.application, h.seconds, h.query, h.gid, h.database FROM ("
    " SELECT a.pid, coalesce(a.usename::text, '') AS usr,"
    "        coalesce(a.application_name, '') AS application,"
    "        coalesce(extract(epoch FROM now() - a.xact_start)::float8, 0) AS seconds,"
    "        left(regexp_replace(coalesce(a.query, ''), '\\s+', ' ', 'g'), 150) AS query,"
    "        '' AS gid, coalesce(a.datname::text, '') AS database, age(a.backend_xid) AS xid_age"
    " FROM pg_stat_activity AS a"
    " WHERE a.backend_xid IS NOT NULL AND a.pid <> pg_backend_pid()"
    " UNION ALL"
    " SELECT 0, p.owner::text, '', extract(epoch FROM now() - p.prepared)::float8, '', p.gid,"
    "        p.database::text, age(p.transaction)"
    " FROM pg_prepared_xacts AS p) AS h"
    " ORDER BY h.xid_age DESC LIMIT 1";

/*
 * The oldest rows behind each cursor, in read order, $2 at most: those
 * older than the retention go. The scan never passes $2 rows a partition,
 * however many younger rows wait behind the cursor for their turn, and a
 * partition whose oldest row is younger than the retention costs one
 * index probe (the usual case: nothing to delete yet), made once per
 * partition. The rows are deleted through the primary key: a join with
 * them was planned (generic plan) as a hash join over a scan of the whole
 * table, 0.3-0.7 s a batch on a table of 100 000 rows, and growing with it.
 */
static const char SQL_CLEANUP[] =
    "WITH doomed AS ("
    " SELECT d.job_id FROM outbox.stream_cursor AS c"
    " CROSS JOIN LATERAL ("
    "   SELECT o.created_at FROM outbox.job AS o"
    "   WHERE o.state = 'stream' AND o.queue = c.queue AND o.stream_partition = c.partition"
    "   ORDER BY o.xid, o.job_id LIMIT 1) AS oldest"
    " CROSS JOIN LATERAL ("
    "   SELECT j.job_id, j.created_at FROM outbox.job AS j"
    "   WHERE j.state = 'stream' AND j.queue = c.queue AND j.stream_partition = c.partition"
    "     AND (j.xid, j.job_id) <= (c.cursor_xid, c.cursor_job_id)"
    "   ORDER BY j.xid, j.job_id LIMIT $2) AS d"
    " WHERE oldest.created_at < now() - make_interval(secs => $1)"
    "   AND d.created_at < now() - make_interval(secs => $1)"
    " LIMIT $2)"
    " DELETE FROM outbox.job AS j"
    " WHERE j.job_id = ANY (ARRAY(SELECT doomed.job_id FROM doomed)) AND j.state = 'stream'";

/*
 * The last places of ordering keys below the horizon ($1 at most): no
 * transaction still to write a row has an id below it, so none of these
 * can lift a row any more. A key a producer holds right now is skipped.
 */
static const char SQL_KEY_CLEANUP[] =
    "DELETE FROM outbox.stream_key AS k USING ("
    " SELECT d.queue, d.ordering_key FROM outbox.stream_key AS d"
    " WHERE d.place_xid < pg_snapshot_xmin(pg_current_snapshot())"
    " LIMIT $1 FOR UPDATE SKIP LOCKED) AS old"
    " WHERE k.queue = old.queue AND k.ordering_key = old.ordering_key"
    "   AND k.place_xid < pg_snapshot_xmin(pg_current_snapshot())";

/* Whether the partition holds a row of key $5 after ($3, $4), published or not. */
static const char SQL_KEY_LATER[] =
    "SELECT EXISTS (SELECT 1 FROM outbox.job AS j"
    " WHERE j.state = 'stream' AND j.queue = $1 AND j.stream_partition = $2"
    "   AND (j.xid, j.job_id) > ($3::xid8, $4::bigint) AND j.ordering_key = $5)";

static const struct {
    const char *name;
    const char *sql;
} STATEMENTS[SSTMT_COUNT] = {
    [SSTMT_ACQUIRE] = {"outbox_stream_acquire", SQL_ACQUIRE},
    [SSTMT_RENEW] = {"outbox_stream_renew", SQL_RENEW},
    [SSTMT_RELEASE] = {"outbox_stream_release", SQL_RELEASE},
    [SSTMT_READ] = {"outbox_stream_read", SQL_READ},
    [SSTMT_ADVANCE] = {"outbox_stream_advance", SQL_ADVANCE},
    [SSTMT_LAG] = {"outbox_stream_lag", SQL_LAG},
    [SSTMT_HORIZON] = {"outbox_stream_horizon", SQL_HORIZON},
    [SSTMT_CLEANUP] = {"outbox_stream_cleanup", SQL_CLEANUP},
    [SSTMT_KEY_LATER] = {"outbox_stream_key_later", SQL_KEY_LATER},
    [SSTMT_MEMBER] = {"outbox_stream_member", SQL_MEMBER},
    [SSTMT_LEAVE] = {"outbox_stream_leave", SQL_LEAVE},
    [SSTMT_SURPLUS] = {"outbox_stream_surplus", SQL_SURPLUS},
    [SSTMT_KEY_CLEANUP] = {"outbox_stream_key_cleanup", SQL_KEY_CLEANUP},
    [SSTMT_REBASE] = {"outbox_stream_rebase", SQL_REBASE},
};

/* ---- helpers ------------------------------------------------------------------- */

/*
 * Runs a prepared statement; NULL with err unless it returned expected. A
 * broken connection is reset here so the next call starts afresh.
 */
static PGresult *
run(stream_store *s, enum stream_statement statement, int nparams, const char *const *values,
    ExecStatusType expected, const char *context, struct outbox_error *err)
{
    PGresult *result = PQexecPrepared(s->conn, STATEMENTS[statement].name, nparams, values, NULL,
                                      NULL, 0);

    if (result != NULL && PQresultStatus(result) == expected)
        return result;
    outbox_error_from_pg(err, s->conn, result, context);
    PQclear(result);
    return NULL;
}

static void
copy_text(char *out, size_t size, const char *text)
{
    snprintf(out, size, "%s", text == NULL ? "" : text);
}

/* A partition's fence as parameters $1..$4. */
struct fence_values {
    char partition[16];
    char generation[24];
};

static void
fence_values(const struct stream_partition *p, struct fence_values *v)
{
    snprintf(v->partition, sizeof(v->partition), "%d", p->partition);
    snprintf(v->generation, sizeof(v->generation), "%lld", (long long)p->generation);
}

/* ---- connection ---------------------------------------------------------------- */

stream_store *
stream_store_connect(const char *database_url, const char *owner, struct outbox_error *err)
{
    const char *keywords[] = {"fallback_application_name", "connect_timeout", "keepalives",
                              "keepalives_idle", "keepalives_interval", "keepalives_count",
                              "tcp_user_timeout", "dbname", NULL};
    const char *values[] = {"outbox-relay", TIMEOUT_TEXT(TIMEOUT_DATABASE_CONNECT_SECONDS), "1",
                            TIMEOUT_TEXT(TIMEOUT_DATABASE_KEEPALIVE_IDLE_SECONDS),
                            TIMEOUT_TEXT(TIMEOUT_DATABASE_KEEPALIVE_INTERVAL_SECONDS), "3",
                            TIMEOUT_TEXT(TIMEOUT_DATABASE_UNACKNOWLEDGED_MS), database_url, NULL};
    stream_store *s = calloc(1, sizeof(*s));
    PGresult *result = NULL;

    if (s == NULL || (s->owner = strdup(owner)) == NULL) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        goto fail;
    }
    s->conn = PQconnectdbParams(keywords, values, 1);
    if (s->conn == NULL || PQstatus(s->conn) != CONNECTION_OK) {
        outbox_error_from_connect(err, s->conn, database_url, "unable to connect to the database");
        goto fail;
    }
    /*
     * A lost cursor write costs a republish, never a message: no synchronous
     * commit. The statements below have one good plan whatever their
     * parameters (an index of a partition, or the small cursor tables): a
     * plan made for each batch cost PostgreSQL 1-2 us per relayed row.
     */
    result = PQexec(s->conn, "SET synchronous_commit = off; SET statement_timeout = '"
                             TIMEOUT_TEXT(STORE_STATEMENT_TIMEOUT_SECONDS) "s';"
                             " SET lock_timeout = '" TIMEOUT_TEXT(STORE_STATEMENT_TIMEOUT_SECONDS)
                             "s'; SET jit = off;"
                             " SET plan_cache_mode = force_generic_plan;"
                             " SET default_transaction_isolation = 'read committed'");
    if (PQresultStatus(result) != PGRES_COMMAND_OK) {
        outbox_error_from_pg(err, s->conn, result, "unable to set up the database session");
        goto fail;
    }
    PQclear(result);
    result = NULL;
    for (int i = 0; i < SSTMT_COUNT; i++) {
        char context[96];

        snprintf(context, sizeof(context), "unable to prepare '%s'", STATEMENTS[i].name);
        result = PQprepare(s->conn, STATEMENTS[i].name, STATEMENTS[i].sql, 0, NULL);
        if (PQresultStatus(result) != PGRES_COMMAND_OK) {
            outbox_error_from_pg(err, s->conn, result, context);
            if (err != NULL && err->code == OUTBOX_ERR_INTERNAL)
                err->code = OUTBOX_ERR_SCHEMA; /* before migration 009 */
            goto fail;
        }
        PQclear(result);
        result = NULL;
    }
    return s;

fail:
    PQclear(result);
    stream_store_free(s);
    return NULL;
}

PGconn *
stream_store_conn(stream_store *s)
{
    return s->conn;
}

void
stream_store_set_notice_processor(stream_store *s, PQnoticeProcessor processor, void *arg)
{
    PQsetNoticeProcessor(s->conn, processor, arg);
}

void
stream_store_free(stream_store *s)
{
    if (s == NULL)
        return;
    if (s->conn != NULL)
        PQfinish(s->conn);
    free(s->owner);
    free(s);
}

bool
stream_place_format(char *out, const char *xid, int64_t job_id)
{
    out[0] = '\0';
    if (job_id < 0)
        return false;
    snprintf(out, STREAM_PLACE_SIZE, "%020llu%019lld", strtoull(xid, NULL, 10),
             (long long)job_id);
    return true;
}

/* ---- leases -------------------------------------------------------------------- */

int
stream_store_acquire(stream_store *s, const char *queues, int modulus, int residue,
                     double lease_seconds, struct stream_partition *out, size_t capacity,
                     size_t *count, struct outbox_error *err)
{
    char lease[32], limit[24], modulus_text[16], residue_text[16];
    const char *values[6] = {s->owner, lease, limit, queues, modulus_text, residue_text};
    PGresult *result;
    int rows;

    *count = 0;
    snprintf(lease, sizeof(lease), "%.3f", lease_seconds);
    snprintf(limit, sizeof(limit), "%zu", capacity);
    snprintf(modulus_text, sizeof(modulus_text), "%d", modulus > 0 ? modulus : 1);
    snprintf(residue_text, sizeof(residue_text), "%d", residue);
    result = run(s, SSTMT_ACQUIRE, 6, values, PGRES_TUPLES_OK,
                 "unable to acquire stream partitions", err);
    if (result == NULL)
        return -1;
    rows = PQntuples(result);
    for (int r = 0; r < rows && (size_t)r < capacity; r++) {
        struct stream_partition *p = &out[r];

        copy_text(p->queue, sizeof(p->queue), PQgetvalue(result, r, 0));
        p->partition = (int)strtol(PQgetvalue(result, r, 1), NULL, 10);
        p->generation = strtoll(PQgetvalue(result, r, 2), NULL, 10);
        copy_text(p->cursor_xid, sizeof(p->cursor_xid), PQgetvalue(result, r, 3));
        p->cursor_job_id = strtoll(PQgetvalue(result, r, 4), NULL, 10);
        copy_text(p->order, sizeof(p->order), PQgetvalue(result, r, 5));
        p->history_epoch = (int32_t)strtol(PQgetvalue(result, r, 6), NULL, 10);
        p->ahead = strcmp(PQgetvalue(result, r, 7), "t") == 0;
        (*count)++;
    }
    PQclear(result);
    return 0;
}

int
stream_store_member(stream_store *s, const char *queues, double lease_seconds,
                    struct outbox_error *err)
{
    char lease[32];
    const char *values[3] = {s->owner, lease, queues};
    PGresult *result;

    snprintf(lease, sizeof(lease), "%.3f", lease_seconds);
    result = run(s, SSTMT_MEMBER, 3, values, PGRES_COMMAND_OK,
                 "unable to renew this relay's stream membership", err);
    if (result == NULL)
        return -1;
    PQclear(result);
    return 0;
}

int
stream_store_leave(stream_store *s, struct outbox_error *err)
{
    const char *values[1] = {s->owner};
    PGresult *result = run(s, SSTMT_LEAVE, 1, values, PGRES_COMMAND_OK,
                           "unable to end this relay's stream membership", err);

    if (result == NULL)
        return -1;
    PQclear(result);
    return 0;
}

int
stream_store_surplus(stream_store *s, const struct stream_partition *held, size_t count,
                     bool *give_back, struct outbox_error *err)
{
    const char *values[1] = {s->owner};
    PGresult *result = run(s, SSTMT_SURPLUS, 1, values, PGRES_TUPLES_OK,
                           "unable to count this relay's stream partitions", err);

    if (result == NULL)
        return -1;
    for (size_t i = 0; i < count; i++) {
        give_back[i] = false;
        for (int r = 0; r < PQntuples(result) && !give_back[i]; r++)
            give_back[i] = strcmp(PQgetvalue(result, r, 0), held[i].queue) == 0 &&
                           strtol(PQgetvalue(result, r, 1), NULL, 10) == held[i].partition;
    }
    PQclear(result);
    return 0;
}

/* Reads a cursor (xid, job id, history epoch[, ahead]) from row 0 of result into p. */
static void
cursor_from(const PGresult *result, struct stream_partition *p, bool with_ahead)
{
    copy_text(p->cursor_xid, sizeof(p->cursor_xid), PQgetvalue(result, 0, 0));
    p->cursor_job_id = strtoll(PQgetvalue(result, 0, 1), NULL, 10);
    p->history_epoch = (int32_t)strtol(PQgetvalue(result, 0, 2), NULL, 10);
    p->ahead = with_ahead && strcmp(PQgetvalue(result, 0, 3), "t") == 0;
}

int
stream_store_renew(stream_store *s, struct stream_partition *p, double lease_seconds, bool reload,
                   bool *held, struct outbox_error *err)
{
    struct fence_values v;
    char lease[32];
    const char *values[5] = {s->owner, p->queue, v.partition, v.generation, lease};
    PGresult *result;

    fence_values(p, &v);
    snprintf(lease, sizeof(lease), "%.3f", lease_seconds);
    result = run(s, SSTMT_RENEW, 5, values, PGRES_TUPLES_OK,
                 "unable to renew a stream partition lease", err);
    if (result == NULL)
        return -1;
    *held = PQntuples(result) == 1;
    if (*held && reload)
        cursor_from(result, p, true);
    PQclear(result);
    return 0;
}

int
stream_store_rebase(stream_store *s, struct stream_partition *p, int32_t epoch, bool *held,
                    struct outbox_error *err)
{
    struct fence_values v;
    char epoch_text[16];
    const char *values[5] = {s->owner, p->queue, v.partition, v.generation, epoch_text};
    PGresult *result;

    fence_values(p, &v);
    snprintf(epoch_text, sizeof(epoch_text), "%d", (int)epoch);
    result = run(s, SSTMT_REBASE, 5, values, PGRES_TUPLES_OK,
                 "unable to rebase a stream partition onto this database's history", err);
    if (result == NULL) {
        if (err != NULL && strcmp(err->sqlstate, "55000") == 0)
            err->code = OUTBOX_ERR_STATE;
        return -1;
    }
    *held = PQntuples(result) == 1;
    if (*held)
        cursor_from(result, p, false);
    PQclear(result);
    return 0;
}

int
stream_store_release(stream_store *s, const struct stream_partition *p, struct outbox_error *err)
{
    struct fence_values v;
    const char *values[4] = {s->owner, p->queue, v.partition, v.generation};
    PGresult *result;

    fence_values(p, &v);
    result = run(s, SSTMT_RELEASE, 4, values, PGRES_COMMAND_OK,
                 "unable to release a stream partition", err);
    if (result == NULL)
        return -1;
    PQclear(result);
    return 0;
}

/* ---- read and advance ------------------------------------------------------------ */

/* Points batch's jobs into result (rows in the read's column order). */
static int
batch_fill(struct stream_batch *batch, PGresult *result, struct outbox_error *err)
{
    int rows = PQntuples(result);

    batch->jobs = calloc((size_t)rows, sizeof(*batch->jobs));
    batch->xids = calloc((size_t)rows, sizeof(*batch->xids));
    batch->froms = calloc((size_t)rows, sizeof(*batch->froms));
    if (batch->jobs == NULL || batch->xids == NULL || batch->froms == NULL)
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    for (int r = 0; r < rows; r++) {
        store_row_read_job(result, r, &batch->jobs[r]);
        batch->xids[r] = PQgetvalue(result, r, 11);
        batch->froms[r] = PQgetisnull(result, r, 12) ? NULL : PQgetvalue(result, r, 12);
    }
    batch->count = (size_t)rows;
    batch->storage = result;
    return 0;
}

int
stream_store_read_send(stream_store *s, const struct stream_partition *p, const char *after_xid,
                       int64_t after_job_id, int limit, struct outbox_error *err)
{
    char partition[16], job_id[24], limit_text[16], generation[24];
    const char *values[7] = {p->queue, partition, after_xid, job_id, limit_text, s->owner,
                             generation};

    snprintf(partition, sizeof(partition), "%d", p->partition);
    snprintf(job_id, sizeof(job_id), "%lld", (long long)after_job_id);
    snprintf(limit_text, sizeof(limit_text), "%d", limit);
    snprintf(generation, sizeof(generation), "%lld", (long long)p->generation);
    if (PQsendQueryPrepared(s->conn, STATEMENTS[SSTMT_READ].name, 7, values, NULL, NULL, 0) != 1)
        return outbox_error_from_pg(err, s->conn, NULL, "unable to read a stream partition");
    return 0;
}

int
stream_store_read_receive(stream_store *s, struct stream_batch *batch, struct outbox_error *err)
{
    PGresult *result = NULL, *next;
    int rc = 0;

    memset(batch, 0, sizeof(*batch));
    /* every result of the query is taken, so the connection is free afterwards */
    while ((next = PQgetResult(s->conn)) != NULL) {
        if (result == NULL)
            result = next;
        else
            PQclear(next);
    }
    if (result == NULL || PQresultStatus(result) != PGRES_TUPLES_OK) {
        rc = outbox_error_from_pg(err, s->conn, result, "unable to read a stream partition");
        PQclear(result);
        return rc;
    }
    if (PQntuples(result) == 0) {
        PQclear(result);
        return 0;
    }
    if (batch_fill(batch, result, err) != 0) {
        PQclear(result);
        stream_batch_release_memory(batch);
        return -1;
    }
    return 0;
}

int
stream_store_read(stream_store *s, const struct stream_partition *p, int limit,
                  struct stream_batch *batch, struct outbox_error *err)
{
    memset(batch, 0, sizeof(*batch));
    if (stream_store_read_send(s, p, p->cursor_xid, p->cursor_job_id, limit, err) != 0)
        return -1;
    return stream_store_read_receive(s, batch, err);
}

int
stream_store_key_has_later(stream_store *s, const struct stream_partition *p, const char *xid,
                           int64_t job_id, const char *key, bool *later, struct outbox_error *err)
{
    char partition[16], job_id_text[24];
    const char *values[5] = {p->queue, partition, xid, job_id_text, key};
    PGresult *result;

    snprintf(partition, sizeof(partition), "%d", p->partition);
    snprintf(job_id_text, sizeof(job_id_text), "%lld", (long long)job_id);
    result = run(s, SSTMT_KEY_LATER, 5, values, PGRES_TUPLES_OK,
                 "unable to look for a key's later stream rows", err);
    if (result == NULL)
        return -1;
    *later = PQntuples(result) == 1 && strcmp(PQgetvalue(result, 0, 0), "t") == 0;
    PQclear(result);
    return 0;
}

void
stream_batch_release_memory(struct stream_batch *batch)
{
    if (batch == NULL)
        return;
    PQclear(batch->storage);
    free(batch->jobs);
    free(batch->xids);
    free(batch->froms);
    memset(batch, 0, sizeof(*batch));
}

/* The refused rows as five array literals ($8..$12). */
struct refusal_arrays {
    struct buffer ids, errors, permanent, delays, stay;
};

static int
refusal_arrays_build(struct refusal_arrays *a, const struct stream_refusal *refused, size_t count)
{
    struct buffer *all[] = {&a->ids, &a->errors, &a->permanent, &a->delays, &a->stay};

    for (size_t i = 0; i < 5; i++)
        buffer_putc(all[i], '{');
    for (size_t i = 0; i < count; i++) {
        const char *sep = i == 0 ? "" : ",";

        buffer_printf(&a->ids, "%s%lld", sep, (long long)refused[i].job_id);
        buffer_printf(&a->errors, "%s\"", sep);
        for (const char *c = refused[i].error != NULL ? refused[i].error : ""; *c != '\0'; c++) {
            if (*c == '"' || *c == '\\')
                buffer_putc(&a->errors, '\\');
            buffer_putc(&a->errors, *c);
        }
        buffer_putc(&a->errors, '"');
        buffer_printf(&a->permanent, "%s%s", sep, refused[i].permanent ? "t" : "f");
        buffer_printf(&a->delays, "%s%.3f", sep, refused[i].delay_seconds);
        buffer_printf(&a->stay, "%s%s", sep, refused[i].stay ? "t" : "f");
    }
    for (size_t i = 0; i < 5; i++) {
        buffer_putc(all[i], '}');
        if (all[i]->failed)
            return -1;
    }
    return 0;
}

static void
refusal_arrays_free(struct refusal_arrays *a)
{
    buffer_clear(&a->ids);
    buffer_clear(&a->errors);
    buffer_clear(&a->permanent);
    buffer_clear(&a->delays);
    buffer_clear(&a->stay);
}

int
stream_store_advance(stream_store *s, struct stream_partition *p, const char *xid, int64_t job_id,
                     const struct stream_refusal *refused, size_t count, double lease_seconds,
                     bool *held, struct outbox_error *err)
{
    struct fence_values v;
    struct refusal_arrays a = {0};
    char lease[32], job_text[24];
    PGresult *result = NULL;
    int rc = -1;

    *held = false;
    fence_values(p, &v);
    snprintf(lease, sizeof(lease), "%.3f", lease_seconds);
    snprintf(job_text, sizeof(job_text), "%lld", (long long)job_id);
    if (refusal_arrays_build(&a, refused, count) != 0) {
        outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
        goto cleanup;
    }
    {
        const char *values[12] = {s->owner,     p->queue,       v.partition,   v.generation,
                                  lease,        xid,            job_text,      a.ids.data,
                                  a.errors.data, a.permanent.data, a.delays.data, a.stay.data};

        result = run(s, SSTMT_ADVANCE, 12, values, PGRES_TUPLES_OK,
                     "unable to advance a stream cursor", err);
    }
    if (result == NULL)
        goto cleanup;
    *held = strcmp(PQgetvalue(result, 0, 0), "1") == 0;
    if (*held) {
        copy_text(p->cursor_xid, sizeof(p->cursor_xid), xid);
        p->cursor_job_id = job_id;
    }
    rc = 0;

cleanup:
    PQclear(result);
    refusal_arrays_free(&a);
    return rc;
}

/* ---- figures and cleanup --------------------------------------------------------- */

/*
 * Takes a lag result (SQL_LAG's columns; NULL: the statement failed, err
 * filled) and clears it: its rows go into a new array *out.
 */
static int
lag_read(PGresult *result, struct stream_lag **out, size_t *count, struct outbox_error *err)
{
    int rows = result != NULL ? PQntuples(result) : 0;

    *out = NULL;
    *count = 0;
    if (result == NULL)
        return -1;
    if (rows > 0 && (*out = calloc((size_t)rows, sizeof(**out))) == NULL) {
        PQclear(result);
        return outbox_error_set(err, OUTBOX_ERR_INTERNAL, "out of memory");
    }
    for (int r = 0; r < rows; r++) {
        struct stream_lag *l = &(*out)[r];

        copy_text(l->queue, sizeof(l->queue), PQgetvalue(result, r, 0));
        l->partition = (int)strtol(PQgetvalue(result, r, 1), NULL, 10);
        copy_text(l->owner, sizeof(l->owner), PQgetvalue(result, r, 2));
        l->rows = strtoll(PQgetvalue(result, r, 3), NULL, 10);
        l->seconds = strtod(PQgetvalue(result, r, 4), NULL);
        copy_text(l->lease_until, sizeof(l->lease_until), PQgetvalue(result, r, 5));
    }
    *count = (size_t)rows;
    PQclear(result);
    return 0;
}

int
stream_store_lag(stream_store *s, struct stream_lag **out, size_t *count, struct outbox_error *err)
{
    return lag_read(run(s, SSTMT_LAG, 0, NULL, PGRES_TUPLES_OK, "unable to read the stream lag",
                        err),
                    out, count, err);
}

/*
 * Takes a horizon result (SQL_HORIZON's columns; NULL: the statement
 * failed, err filled) and clears it; found when it has a row.
 */
static int
horizon_read(PGresult *result, struct stream_horizon *out)
{
    memset(out, 0, sizeof(*out));
    if (result == NULL)
        return -1;
    if (PQntuples(result) == 1) {
        out->found = true;
        out->pid = (int)strtol(PQgetvalue(result, 0, 0), NULL, 10);
        copy_text(out->user, sizeof(out->user), PQgetvalue(result, 0, 1));
        copy_text(out->application, sizeof(out->application), PQgetvalue(result, 0, 2));
        out->seconds = strtod(PQgetvalue(result, 0, 3), NULL);
        copy_text(out->query, sizeof(out->query), PQgetvalue(result, 0, 4));
        copy_text(out->prepared, sizeof(out->prepared), PQgetvalue(result, 0, 5));
        copy_text(out->database, sizeof(out->database), PQgetvalue(result, 0, 6));
    }
    PQclear(result);
    return 0;
}

int
stream_store_horizon(stream_store *s, struct stream_horizon *out, struct outbox_error *err)
{
    return horizon_read(run(s, SSTMT_HORIZON, 0, NULL, PGRES_TUPLES_OK,
                            "unable to read the transaction horizon", err),
                        out);
}

int
stream_store_cleanup(stream_store *s, double retention_seconds, int limit, size_t *deleted,
                     struct outbox_error *err)
{
    char retention[32], limit_text[16];
    const char *values[2] = {retention, limit_text};
    PGresult *result;

    *deleted = 0;
    snprintf(retention, sizeof(retention), "%.3f", retention_seconds);
    snprintf(limit_text, sizeof(limit_text), "%d", limit);
    result = run(s, SSTMT_CLEANUP, 2, values, PGRES_COMMAND_OK,
                 "unable to delete published stream rows", err);
    if (result == NULL)
        return -1;
    *deleted = (size_t)strtoull(PQcmdTuples(result), NULL, 10);
    PQclear(result);
    return 0;
}

int
stream_store_key_cleanup(stream_store *s, int limit, size_t *deleted, struct outbox_error *err)
{
    char limit_text[16];
    const char *values[1] = {limit_text};
    PGresult *result;

    *deleted = 0;
    snprintf(limit_text, sizeof(limit_text), "%d", limit);
    result = run(s, SSTMT_KEY_CLEANUP, 1, values, PGRES_COMMAND_OK,
                 "unable to delete the places of stream ordering keys", err);
    if (result == NULL)
        return -1;
    *deleted = (size_t)strtoull(PQcmdTuples(result), NULL, 10);
    PQclear(result);
    return 0;
}

/* ---- administration ---------------------------------------------------------------- */

/* Runs sql with params on conn, expecting one boolean; *value gets it. */
static int
admin_boolean(PGconn *conn, const char *sql, int nparams, const char *const *values, bool *value,
              const char *context, struct outbox_error *err)
{
    PGresult *result = PQexecParams(conn, sql, nparams, NULL, values, NULL, NULL, 0);

    if (PQresultStatus(result) != PGRES_TUPLES_OK || PQntuples(result) != 1) {
        outbox_error_from_pg(err, conn, result, context);
        PQclear(result);
        return -1;
    }
    *value = PQgetvalue(result, 0, 0)[0] == 't';
    PQclear(result);
    return 0;
}

int
stream_admin_enable(PGconn *conn, const char *queue, int partitions, int lock_timeout_ms,
                    bool *changed, struct outbox_error *err)
{
    char count[16];
    const char *values[2] = {queue, count};

    snprintf(count, sizeof(count), "%d", partitions);
    return store_admin_boolean_locked(conn, "SELECT outbox.stream_enable($1, $2::int)", 2, values,
                                      lock_timeout_ms, changed,
                                      "unable to make the queue a stream", err);
}

int
stream_admin_disable(PGconn *conn, const char *queue, int lock_timeout_ms, bool *changed,
                     struct outbox_error *err)
{
    const char *values[1] = {queue};

    return store_admin_boolean_locked(conn, "SELECT outbox.stream_disable($1)", 1, values,
                                      lock_timeout_ms, changed,
                                      "unable to make the stream a row-state queue", err);
}

int
stream_admin_exists(PGconn *conn, const char *queues, bool *exists, struct outbox_error *err)
{
    const char *values[1] = {queues};

    return admin_boolean(conn,
                         "SELECT EXISTS (SELECT 1 FROM outbox.stream"
                         " WHERE $1::text[] IS NULL OR queue = ANY ($1::text[]))",
                         1, values, exists, "unable to look for stream queues", err);
}

int
stream_admin_list(PGconn *conn, FILE *out, struct outbox_error *err)
{
    PGresult *result = PQexec(conn, SQL_LAG);
    int rows;

    if (PQresultStatus(result) != PGRES_TUPLES_OK) {
        outbox_error_from_pg(err, conn, result, "unable to list the streams");
        PQclear(result);
        return -1;
    }
    rows = PQntuples(result);
    if (rows == 0)
        fputs("no stream queues\n", out);
    else
        fprintf(out, "%-24s %9s %10s %10s  %s\n", "queue", "partition", "lag_rows", "lag_s",
                "owner");
    for (int r = 0; r < rows; r++) {
        const char *owner = PQgetvalue(result, r, 2);

        fprintf(out, "%-24s %9s %10s %10.1f  %s\n", PQgetvalue(result, r, 0),
                PQgetvalue(result, r, 1), PQgetvalue(result, r, 3),
                strtod(PQgetvalue(result, r, 4), NULL), owner[0] != '\0' ? owner : "-");
    }
    PQclear(result);
    return 0;
}

/* Runs sql (no parameters) on conn; NULL with err unless it returned rows. */
static PGresult *
admin_query(PGconn *conn, const char *sql, const char *context, struct outbox_error *err)
{
    PGresult *result = PQexec(conn, sql);

    if (PQresultStatus(result) == PGRES_TUPLES_OK)
        return result;
    outbox_error_from_pg(err, conn, result, context);
    PQclear(result);
    return NULL;
}

int
stream_admin_lag(PGconn *conn, struct stream_lag **out, size_t *count, struct outbox_error *err)
{
    return lag_read(admin_query(conn, SQL_LAG, "unable to read the stream lag", err), out, count,
                    err);
}

int
stream_admin_horizon(PGconn *conn, struct stream_horizon *out, struct outbox_error *err)
{
    return horizon_read(admin_query(conn, SQL_HORIZON, "unable to read the transaction horizon",
                                    err),
                        out);
}
