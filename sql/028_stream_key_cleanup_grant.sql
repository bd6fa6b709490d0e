-- 028_stream_key_cleanup_grant.sql - the relay's role may lock the ordering
-- keys' places it deletes.
--
-- The relay deletes the places of outbox.stream_key below the horizon
-- (migration 014) a batch at a time, choosing the batch with FOR UPDATE
-- SKIP LOCKED so that it never waits for a producer writing a key's place,
-- nor for another relay deleting the same batch. PostgreSQL asks UPDATE on
-- a column of a table for FOR UPDATE: the role outbox_relay had SELECT and
-- DELETE only, so every cleanup of a relay logged in with it failed
-- ("permission denied for table stream_key"), dropped the connection, and
-- the places were never deleted. UPDATE on place_xid alone is enough; the
-- relay writes no key's place.
--
-- Locks: GRANT changes the catalog only.

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_relay') THEN
        GRANT UPDATE (place_xid) ON outbox.stream_key TO outbox_relay;
    END IF;
END
$$;
