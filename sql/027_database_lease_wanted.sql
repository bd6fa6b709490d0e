-- 027: a winner kept out of its database by a live owner says so in a way
-- the owner's statistics watch sees. A relay of a list whose watch keeps its
-- leases calls the lease function only when the watch saw the database or
-- the relays watching its server change (or every 15 minutes), and the
-- winner, once recorded as a member, wrote nothing: an owner that missed the
-- change that made it lose (its watch's look fell before the winner's
-- membership counted as alive) kept the database for up to 15 minutes while
-- the winner waited. The winner now stamps outbox.database_lease.wanted_at
-- at most once a quarter lease while it waits, and has its backend report the
-- write at once (PostgreSQL 15's pg_stat_force_next_flush(), as in 023): the
-- owner's watch wakes the database, its visit calls the lease function, and
-- the owner gives it up. A database nobody contests is written no more than
-- before.
--
-- Locks: ADD COLUMN without a default changes the catalog only;
-- outbox.database_lease is one row.

ALTER TABLE outbox.database_lease ADD COLUMN wanted_at timestamptz;

COMMENT ON COLUMN outbox.database_lease.wanted_at IS
    'when the relay that wins the database last found it held by another live relay';

-- As in 024, and the winner kept out stamps wanted_at.
CREATE OR REPLACE FUNCTION outbox.database_lease_take(relay_id text, lease_seconds integer,
                                                      watch text, watch_pid integer,
                                                      OUT held boolean, OUT owner text,
                                                      OUT generation bigint, OUT paused boolean,
                                                      OUT wins boolean, OUT owner_watched boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now_ timestamptz := pg_catalog.clock_timestamp();
    span interval := pg_catalog.make_interval(secs => lease_seconds);
    me text := database_lease_take.relay_id;
    login_role oid;
    winner text;
    lease outbox.database_lease;
    owner_live boolean;
    seen boolean;
BEGIN
    IF database_lease_take.watch IS NOT NULL THEN
        SELECT a.usesysid INTO login_role FROM pg_catalog.pg_stat_activity AS a
         WHERE a.pid = database_lease_take.watch_pid
           AND a.application_name = database_lease_take.watch;
    END IF;
    IF database_lease_take.watch IS NOT NULL AND login_role IS NULL THEN
        SELECT r.oid INTO login_role FROM pg_catalog.pg_roles AS r WHERE r.rolname = session_user;
    END IF;
    INSERT INTO outbox.relay_member AS m (relay_id, seen_until, watch, watch_role)
        VALUES (me, now_ + span / 2, database_lease_take.watch, login_role)
        ON CONFLICT ON CONSTRAINT relay_member_pkey
        DO UPDATE SET seen_until = excluded.seen_until, watch = excluded.watch,
                      watch_role = excluded.watch_role
        WHERE m.watch IS DISTINCT FROM excluded.watch
           OR m.watch_role IS DISTINCT FROM excluded.watch_role
           OR (excluded.watch IS NULL AND m.seen_until < now_ + span / 4);
    seen := FOUND; -- a member new, or with another watch: the owner's watch must see it
    DELETE FROM outbox.relay_member AS m
     WHERE m.seen_until < now_ - interval '1 hour'
       AND m.relay_id NOT IN (SELECT r.relay_id FROM outbox.relay_members(span) AS r
                               WHERE r.live);
    SELECT r.relay_id INTO winner FROM outbox.relay_members(span) AS r
     WHERE r.live OR r.relay_id = me
     ORDER BY pg_catalog.md5(r.relay_id || ':' || pg_catalog.current_database()) DESC, r.relay_id
     LIMIT 1;
    wins := coalesce(winner = me, false);
    SELECT * INTO lease FROM outbox.database_lease AS l FOR UPDATE;
    SELECT r.watched, r.live INTO owner_watched, owner_live
      FROM outbox.relay_members(span) AS r WHERE r.relay_id = lease.owner;
    owner_watched := coalesce(owner_watched, false);
    owner_live := lease.owner IS NOT NULL
              AND (lease.owner = me
                   OR (coalesce(owner_live, false)
                       AND (owner_watched OR coalesce(lease.lease_until > now_, false))));
    paused := lease.paused_at IS NOT NULL;
    IF paused THEN
        UPDATE outbox.database_lease AS l SET owner = NULL, lease_until = NULL
         WHERE l.owner IS NOT NULL;
        held := false;
    ELSIF lease.owner = me THEN
        held := wins;
        IF NOT held THEN
            UPDATE outbox.database_lease AS l SET owner = NULL, lease_until = NULL;
        ELSIF NOT owner_watched THEN
            UPDATE outbox.database_lease AS l SET lease_until = now_ + span
             WHERE l.lease_until IS NULL OR l.lease_until < now_ + span / 2;
        END IF;
    ELSIF NOT owner_live AND wins THEN
        UPDATE outbox.database_lease AS l
           SET owner = me, generation = l.generation + 1, lease_until = now_ + span;
        held := true;
    ELSE
        held := false;
        -- the winner kept out by a live owner: a write the owner's watch sees
        IF wins AND lease.owner IS NOT NULL AND lease.owner <> me
           AND coalesce(lease.wanted_at < now_ - span / 4, true) THEN
            UPDATE outbox.database_lease AS l SET wanted_at = now_;
            seen := true;
        END IF;
    END IF;
    -- what the other relays' watches must see, reported at this transaction's end
    IF seen AND pg_catalog.to_regproc('pg_catalog.pg_stat_force_next_flush') IS NOT NULL THEN
        EXECUTE 'SELECT pg_catalog.pg_stat_force_next_flush()';
    END IF;
    SELECT l.owner, l.generation INTO owner, generation FROM outbox.database_lease AS l;
    IF owner IS DISTINCT FROM lease.owner THEN
        -- a free lease waits for the winner: whether its watch keeps it alive
        SELECT r.watched INTO owner_watched
          FROM outbox.relay_members(span) AS r WHERE r.relay_id = coalesce(owner, winner);
        owner_watched := coalesce(owner_watched, false);
    END IF;
END
$$;
