-- 022_stream_history.sql - a stream rebase keeps a key's commit order and
-- moves the keys' places too.
--
-- outbox.stream_rebase() (migration 015) put every row of a partition that
-- might be unpublished at one place, xid 2, so they went out in job id
-- order. A key's commit order is its places' order, not its job ids': a
-- transaction that drew its job id, then waited for the key's lock while
-- another one of the key committed, commits after a higher job id. Across
-- a rebase such a key went out 1, 2, 3 where it committed 1, 3, 2. And the
-- keys' places (outbox.stream_key) were left as they were: after a restore
-- into a new cluster they named transaction ids of the old one, far above
-- the new cluster's, so a new row of such a key was placed there and waited
-- until the new cluster's transaction ids passed the old one's.
--
-- Now:
--   * a cursor records the cluster (system identifier) its places belong
--     to (stream_cursor.history_cluster). A new history on the same
--     cluster (a promotion, a point-in-time recovery) hands out transaction
--     ids after every one it inherited: the rows keep their places and the
--     cursor its own; only the epoch moves. Nothing is published again but
--     what the cursor had not passed, and every key keeps its order.
--   * on another cluster (a dump restored, logical replication, pg_upgrade),
--     or with a place ahead of the transaction ids handed out now, the rows
--     certainly published get xid 1 as before, and the others are placed
--     anew after the cursor, (2, max): the rows loaded together (one COPY
--     of the restore: they share their tuples' xmin) first, in their old
--     places' order, then the rows written since, in theirs. Each key's rows
--     in that order get xids 3, 4, ...: the xid moves up one each time the
--     key's next row has a lower job id than the one before, so (xid, job
--     id) reads them in that order. Those xids are below every transaction
--     still to commit (they stay below the horizon; if a key needed more
--     than the horizon leaves, its last ones share the highest, in job id
--     order).
--   * the places of the queue's keys that are ahead of the transaction ids
--     handed out now (of another history) are deleted: a key's next row is
--     placed at its own transaction again, after every rebased row.
-- The relay logs each rebase with what it did (places kept or placed anew,
-- keys reset).
--
-- Locks: ADD COLUMN without a default, then SET DEFAULT, changes the
-- catalog only; the UPDATE writes the cursor rows (one per partition). DROP
-- and CREATE FUNCTION lock no table.

-- The cluster this server belongs to (its system identifier).
CREATE FUNCTION outbox.stream_cluster() RETURNS bigint
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.system_identifier FROM pg_catalog.pg_control_system() AS s
$$;

ALTER TABLE outbox.stream_cursor ADD COLUMN history_cluster bigint;
UPDATE outbox.stream_cursor AS c SET history_cluster = i.system_identifier
  FROM outbox.identity AS i WHERE c.history_epoch = i.epoch;
ALTER TABLE outbox.stream_cursor ALTER COLUMN history_cluster SET DEFAULT outbox.stream_cluster();

COMMENT ON COLUMN outbox.stream_cursor.history_cluster IS
    'the cluster (system identifier) whose transaction ids the cursor''s places are; NULL: unknown';

