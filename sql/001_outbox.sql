-- 001_outbox.sql - the outbox table, its indexes, and outbox.enqueue().
--
-- One row per message. Producers insert rows in their own transaction through
-- outbox.enqueue(); relays (and plain in-database workers) move rows through
--
--   ready -> running -> succeeded
--              |  \---> ready (retry after backoff, or lease expired and reaped)
--              \------> dead  (attempts exhausted, or a permanent failure)
--
-- attempts is the generation of the current claim: every claim increments it,
-- and every later write of the row must name the same worker_id + attempts
-- while lease_until is still in the future.

CREATE SCHEMA IF NOT EXISTS outbox;

-- True when h is a JSON object whose values are all strings (AMQP and Redis
-- headers carry strings only). One expression, so the planner inlines it.
CREATE FUNCTION outbox.headers_are_strings(h jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT jsonb_typeof(h) = 'object' AND NOT jsonb_path_exists(h, '$.* ? (@.type() != "string")')
$$;

CREATE TABLE outbox.job (
    job_id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue           text NOT NULL,
    payload         jsonb NOT NULL,
    headers         jsonb NOT NULL DEFAULT '{}',
    idempotency_key text,
    ordering_key    text,
    state           text NOT NULL DEFAULT 'ready',
    priority        integer NOT NULL DEFAULT 0,
    run_at          timestamptz NOT NULL DEFAULT now(),
    attempts        integer NOT NULL DEFAULT 0,
    max_attempts    integer NOT NULL DEFAULT 10,
    worker_id       text,
    lease_until     timestamptz,
    finished_at     timestamptz,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- internal: a ready row whose ordering key has an earlier unfinished row.
    -- Held rows stay out of the ready indexes, so a key with a long backlog
    -- costs a claim nothing; finishing the key's head releases the next one.
    held            boolean NOT NULL DEFAULT false,

    CONSTRAINT job_state_valid CHECK (state IN ('ready', 'running', 'succeeded', 'dead')),
    CONSTRAINT job_queue_name CHECK (queue ~ '^[A-Za-z0-9._:-]{1,200}$'),
    CONSTRAINT job_headers_strings CHECK (headers = '{}' OR outbox.headers_are_strings(headers)),
    CONSTRAINT job_attempts_valid CHECK (attempts >= 0),
    CONSTRAINT job_max_attempts_positive CHECK (max_attempts > 0),
    -- only a ready row of an ordering key can wait for an earlier one
    CONSTRAINT job_held_shape CHECK (NOT held OR (state = 'ready' AND ordering_key IS NOT NULL)),
    -- running rows, and only they, have an owner and a lease
    CONSTRAINT job_claim_shape CHECK (
        (state = 'running' AND worker_id IS NOT NULL AND lease_until IS NOT NULL)
        OR (state <> 'running' AND worker_id IS NULL AND lease_until IS NULL)
    ),
    -- final rows, and only they, have a finish time
    CONSTRAINT job_finish_shape CHECK (
        (state IN ('succeeded', 'dead')) = (finished_at IS NOT NULL)
    )
);

COMMENT ON TABLE outbox.job IS 'transactional outbox: one row per message to publish';
COMMENT ON COLUMN outbox.job.attempts IS 'claims so far; the current claim''s generation';

-- Claim across all queues: matches the claim's filter and ORDER BY, so the
-- claim reads the first rows of the index and stops; succeeded rows are not in it.
CREATE INDEX job_ready_idx ON outbox.job (priority DESC, run_at, job_id)
    WHERE state = 'ready' AND NOT held;

-- Claim for a set of queues (--queues), and per-queue backlog figures.
CREATE INDEX job_ready_queue_idx ON outbox.job (queue, priority DESC, run_at, job_id)
    WHERE state = 'ready' AND NOT held;

-- The reaper: expired leases, oldest first. Only in-flight rows are in it.
CREATE INDEX job_lease_idx ON outbox.job (lease_until)
    WHERE state = 'running';

-- Producer deduplication: one row per (queue, idempotency_key).
CREATE UNIQUE INDEX job_idempotency_key_idx ON outbox.job (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Per-key ordering: the head of a key is its lowest unfinished job_id.
CREATE INDEX job_ordering_idx ON outbox.job (queue, ordering_key, job_id)
    WHERE ordering_key IS NOT NULL AND state IN ('ready', 'running', 'dead');

-- Held rows per key, first one first: releasing the next row of a key, and
-- the relays' sweep that releases rows whose head finished while they were
-- being inserted.
CREATE INDEX job_held_idx ON outbox.job (queue, ordering_key, job_id)
    WHERE held;

-- Retention cleanup of succeeded rows, oldest first.
CREATE INDEX job_succeeded_idx ON outbox.job (finished_at)
    WHERE state = 'succeeded';

-- Operators' view of dead rows.
CREATE INDEX job_dead_idx ON outbox.job (queue, job_id)
    WHERE state = 'dead';

-- Inserts one outbox row in the caller's transaction and returns its job_id.
-- With an idempotency_key already present in that queue it inserts nothing
-- and returns the existing job_id. Producers never NOTIFY: relays poll the
-- ready index adaptively (see README, "Wake-up"), so commits do not serialize.
CREATE FUNCTION outbox.enqueue(
    queue           text,
    payload         jsonb,
    idempotency_key text DEFAULT NULL,
    headers         jsonb DEFAULT '{}',
    priority        int DEFAULT 0,
    run_at          timestamptz DEFAULT now(),
    max_attempts    int DEFAULT 10,
    ordering_key    text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    new_id bigint;
    waits  boolean := false;
BEGIN
    -- the same rule as job_queue_name, without a regular expression: a regex
    -- here costs a single-row transaction about half its throughput
    IF enqueue.queue IS NULL OR length(enqueue.queue) NOT BETWEEN 1 AND 200
       OR ltrim(enqueue.queue, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-') <> '' THEN
        RAISE EXCEPTION 'invalid outbox queue name %', coalesce(quote_literal(left(enqueue.queue, 60)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'a queue name is 1 to 200 characters of A-Z a-z 0-9 . _ : -';
    END IF;
    IF enqueue.payload IS NULL THEN
        RAISE EXCEPTION 'outbox payload must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF enqueue.headers IS NULL
       OR (enqueue.headers <> '{}' AND NOT outbox.headers_are_strings(enqueue.headers)) THEN
        RAISE EXCEPTION 'outbox headers must be a JSON object of string values'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue.max_attempts IS NULL OR enqueue.max_attempts < 1 THEN
        RAISE EXCEPTION 'outbox max_attempts must be positive, got %', coalesce(enqueue.max_attempts::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- behind an unfinished row of its key, the row waits (held) until that one finishes
    IF enqueue.ordering_key IS NOT NULL THEN
        waits := EXISTS (SELECT 1 FROM outbox.job AS e
                         WHERE e.queue = enqueue.queue AND e.ordering_key = enqueue.ordering_key
                           AND e.state IN ('ready', 'running'));
    END IF;

    IF enqueue.idempotency_key IS NULL THEN
        INSERT INTO outbox.job (queue, payload, headers, priority, run_at, max_attempts, ordering_key,
                                held)
        VALUES (enqueue.queue, enqueue.payload, enqueue.headers, coalesce(enqueue.priority, 0),
                coalesce(enqueue.run_at, now()), enqueue.max_attempts, enqueue.ordering_key, waits)
        RETURNING job_id INTO new_id;
        RETURN new_id;
    END IF;

    -- A concurrent insert of the same key makes ON CONFLICT wait for it; a row
    -- purged between the conflict and the lookup makes us try again.
    FOR attempt IN 1..3 LOOP
        INSERT INTO outbox.job (queue, payload, headers, idempotency_key, priority, run_at,
                                max_attempts, ordering_key, held)
        VALUES (enqueue.queue, enqueue.payload, enqueue.headers, enqueue.idempotency_key,
                coalesce(enqueue.priority, 0), coalesce(enqueue.run_at, now()),
                enqueue.max_attempts, enqueue.ordering_key, waits)
        ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING job_id INTO new_id;
        IF new_id IS NOT NULL THEN
            RETURN new_id;
        END IF;
        SELECT j.job_id INTO new_id FROM outbox.job AS j
        WHERE j.queue = enqueue.queue AND j.idempotency_key = enqueue.idempotency_key;
        IF new_id IS NOT NULL THEN
            RETURN new_id;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'outbox idempotency key % of queue % kept changing', enqueue.idempotency_key, enqueue.queue
        USING ERRCODE = 'serialization_failure';
END
$$;
