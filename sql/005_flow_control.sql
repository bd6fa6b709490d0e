-- 005_flow_control.sql - pause and resume, replay, and the consumers' inbox.
--
-- Pause: a row of outbox.paused stops every relay from claiming a queue
-- (ordering_key NULL) or one ordering key of it. The claim skips such rows
-- with an anti-join on this table, so a pause takes effect at the next claim
-- of every relay, without a restart; producers are never blocked and the
-- rows keep accumulating as ready. Rows already claimed finish normally.
--
-- Replay: replays counts how often an operator sent a succeeded row back to
-- ready (outboxctl replay). The Redis sink puts it into the row's dedup
-- record, so each replay appends the job once more, and at most once.
--
-- Inbox: outbox.inbox_accept() records that a consumer took a message, in
-- the consumer's own transaction, so its writes and the mark commit together.
--
-- Locks: ADD COLUMN with a constant default changes only the catalog (no
-- table rewrite), under a brief ACCESS EXCLUSIVE lock on outbox.job; the new
-- tables are empty.

-- ---- pause ------------------------------------------------------------------

CREATE TABLE outbox.paused (
    queue        text NOT NULL,
    ordering_key text, -- NULL: the whole queue
    reason       text,
    paused_by    text NOT NULL DEFAULT current_user,
    paused_at    timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT paused_queue_name CHECK (length(queue) BETWEEN 1 AND 200 AND queue !~ '[^A-Za-z0-9._:-]')
);

COMMENT ON TABLE outbox.paused IS 'queues and ordering keys that relays do not claim from';

-- One pause per queue and one per (queue, key); the first also serves the
-- claim's probe by queue.
CREATE UNIQUE INDEX paused_queue_idx ON outbox.paused (queue) WHERE ordering_key IS NULL;
CREATE UNIQUE INDEX paused_key_idx ON outbox.paused (queue, ordering_key) WHERE ordering_key IS NOT NULL;

-- The queue name rule of outbox.enqueue(), as one error.
CREATE FUNCTION outbox.check_queue_name(queue text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF queue IS NULL OR length(queue) NOT BETWEEN 1 AND 200
       OR ltrim(queue, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-') <> '' THEN
        RAISE EXCEPTION 'invalid outbox queue name %', coalesce(quote_literal(left(queue, 60)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'a queue name is 1 to 200 characters of A-Z a-z 0-9 . _ : -';
    END IF;
END
$$;

-- Pauses a queue, or one ordering key of it. Returns false when it was paused
-- already; the reason is then replaced when a new one is given, and who and
-- when stay those of the first pause.
CREATE FUNCTION outbox.pause(queue text, ordering_key text DEFAULT NULL, reason text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    inserted boolean;
BEGIN
    PERFORM outbox.check_queue_name(pause.queue);
    IF pause.ordering_key = '' THEN
        RAISE EXCEPTION 'an ordering key to pause must not be empty'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pause.ordering_key IS NULL THEN
        INSERT INTO outbox.paused (queue, reason) VALUES (pause.queue, pause.reason)
        ON CONFLICT (queue) WHERE ordering_key IS NULL DO NOTHING
        RETURNING true INTO inserted;
    ELSE
        INSERT INTO outbox.paused (queue, ordering_key, reason)
        VALUES (pause.queue, pause.ordering_key, pause.reason)
        ON CONFLICT (queue, ordering_key) WHERE ordering_key IS NOT NULL DO NOTHING
        RETURNING true INTO inserted;
    END IF;
    IF inserted IS NULL AND pause.reason IS NOT NULL THEN
        UPDATE outbox.paused AS p SET reason = pause.reason
         WHERE p.queue = pause.queue AND p.ordering_key IS NOT DISTINCT FROM pause.ordering_key;
    END IF;
    RETURN coalesce(inserted, false);
END
$$;

-- Resumes a queue (its own pause only: paused keys of it stay paused), or one
-- ordering key. Returns false when it was not paused. Relays waiting on
-- channel outbox_job wake at commit and claim the waiting rows at once.
CREATE FUNCTION outbox.resume(queue text, ordering_key text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    removed boolean;
BEGIN
    DELETE FROM outbox.paused AS p
     WHERE p.queue = resume.queue AND p.ordering_key IS NOT DISTINCT FROM resume.ordering_key
    RETURNING true INTO removed;
    IF removed THEN
        NOTIFY outbox_job;
    END IF;
    RETURN coalesce(removed, false);
END
$$;

-- ---- replay -----------------------------------------------------------------

ALTER TABLE outbox.job ADD COLUMN replays integer NOT NULL DEFAULT 0;

COMMENT ON COLUMN outbox.job.replays IS 'times an operator sent this succeeded row back to ready';

-- ---- inbox ------------------------------------------------------------------

CREATE TABLE outbox.inbox (
    consumer    text NOT NULL,
    message_id  text NOT NULL,
    accepted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

COMMENT ON TABLE outbox.inbox IS 'message ids each consumer has processed, for effectively-once consumers';

-- outboxctl inbox purge, oldest first.
CREATE INDEX inbox_accepted_idx ON outbox.inbox (accepted_at);

-- True the first time consumer accepts message_id, false on a repeat. The
-- record belongs to the caller's transaction: a rollback leaves the message
-- unaccepted, and a concurrent transaction accepting the same id waits for
-- this one and then gets false (or true, after a rollback). PL/pgSQL keeps
-- the insert's plan for the session: about 20 us a call, where a LANGUAGE
-- sql body, planned again on every call, took about 120 us.
CREATE FUNCTION outbox.inbox_accept(consumer text, message_id text) RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO outbox.inbox (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING;
    RETURN FOUND;
END
$$;
