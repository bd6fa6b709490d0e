-- 018: the lease of a database among relays that serve the same list of
-- databases (outbox-relay --databases). Each relay that visits the database
-- records itself as a member until a lease from now; the live members'
-- rendezvous hash (md5 of relay id and database name, highest wins) names
-- the relay that should serve the database, so a relay joining or leaving
-- moves only the databases it wins or held. One row holds the lease: its
-- owner, a generation that grows at each new owner, and its end. Row leases
-- keep double serving safe; this lease spreads the databases and the
-- relays' connection budgets. A database paused here (outboxctl pause
-- --database) is served by no relay of a list until resumed.

CREATE TABLE outbox.relay_member (
    relay_id text PRIMARY KEY CHECK (length(relay_id) BETWEEN 1 AND 200),
    seen_until timestamptz NOT NULL
);

CREATE TABLE outbox.database_lease (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    owner text,
    generation bigint NOT NULL DEFAULT 0,
    lease_until timestamptz,
    paused_at timestamptz, -- NULL: not paused
    paused_by text,
    reason text
);

INSERT INTO outbox.database_lease DEFAULT VALUES;

-- Records relay_id as a member (for half a lease), then takes, keeps or gives up the lease:
-- the owner keeps it while it wins the hash (renewed when half spent) and
-- gives it up as soon as another live member wins; a free or expired lease
-- goes to the winner; a paused database is held by none. held says whether
-- relay_id holds it now.
CREATE FUNCTION outbox.database_lease_take(relay_id text, lease_seconds integer,
                                           OUT held boolean, OUT owner text,
                                           OUT generation bigint, OUT paused boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now_ timestamptz := pg_catalog.clock_timestamp();
    span interval := pg_catalog.make_interval(secs => lease_seconds);
    winner text;
    lease outbox.database_lease;
    me text := database_lease_take.relay_id;
BEGIN
    -- a member lives half a lease past its visit (relays visit every quarter
    -- lease), so a relay gone stops winning before the lease it held ends
    INSERT INTO outbox.relay_member AS m (relay_id, seen_until) VALUES (me, now_ + span / 2)
        ON CONFLICT ON CONSTRAINT relay_member_pkey
        DO UPDATE SET seen_until = excluded.seen_until
        WHERE m.seen_until < now_ + span / 4;
    DELETE FROM outbox.relay_member AS m WHERE m.seen_until < now_ - interval '1 hour';
    SELECT m.relay_id INTO winner FROM outbox.relay_member AS m
     WHERE m.seen_until > now_
     ORDER BY pg_catalog.md5(m.relay_id || ':' || pg_catalog.current_database()) DESC, m.relay_id
     LIMIT 1;
    SELECT * INTO lease FROM outbox.database_lease AS l FOR UPDATE;
    paused := lease.paused_at IS NOT NULL;
    IF paused THEN
        UPDATE outbox.database_lease AS l SET owner = NULL, lease_until = NULL
         WHERE l.owner IS NOT NULL;
        held := false;
    ELSIF lease.owner = me AND lease.lease_until > now_ THEN
        IF winner = me THEN
            UPDATE outbox.database_lease AS l SET lease_until = now_ + span
             WHERE l.lease_until < now_ + span / 2;
            held := true;
        ELSE
            UPDATE outbox.database_lease AS l SET owner = NULL, lease_until = NULL;
            held := false;
        END IF;
    ELSIF (lease.owner IS NULL OR lease.lease_until <= now_) AND winner = me THEN
        UPDATE outbox.database_lease AS l
           SET owner = me, generation = l.generation + 1, lease_until = now_ + span;
        held := true;
    ELSE
        held := false;
    END IF;
    SELECT l.owner, l.generation INTO owner, generation FROM outbox.database_lease AS l;
END
$$;

-- Gives the lease up at once (a relay stopping), when relay_id holds it.
CREATE FUNCTION outbox.database_lease_release(relay_id text) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE outbox.database_lease AS l SET owner = NULL, lease_until = NULL
     WHERE l.owner = database_lease_release.relay_id;
    DELETE FROM outbox.relay_member AS m WHERE m.relay_id = database_lease_release.relay_id;
    RETURN FOUND;
END
$$;

-- Pauses or resumes the whole database for relays of a list (outboxctl
-- pause --database, resume --database); true when that changed something.
CREATE FUNCTION outbox.database_pause(reason text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE outbox.database_lease AS l
       SET paused_at = pg_catalog.now(), paused_by = CURRENT_USER,
           reason = database_pause.reason
     WHERE l.paused_at IS NULL;
    RETURN FOUND;
END
$$;

CREATE FUNCTION outbox.database_resume() RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE outbox.database_lease AS l SET paused_at = NULL, paused_by = NULL, reason = NULL
     WHERE l.paused_at IS NOT NULL;
    RETURN FOUND;
END
$$;

REVOKE ALL ON FUNCTION outbox.database_pause(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.database_resume() FROM PUBLIC;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_reader') THEN
        GRANT SELECT ON outbox.relay_member, outbox.database_lease TO outbox_reader;
    END IF;
END
$$;
