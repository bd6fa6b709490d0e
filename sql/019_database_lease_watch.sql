-- 019: database leases kept by the relays' statistics watch instead of by
-- visits. A relay of a list keeps one connection per PostgreSQL server (its
-- statistics watch, relay/scheduler_watch.c) whose application_name,
-- 'outbox-relay watch <uuid>', it records with its membership here. While
-- that session runs queries (its query_start within a lease), the relay is
-- alive for every database of the server: its membership and its leases
-- hold with no visit, so an idle database costs no connection. When the
-- session is gone (the relay exited or was killed: PostgreSQL ends a
-- backend whose client closed its socket), the relay is gone at once, and
-- the relays left take its databases over without waiting for the lease's
-- end. A session that stopped querying (a relay stopped, not killed) falls
-- back to the lease's end. Where the function's owner may not read other
-- roles' query_start (neither superuser nor pg_read_all_stats, and another
-- login than the relays'), leases are kept by visits as in migration 018.

ALTER TABLE outbox.relay_member
    ADD COLUMN watch text CHECK (watch IS NULL OR length(watch) BETWEEN 1 AND 63);

-- The members with whether each is alive now, and whether its statistics
-- watch is what keeps it alive.
CREATE FUNCTION outbox.relay_members(span interval,
                                     OUT relay_id text, OUT live boolean, OUT watched boolean)
RETURNS SETOF record
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH session AS (
        SELECT a.application_name AS name, max(a.query_start) AS active_at
          FROM pg_catalog.pg_stat_activity AS a
         WHERE a.application_name LIKE 'outbox-relay watch %'
         GROUP BY a.application_name
    )
    SELECT m.relay_id,
           CASE WHEN m.watch IS NULL THEN m.seen_until > pg_catalog.clock_timestamp()
                WHEN s.name IS NULL THEN false -- its watch ended: the relay is gone
                WHEN s.active_at > pg_catalog.clock_timestamp() - span THEN true
                ELSE m.seen_until > pg_catalog.clock_timestamp()
           END,
           m.watch IS NOT NULL AND s.active_at > pg_catalog.clock_timestamp() - span
      FROM outbox.relay_member AS m
      LEFT JOIN session AS s ON s.name = m.watch
$$;

-- Records relay_id as a member (with its watch's session name, NULL when
-- it has none on this server), then takes, keeps or gives up the lease as
-- migration 018's function does, with liveness from relay_members():
-- the owner keeps the lease while it wins the hash, and it is renewed only
-- while no watch keeps it; an owner that is not alive any more (its watch
-- gone, or its lease ended with no watch to keep it) loses it to the
-- winner. wins says whether relay_id should serve the database (a winner
-- that does not hold it yet comes back soon); owner_watched whether the
-- owner's watch keeps the lease, or, when it is free, the winner's watch
-- keeps the winner (the database needs no visit to keep the lease or to
-- take it over: the watch sees the owner go).
CREATE FUNCTION outbox.database_lease_take(relay_id text, lease_seconds integer, watch text,
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
    winner text;
    lease outbox.database_lease;
    owner_live boolean;
BEGIN
    INSERT INTO outbox.relay_member AS m (relay_id, seen_until, watch)
        VALUES (me, now_ + span / 2, database_lease_take.watch)
        ON CONFLICT ON CONSTRAINT relay_member_pkey
        DO UPDATE SET seen_until = excluded.seen_until, watch = excluded.watch
        WHERE m.watch IS DISTINCT FROM excluded.watch
           OR (excluded.watch IS NULL AND m.seen_until < now_ + span / 4);
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

-- Migration 018's form, for relays that do not know the watch: the same
-- rules, with no watch recorded for relay_id.
CREATE OR REPLACE FUNCTION outbox.database_lease_take(relay_id text, lease_seconds integer,
                                                      OUT held boolean, OUT owner text,
                                                      OUT generation bigint, OUT paused boolean)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT t.held, t.owner, t.generation, t.paused
      FROM outbox.database_lease_take(relay_id, lease_seconds, NULL::text) AS t
$$;

REVOKE ALL ON FUNCTION outbox.relay_members(interval) FROM PUBLIC;
