-- 016_stream_adopt.sql - a key's order across `stream disable` and `stream enable`.
--
-- stream_disable() hands a stream's unpublished rows to the claims, and
-- stream_enable() made only new rows stream rows: rows the claims still
-- held (handed back, due later after a backoff, or written while the queue
-- was not a stream) went out beside the new stream's rows, so a key's row
-- could be published after a newer row of its key.
--
-- stream_enable() now takes the queue's ready and running rows into the
-- new stream (dead rows stay dead), in places before any later row of
-- their keys:
--   - a row with a place (handed back by a disable, or once in a stream)
--     keeps it: its xid column, so the key's rows keep their commit order
--     (unless it is a transaction id not handed out yet: of another history);
--   - a row without one is placed at the adoption place, the highest of
--     the enable's transaction id and the places taken, in job id order;
--   - each key taken gets that place in outbox.stream_key, so a later row of
--     the key is placed at or after it with a job id drawn after the lock.
-- A row a row-state relay holds ('running') is taken too: that relay finds
-- its lease lost, as after any lease it kept too long (its copy, if it sends
-- one, is a duplicate: Redis' dedup record and NATS' window drop it). The
-- rows are visible with the new cursors, at the enable's commit, before any
-- read, so the read stays gap-free. CREATE TRIGGER, first, holds SHARE ROW
-- EXCLUSIVE on outbox.job: no claim, mark or insert of another transaction
-- runs between it and the commit.
--
-- A taken row may have been published before without a record the new
-- stream knows of (a lost owner's batch, a row-state relay that died after
-- its append): stream_from says where to look, and the relay publishes it
-- out of turn, checked against that (Redis: the former order record, and
-- the row's dedup record). stream_disable() gives such a row its former
-- place back. A producer cannot set stream_from: the stream trigger clears it.
--
-- Locks: ADD COLUMN without a default changes the catalog only; CREATE OR
-- REPLACE FUNCTION locks no table.

ALTER TABLE outbox.job ADD COLUMN stream_from text;

COMMENT ON COLUMN outbox.job.stream_from IS
    'a stream row taken from the claims at stream enable: the order it left (''<epoch>:<partition>'', its place there is its xid and job_id) or '''' (none); NULL otherwise';

-- Makes queue a stream of partitions partitions: rows inserted from the
-- commit on are stream rows, and the queue's ready and running rows are
-- taken into it first (above). Returns false when it was a stream already
-- (with the same partitions; another count is an error, since moving rows
-- between partitions would break the order of their keys).
CREATE OR REPLACE FUNCTION outbox.stream_enable(queue text, partitions integer DEFAULT 1) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    existing integer;
    place xid8;
    next_xid xid8;
BEGIN
    PERFORM outbox.check_queue_name(stream_enable.queue);
    IF stream_enable.partitions IS NULL OR stream_enable.partitions NOT BETWEEN 1 AND 256 THEN
        RAISE EXCEPTION 'stream partitions must be between 1 and 256, got %',
                        coalesce(stream_enable.partitions::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT s.partitions INTO existing FROM outbox.stream AS s WHERE s.queue = stream_enable.queue FOR UPDATE;
    IF existing IS NOT NULL THEN
        IF existing <> stream_enable.partitions THEN
            RAISE EXCEPTION 'queue % is a stream of % partitions already', stream_enable.queue, existing
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'disable the stream first to change its partitions';
        END IF;
        RETURN false;
    END IF;
    INSERT INTO outbox.stream (queue, partitions) VALUES (stream_enable.queue, stream_enable.partitions);
    INSERT INTO outbox.stream_cursor (queue, partition)
    SELECT stream_enable.queue, p FROM generate_series(0, stream_enable.partitions - 1) AS p;
    EXECUTE format('CREATE TRIGGER %I BEFORE INSERT ON outbox.job FOR EACH ROW'
                   ' WHEN (NEW.queue = %L) EXECUTE FUNCTION outbox.stream_row(%s)',
                   outbox.stream_trigger_name(stream_enable.queue), stream_enable.queue,
                   stream_enable.partitions);

    -- From here on no other transaction writes outbox.job until the commit.
    -- A place no transaction of this history has had yet (a restore from
    -- another cluster) would hold its row until the ids reach it: that row
    -- is placed anew, with no former place to judge it by.
    next_xid := pg_snapshot_xmax(pg_current_snapshot());
    SELECT greatest(pg_current_xact_id(), max(j.xid) FILTER (WHERE j.xid < next_xid)) INTO place
      FROM outbox.job AS j
     WHERE j.queue = stream_enable.queue AND j.state IN ('ready', 'running');
    WITH taken AS (
        UPDATE outbox.job AS j
           SET state = 'stream', held = false, worker_id = NULL, lease_until = NULL,
               xid = CASE WHEN j.xid < next_xid THEN j.xid ELSE place END,
               stream_partition = outbox.stream_partition_of(j.ordering_key, j.job_id,
                                                             stream_enable.partitions),
               stream_from = CASE WHEN j.stream_epoch IS NOT NULL AND j.stream_partition IS NOT NULL
                                       AND j.xid < next_xid
                                  THEN j.stream_epoch || ':' || j.stream_partition ELSE '' END,
               stream_epoch = NULL
         WHERE j.queue = stream_enable.queue AND j.state IN ('ready', 'running')
        RETURNING j.ordering_key)
    INSERT INTO outbox.stream_key AS k (queue, ordering_key, place_xid)
    SELECT DISTINCT stream_enable.queue, t.ordering_key, place
      FROM taken AS t WHERE t.ordering_key IS NOT NULL
    ON CONFLICT (queue, ordering_key) DO UPDATE SET place_xid = excluded.place_xid
        WHERE k.place_xid < excluded.place_xid;
    RETURN true;
END
$$;

-- Makes a stream queue a row-state queue again: rows not yet published go
-- back to 'ready' for the claims, keeping their place (partition and the
-- stream's epoch; a row the stream took from the claims, the place it had
-- before, or none), rows behind the cursor become 'succeeded' (kept for the
-- retention). A batch an owner published but did not record yet is found
-- by its place in a broker that records places (Redis); others publish it
-- again (a duplicate, never a loss). Returns false when the queue was no
-- stream.
CREATE OR REPLACE FUNCTION outbox.stream_disable(queue text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    left_epoch bigint;
BEGIN
    SELECT (extract(epoch FROM s.created_at) * 1000000)::bigint INTO left_epoch
      FROM outbox.stream AS s WHERE s.queue = stream_disable.queue FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON outbox.job',
                   outbox.stream_trigger_name(stream_disable.queue));
    -- the cursors are locked first: an owner's advance waits, then finds none
    PERFORM 1 FROM outbox.stream_cursor AS c WHERE c.queue = stream_disable.queue FOR UPDATE;
    UPDATE outbox.job AS j
       SET state = CASE WHEN p.behind THEN 'succeeded' ELSE 'ready' END,
           finished_at = CASE WHEN p.behind THEN now() END,
           stream_partition = CASE WHEN p.behind THEN NULL
                                   WHEN j.stream_from IS NULL THEN j.stream_partition
                                   ELSE nullif(split_part(j.stream_from, ':', 2), '')::integer END,
           stream_epoch = CASE WHEN p.behind THEN NULL
                               WHEN j.stream_from IS NULL THEN left_epoch
                               ELSE nullif(split_part(j.stream_from, ':', 1), '')::bigint END,
           stream_from = NULL
      FROM (SELECT r.job_id, (r.xid, r.job_id) <= (c.cursor_xid, c.cursor_job_id) AS behind
              FROM outbox.job AS r
              JOIN outbox.stream_cursor AS c ON c.queue = r.queue AND c.partition = r.stream_partition
             WHERE r.state = 'stream' AND r.queue = stream_disable.queue) AS p
     WHERE j.job_id = p.job_id;
    DELETE FROM outbox.stream AS s WHERE s.queue = stream_disable.queue;
    NOTIFY outbox_job;
    RETURN true;
END
$$;

-- A stream queue's row, as in migration 014 (with the partition rule written
-- out, as in 013); a producer's stream_from is cleared (only stream_enable()
-- sets it).
CREATE OR REPLACE FUNCTION outbox.stream_row() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    place xid8;
BEGIN
    NEW.state := 'stream';
    NEW.held := false;
    NEW.stream_from := NULL;
    NEW.xid := pg_current_xact_id();
    IF NEW.ordering_key IS NOT NULL THEN
        -- the key's row lock, held to the commit; written only when it moves
        INSERT INTO outbox.stream_key AS k (queue, ordering_key, place_xid)
        VALUES (NEW.queue, NEW.ordering_key, NEW.xid)
        ON CONFLICT (queue, ordering_key) DO UPDATE SET place_xid = excluded.place_xid
            WHERE k.place_xid < excluded.place_xid
        RETURNING k.place_xid INTO place;
        IF place IS NULL THEN
            SELECT k.place_xid INTO place FROM outbox.stream_key AS k
             WHERE k.queue = NEW.queue AND k.ordering_key = NEW.ordering_key;
            IF place > NEW.xid THEN
                NEW.xid := place;
                NEW.job_id := nextval('outbox.job_job_id_seq'::regclass);
            END IF;
        END IF;
    END IF;
    -- outbox.stream_partition_of() written out: a pinned function is never inlined
    NEW.stream_partition := CASE WHEN NEW.ordering_key IS NULL
                                 THEN (NEW.job_id % TG_ARGV[0]::integer)::integer
                                 ELSE (pg_catalog.abs(pg_catalog.hashtext(NEW.ordering_key)::bigint)
                                       % TG_ARGV[0]::integer)::integer END;
    RETURN NEW;
END
$$;