-- Places the rows of a partition that may be unpublished (every row but
-- those at xid 1) after (2, max), in the order described above; returns the
-- highest level a key needed (0: every key's rows were in job id order).
CREATE FUNCTION outbox.stream_replace(queue text, stream_partition integer, horizon xid8)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    loaded xid;
    bulk boolean;
    room bigint := greatest(horizon::text::bigint - 4, 0);
    top integer;
BEGIN
    SELECT j.xmin INTO loaded FROM outbox.job AS j
     WHERE j.state = 'stream' AND j.queue = stream_replace.queue
       AND j.stream_partition = stream_replace.stream_partition AND j.xid <> '1'
     ORDER BY j.job_id LIMIT 1;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    -- loaded together: a transaction whose rows are not at its own id
    bulk := EXISTS (SELECT 1 FROM outbox.job AS j
                     WHERE j.state = 'stream' AND j.queue = stream_replace.queue
                       AND j.stream_partition = stream_replace.stream_partition
                       AND j.xid <> '1' AND j.xmin = loaded
                       AND j.xid::text::numeric % 4294967296 <> loaded::text::numeric);
    WITH w AS (
        SELECT j.job_id, j.ordering_key,
               row_number() OVER (ORDER BY (bulk AND j.xmin = loaded) DESC, j.xid, j.job_id) AS pos
          FROM outbox.job AS j
         WHERE j.state = 'stream' AND j.queue = stream_replace.queue
           AND j.stream_partition = stream_replace.stream_partition AND j.xid <> '1'),
    d AS (
        SELECT w.job_id, w.ordering_key, w.pos,
               CASE WHEN w.job_id < lag(w.job_id) OVER (PARTITION BY w.ordering_key ORDER BY w.pos)
                    THEN 1 ELSE 0 END AS descent
          FROM w),
    l AS (
        SELECT d.job_id,
               CASE WHEN d.ordering_key IS NULL THEN 0
                    ELSE sum(d.descent) OVER (PARTITION BY d.ordering_key ORDER BY d.pos) END AS level
          FROM d),
    u AS (
        UPDATE outbox.job AS j SET xid = (3 + least(l.level, room))::text::xid8
          FROM l WHERE j.job_id = l.job_id
        RETURNING l.level)
    SELECT coalesce(max(u.level), 0) INTO top FROM u;
    RETURN top;
END
$$;

-- Rebases a partition the caller holds (owner, generation, live lease) onto
-- history epoch new_epoch, when its cursor belongs to another one or is
-- ahead of the transaction ids handed out now (see above). Returns the new
-- cursor, whether the places were kept, how many keys' places were reset
-- and the highest level a key needed; no row when the lease is not held. A
-- cursor of a later epoch than new_epoch is refused (SQLSTATE 55000): the
-- identity was set back by hand or restored apart from the cursors, and
-- which rows were published cannot be told.
DROP FUNCTION outbox.stream_rebase(text, text, integer, bigint, integer);
CREATE FUNCTION outbox.stream_rebase(owner text, queue text, stream_partition integer,
                                     generation bigint, new_epoch integer)
RETURNS TABLE (cursor_xid text, cursor_job_id bigint, history_epoch integer,
               places_kept boolean, keys_reset integer, levels integer)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c record;
    snap pg_snapshot := pg_catalog.pg_current_snapshot();
    next_xid xid8 := pg_catalog.pg_snapshot_xmax(snap);
    cluster bigint := outbox.stream_cluster();
    keys integer;
    top integer := 0;
BEGIN
    SELECT s.cursor_xid, s.cursor_job_id, s.history_epoch, s.history_cluster INTO c
      FROM outbox.stream_cursor AS s
     WHERE s.queue = stream_rebase.queue AND s.partition = stream_rebase.stream_partition
       AND s.owner = stream_rebase.owner AND s.generation = stream_rebase.generation
       AND s.lease_until > clock_timestamp()
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF c.history_epoch > new_epoch THEN
        RAISE EXCEPTION 'outbox stream cursor of queue % partition % belongs to history epoch %, after this database''s %: which rows were published cannot be told',
                        to_json(stream_rebase.queue)::text, stream_rebase.stream_partition,
                        c.history_epoch, new_epoch
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'restore outbox.identity with the cursors, or set the cursors'' history_epoch to the identity''s epoch to publish every row again';
    END IF;
    IF c.history_epoch = new_epoch AND c.cursor_xid < next_xid THEN
        RETURN QUERY SELECT c.cursor_xid::text, c.cursor_job_id, c.history_epoch, true, 0, 0;
        RETURN;
    END IF;
    DELETE FROM outbox.stream_key AS k WHERE k.queue = stream_rebase.queue AND k.place_xid >= next_xid;
    GET DIAGNOSTICS keys = ROW_COUNT;
    IF c.history_cluster = cluster AND c.cursor_xid < next_xid
       AND NOT EXISTS (SELECT 1 FROM outbox.job AS j
                        WHERE j.state = 'stream' AND j.queue = stream_rebase.queue
                          AND j.stream_partition = stream_rebase.stream_partition
                          AND j.xid >= next_xid) THEN
        RETURN QUERY
        UPDATE outbox.stream_cursor AS s SET history_epoch = new_epoch, advanced_at = now()
         WHERE s.queue = stream_rebase.queue AND s.partition = stream_rebase.stream_partition
        RETURNING s.cursor_xid::text, s.cursor_job_id, s.history_epoch, true, keys, 0;
        RETURN;
    END IF;
    UPDATE outbox.job AS j SET xid = '1'
     WHERE j.state = 'stream' AND j.queue = stream_rebase.queue
       AND j.stream_partition = stream_rebase.stream_partition
       AND j.xid <> '1' AND (j.xid, j.job_id) <= (c.cursor_xid, c.cursor_job_id)
       AND j.job_id <= c.cursor_job_id;
    top := outbox.stream_replace(stream_rebase.queue, stream_rebase.stream_partition,
                                 pg_catalog.pg_snapshot_xmin(snap));
    RETURN QUERY
    UPDATE outbox.stream_cursor AS s
       SET cursor_xid = '2', cursor_job_id = 9223372036854775807, history_epoch = new_epoch,
           history_cluster = cluster, advanced_at = now()
     WHERE s.queue = stream_rebase.queue AND s.partition = stream_rebase.stream_partition
    RETURNING s.cursor_xid::text, s.cursor_job_id, s.history_epoch, false, keys, top;
END
$$;
