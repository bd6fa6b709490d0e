-- 026_history_token.sql - each history of a database names itself with a
-- token it draws at random, not with a number it computes.
--
-- The epoch of 015 is computed from what the server says: one more for
-- another cluster, the timeline's step within one. Two copies of one
-- database that move on apart compute the same epoch: two standbys of one
-- primary promoted one after the other when they share no WAL archive (both
-- take timeline 2), a point-in-time recovery repeated, one dump restored
-- twice. Their rows are others, but they sit at the same job ids and stream
-- places, and a broker's order record named after the epoch (Redis: how far
-- each stream partition was appended, sink_redis_script.c) took the second
-- history's rows for the first one's, already appended: they were marked
-- published and never reached the stream.
--
-- outbox.identity.history_token is drawn each time identity_observe() moves
-- the epoch, on whichever copy moves it, so two copies moving from the same
-- recorded history draw two tokens. identity_observe() returns the
-- history's name, "<database_id>:<epoch>" followed by "." and the token once
-- one was drawn (a database migrated here keeps its name until its history
-- changes: order records in flight stay valid). Message ids do not change:
-- the form uid carries no epoch, and the form database keeps
-- "<database_id>:<epoch>:<job_id>".
--
-- Locks: ADD COLUMN without a default changes the catalog only;
-- outbox.identity is one row.

ALTER TABLE outbox.identity
    ADD COLUMN history_token text
        CONSTRAINT identity_history_token_shape CHECK (history_token ~ '^[0-9a-f]{12}$');

COMMENT ON COLUMN outbox.identity.history_token IS
    'drawn at random each time the epoch moves: tells apart two copies that moved on from one history to the same epoch (NULL until the first move after migration 026)';

-- As in 021, with the history's name, and a token drawn with each move.
DROP FUNCTION outbox.identity_observe();
CREATE FUNCTION outbox.identity_observe(OUT database_id text, OUT id_form text, OUT epoch integer,
                                        OUT history_changed boolean, OUT history text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    cluster bigint := (SELECT s.system_identifier FROM pg_catalog.pg_control_system() AS s);
    line integer := outbox.current_timeline();
BEGIN
    UPDATE outbox.identity AS i
       SET epoch = CASE WHEN i.system_identifier = cluster AND line > i.timeline
                        THEN i.epoch + (line - i.timeline) ELSE i.epoch + 1 END,
           history_token = left(replace(pg_catalog.gen_random_uuid()::text, '-', ''), 12),
           system_identifier = cluster, timeline = line, changed_at = now()
     WHERE i.system_identifier IS DISTINCT FROM cluster OR i.timeline IS DISTINCT FROM line;
    history_changed := FOUND;
    SELECT i.database_id, i.id_form, i.epoch,
           i.database_id || ':' || i.epoch || coalesce('.' || i.history_token, '')
      INTO database_id, id_form, epoch, history
      FROM outbox.identity AS i;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'outbox.identity has no row: run outboxctl migrate'
            USING ERRCODE = 'undefined_object';
    END IF;
END
$$;
