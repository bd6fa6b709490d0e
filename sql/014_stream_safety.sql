-- 014_stream_safety.sql - stream leases that never repeat across a disable and enable.
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
-- Locks: CREATE SEQUENCE and SET DEFAULT change the catalog only.

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

