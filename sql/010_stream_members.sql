-- 010_stream_members.sql - relays publishing streams say they are there, so partitions spread.
--
-- A relay takes free stream partitions up to its fair share: all partitions
-- divided by the relays there are. Before this table a relay counted only
-- the owners of live leases, so the first relay to start took every
-- partition and one started later found none free until the first stopped.
-- Now every relay with stream threads renews a row here as it renews its
-- leases; the share counts these members (and any lease owner that writes
-- no row), and a relay holding more than its share gives the surplus back
-- between batches, for the newcomer to take: only partitions of a queue
-- that a member holding less than its share publishes (queues: the
-- relay's --queues, NULL for every queue), so nothing is given back that
-- no other relay would take.
--
-- A member's row lives as long as a lease would (seen_until); a stopping
-- relay deletes its own, and rows long past are deleted by the next relay
-- that renews.
CREATE TABLE outbox.stream_member (
    owner text PRIMARY KEY,
    queues text[],
    seen_until timestamptz NOT NULL
);

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_relay') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON outbox.stream_member TO outbox_relay;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_reader') THEN
        GRANT SELECT ON outbox.stream_member TO outbox_reader;
    END IF;
END
$$;
