/*
 * store_stream_sql.c - the SQL text of stream queues: each statement a
 * stream_store prepares on its connection, by name (see store_stream.h for
 * the rules they keep, sql/009_stream.sql for the schema).
 */
#include "store_stream_sql.h"

#include "store_row.h"

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
    "SELECT r.cursor_xid, r.cursor_job_id, r.history_epoch, r.places_kept, r.keys_reset, r.levels"
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
    "       j.routing_key, " STORE_SQL_MESSAGE_UID("j") ", j.xid::text, j.stream_from"
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

const char stream_sql_lag[] =
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
const char stream_sql_horizon[] =
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

/*
 * Whether a partition of the queues $1 (NULL: every stream) holds a row
 * after its cursor, readable or not yet (behind the horizon, of a paused
 * queue, of another owner's lease): one probe of job_stream_idx a partition.
 */
static const char SQL_PENDING[] =
    "SELECT EXISTS (SELECT 1 FROM outbox.stream_cursor AS c"
    " WHERE ($1::text[] IS NULL OR c.queue = ANY ($1::text[]))"
    "   AND EXISTS (SELECT 1 FROM outbox.job AS j"
    "               WHERE j.state = 'stream' AND j.queue = c.queue"
    "                 AND j.stream_partition = c.partition"
    "                 AND (j.xid, j.job_id) > (c.cursor_xid, c.cursor_job_id)))";

/*
 * Whether the database holds the row a broker's order record names: job id
 * $1 with identity $2, or at place $3 when the record names no identity (a
 * record of an earlier release). One probe of the primary key.
 */
const char stream_sql_row_held[] =
    "SELECT EXISTS (SELECT 1 FROM outbox.job AS j WHERE j.job_id = $1::bigint"
    "   AND CASE WHEN $2::text = '' THEN j.xid = $3::xid8"
    "            ELSE " STORE_SQL_MESSAGE_UID("j") " = $2::text END)";

const struct stream_statement_text stream_statements[SSTMT_COUNT] = {
    [SSTMT_ACQUIRE] = {"outbox_stream_acquire", SQL_ACQUIRE},
    [SSTMT_RENEW] = {"outbox_stream_renew", SQL_RENEW},
    [SSTMT_RELEASE] = {"outbox_stream_release", SQL_RELEASE},
    [SSTMT_READ] = {"outbox_stream_read", SQL_READ},
    [SSTMT_ADVANCE] = {"outbox_stream_advance", SQL_ADVANCE},
    [SSTMT_LAG] = {"outbox_stream_lag", stream_sql_lag},
    [SSTMT_HORIZON] = {"outbox_stream_horizon", stream_sql_horizon},
    [SSTMT_CLEANUP] = {"outbox_stream_cleanup", SQL_CLEANUP},
    [SSTMT_KEY_LATER] = {"outbox_stream_key_later", SQL_KEY_LATER},
    [SSTMT_MEMBER] = {"outbox_stream_member", SQL_MEMBER},
    [SSTMT_LEAVE] = {"outbox_stream_leave", SQL_LEAVE},
    [SSTMT_SURPLUS] = {"outbox_stream_surplus", SQL_SURPLUS},
    [SSTMT_KEY_CLEANUP] = {"outbox_stream_key_cleanup", SQL_KEY_CLEANUP},
    [SSTMT_REBASE] = {"outbox_stream_rebase", SQL_REBASE},
    [SSTMT_PENDING] = {"outbox_stream_pending", SQL_PENDING},
};
