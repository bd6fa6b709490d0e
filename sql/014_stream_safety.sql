-- 014_stream_safety.sql - stream leases that never repeat; a key's rows in commit order.
--
-- A partition's owner fences every write of its cursor with (owner,
-- generation). The generation counted the leases of one cursor row, so a
-- queue made a stream again started its new cursors at generation 1: a
-- relay still holding a lease of the stream before could not be told from
-- the new cursor's owner. Generations now come from one sequence, so a
-- lease's (owner, generation) names one lease of one cursor row for ever,
-- and the relay's read of a partition is fenced by it too (store_stream.c).
--
-- A stream's epoch (the microseconds of outbox.stream.created_at) names its
-- order in a broker that records how far each partition was published. It
-- was the time of the transaction that made the stream, so a queue made a
-- stream, disabled and made a stream again in one transaction had two
-- streams of one epoch; it is now the time of the insert itself.
--
-- A stream partition was read in the order of the transactions' ids, which
-- is the order they took an id, not the order they committed: a
-- transaction that took its id early (any write) and wrote a key's row
-- after another transaction of that key had committed was published first.
-- Now a keyed stream row takes a row lock on its key's row of
-- outbox.stream_key, held to its commit, so transactions writing one key
-- follow one another; a row whose key was last written by a transaction of
-- a higher id is placed at that id (its xid column is its place, no longer
-- its own transaction's id) with a job id drawn after the lock, so it sorts
-- after that transaction's rows. A place is never below the row's own
-- transaction id, so the read under the horizon stays gap-free: a row still
-- to commit belongs to a transaction at or above the horizon, and its place
-- too. See docs/stream.md for what it costs a producer.
--
-- Locks: CREATE SEQUENCE, SET DEFAULT and CREATE TABLE change the catalog
-- only; CREATE OR REPLACE FUNCTION locks no table.

CREATE SEQUENCE outbox.stream_generation AS bigint;
SELECT setval('outbox.stream_generation',
              coalesce((SELECT max(c.generation) FROM outbox.stream_cursor AS c), 0) + 1, false);

COMMENT ON SEQUENCE outbox.stream_generation IS
    'generations of stream partition leases: one value per lease taken, never reused';
COMMENT ON COLUMN outbox.stream_cursor.generation IS
    'the lease (a value of outbox.stream_generation); every write and read of the owner names it';

ALTER TABLE outbox.stream ALTER COLUMN created_at SET DEFAULT clock_timestamp();

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_relay') THEN
        GRANT USAGE ON SEQUENCE outbox.stream_generation TO outbox_relay;
    END IF;
END
$$;

-- The last place of each ordering key of a stream queue: the highest
-- transaction id that wrote a row of the key. The stream relay deletes rows
-- below the horizon, which can lift no later row (every transaction still
-- to write has an id at or above it).
CREATE TABLE outbox.stream_key (
    queue        text NOT NULL,
    ordering_key text NOT NULL,
    place_xid    xid8 NOT NULL,
    PRIMARY KEY (queue, ordering_key)
);

COMMENT ON TABLE outbox.stream_key IS
    'per stream queue and ordering key: the last place written; its row lock orders the key''s transactions';

-- A stream queue's row: state 'stream', its partition, and its place: the
-- transaction inserting it (the top-level one, also inside a
-- subtransaction), or for a keyed row the place of its key's last
-- transaction when that is higher. SECURITY DEFINER: a producer needs no
-- privilege on outbox.stream_key or the job id sequence.
CREATE OR REPLACE FUNCTION outbox.stream_row() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    place xid8;
BEGIN
    NEW.state := 'stream';
    NEW.held := false;
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
    NEW.stream_partition := outbox.stream_partition_of(NEW.ordering_key, NEW.job_id,
                                                       TG_ARGV[0]::integer);
    RETURN NEW;
END
$$;

COMMENT ON COLUMN outbox.job.xid IS
    'a stream row: its place in its partition''s order (the inserting transaction, or its key''s last one); NULL for other rows';

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_relay') THEN
        GRANT SELECT, DELETE ON outbox.stream_key TO outbox_relay;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_reader') THEN
        GRANT SELECT ON outbox.stream_key TO outbox_reader;
    END IF;
END
$$;
