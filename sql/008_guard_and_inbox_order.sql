-- 008_guard_and_inbox_order.sql - an insert guard that probes an index, one
-- set of enqueue checks, and an inbox that refuses a key's older messages.
--
-- 1. The insert guard of 003 checked a held row with "an earlier row of its
--    key is unfinished, or finished since this transaction began"; the
--    second half cannot use job_ordering_idx (succeeded rows are not in it),
--    so every held insert scanned the table, for every role. It now reads
--    only the unfinished rows of the key, through job_ordering_idx. The race
--    the second half covered (enqueue() saw the key's head unfinished, the
--    head finished before the insert) no longer refuses the row: a held row
--    whose key has no unfinished earlier row goes in not held, the shape
--    enqueue() would have given it a moment later. The table owner's rows
--    (and those of a role it gave INSERT WITH GRANT OPTION) are not checked
--    at all, and ownership is looked at before any probe.
--
--    enqueue_batch() with ordering keys and no idempotency keys is one
--    INSERT ... SELECT (nothing can conflict), and its probe of the keys'
--    unfinished rows stays one index probe per key under a generic plan.
--
-- 2. enqueue() and enqueue_batch() validate through one function,
--    outbox.check_enqueue(), with the errors (SQLSTATE and text) they had.
--
-- 3. outbox.inbox_accept(consumer, message_id, ordering_key): job ids rise
--    within an ordering key, so a consumer that applies the messages of a key
--    in order can refuse one whose job id is not above the last it applied
--    for that key: a message a stale relay published late, after later rows
--    of its key. The last job id per (consumer, key) is kept in
--    outbox.inbox_key, in the caller's transaction like outbox.inbox.
--
-- Locks: functions are replaced in the catalog; the new table is empty.
-- CREATE OR REPLACE keeps every function's grants.

-- ---- one set of checks ------------------------------------------------------

-- Raises what enqueue() and enqueue_batch() raise for bad arguments: the
-- queue name rule of job_queue_name (without a regular expression: a regex
-- here costs a single-row transaction about half its throughput), a missing
-- payload, headers that are not an object of strings, max_attempts below 1,
-- an exchange or routing key AMQP cannot carry.
CREATE FUNCTION outbox.check_enqueue(queue text, payload_missing boolean, headers jsonb,
                                     max_attempts int, exchange text, routing_key text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF queue IS NULL OR length(queue) NOT BETWEEN 1 AND 200
       OR ltrim(queue, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-') <> '' THEN
        RAISE EXCEPTION 'invalid outbox queue name %', coalesce(quote_literal(left(queue, 60)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'a queue name is 1 to 200 characters of A-Z a-z 0-9 . _ : -';
    END IF;
    IF payload_missing THEN
        RAISE EXCEPTION 'outbox payload must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF headers IS NULL OR (headers <> '{}' AND NOT outbox.headers_are_strings(headers)) THEN
        RAISE EXCEPTION 'outbox headers must be a JSON object of string values'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_attempts IS NULL OR max_attempts < 1 THEN
        RAISE EXCEPTION 'outbox max_attempts must be positive, got %', coalesce(max_attempts::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF exchange IS NOT NULL OR routing_key IS NOT NULL THEN
        PERFORM outbox.check_destination('exchange', exchange),
                outbox.check_destination('routing key', routing_key);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION outbox.enqueue(
    queue           text,
    payload         jsonb,
    idempotency_key text DEFAULT NULL,
    headers         jsonb DEFAULT '{}',
    priority        int DEFAULT 0,
    run_at          timestamptz DEFAULT now(),
    max_attempts    int DEFAULT 10,
    ordering_key    text DEFAULT NULL,
    exchange        text DEFAULT NULL,
    routing_key     text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    new_id bigint;
    waits  boolean := false;
BEGIN
    PERFORM outbox.check_enqueue(enqueue.queue, enqueue.payload IS NULL, enqueue.headers,
                                 enqueue.max_attempts, enqueue.exchange, enqueue.routing_key);
    -- the trace context of the session; one settings lookup when there is none
    IF current_setting('outbox.traceparent', true) <> '' THEN
        enqueue.headers := outbox.trace_headers(enqueue.headers);
    END IF;

    -- behind an unfinished row of its key, the row waits (held) until that one finishes
    IF enqueue.ordering_key IS NOT NULL THEN
        waits := EXISTS (SELECT 1 FROM outbox.job AS e
                         WHERE e.queue = enqueue.queue AND e.ordering_key = enqueue.ordering_key
                           AND e.state IN ('ready', 'running'));
    END IF;

    IF enqueue.idempotency_key IS NULL THEN
        INSERT INTO outbox.job (queue, payload, headers, priority, run_at, max_attempts, ordering_key,
                                exchange, routing_key, held)
        VALUES (enqueue.queue, enqueue.payload, enqueue.headers, coalesce(enqueue.priority, 0),
                coalesce(enqueue.run_at, now()), enqueue.max_attempts, enqueue.ordering_key,
                enqueue.exchange, enqueue.routing_key, waits)
        RETURNING job_id INTO new_id;
        RETURN new_id;
    END IF;

    -- A concurrent insert of the same key makes ON CONFLICT wait for it; a row
    -- purged between the conflict and the lookup makes us try again.
    FOR attempt IN 1..3 LOOP
        INSERT INTO outbox.job (queue, payload, headers, idempotency_key, priority, run_at,
                                max_attempts, ordering_key, exchange, routing_key, held)
        VALUES (enqueue.queue, enqueue.payload, enqueue.headers, enqueue.idempotency_key,
                coalesce(enqueue.priority, 0), coalesce(enqueue.run_at, now()),
                enqueue.max_attempts, enqueue.ordering_key, enqueue.exchange, enqueue.routing_key,
                waits)
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

CREATE OR REPLACE FUNCTION outbox.enqueue_batch(
    queue            text,
    payloads         jsonb[],
    idempotency_keys text[] DEFAULT NULL,
    ordering_keys    text[] DEFAULT NULL,
    headers          jsonb DEFAULT '{}',
    priority         int DEFAULT 0,
    run_at           timestamptz DEFAULT now(),
    max_attempts     int DEFAULT 10,
    exchange         text DEFAULT NULL,
    routing_key      text DEFAULT NULL
) RETURNS bigint[]
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    row_count int := coalesce(cardinality(enqueue_batch.payloads), 0);
    ids       bigint[];
BEGIN
    -- flat arrays only, one key (or NULL) per payload
    IF array_ndims(enqueue_batch.payloads) > 1
       OR coalesce(array_ndims(enqueue_batch.idempotency_keys), 1) > 1
       OR coalesce(array_ndims(enqueue_batch.ordering_keys), 1) > 1 THEN
        RAISE EXCEPTION 'outbox enqueue_batch takes one-dimensional arrays'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM outbox.check_enqueue(enqueue_batch.queue,
                                 enqueue_batch.payloads IS NULL
                                 OR array_position(enqueue_batch.payloads, NULL) IS NOT NULL,
                                 enqueue_batch.headers, enqueue_batch.max_attempts,
                                 enqueue_batch.exchange, enqueue_batch.routing_key);
    IF cardinality(enqueue_batch.idempotency_keys) <> row_count THEN
        RAISE EXCEPTION 'outbox enqueue_batch got % idempotency keys for % payloads',
                        cardinality(enqueue_batch.idempotency_keys), row_count
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass one key per payload, NULL for none';
    END IF;
    IF cardinality(enqueue_batch.ordering_keys) <> row_count THEN
        RAISE EXCEPTION 'outbox enqueue_batch got % ordering keys for % payloads',
                        cardinality(enqueue_batch.ordering_keys), row_count
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass one key per payload, NULL for none';
    END IF;
    IF row_count = 0 THEN
        RETURN '{}';
    END IF;
    -- the trace context of the session; one settings lookup when there is none
    IF current_setting('outbox.traceparent', true) <> '' THEN
        enqueue_batch.headers := outbox.trace_headers(enqueue_batch.headers);
    END IF;

    -- All rows new, none keyed: one INSERT ... SELECT. Identity values are
    -- drawn in the order the rows are inserted, which is array order.
    IF enqueue_batch.idempotency_keys IS NULL AND enqueue_batch.ordering_keys IS NULL THEN
        WITH inserted AS (
            INSERT INTO outbox.job (queue, payload, headers, priority, run_at, max_attempts,
                                    exchange, routing_key)
            SELECT enqueue_batch.queue, p, enqueue_batch.headers, coalesce(enqueue_batch.priority, 0),
                   coalesce(enqueue_batch.run_at, now()), enqueue_batch.max_attempts,
                   enqueue_batch.exchange, enqueue_batch.routing_key
            FROM unnest(enqueue_batch.payloads) AS p
            RETURNING job_id)
        SELECT array_agg(job_id ORDER BY job_id) INTO ids FROM inserted;
        RETURN ids;
    END IF;

    -- Ordering keys only: no row can conflict, so one INSERT ... SELECT in
    -- array order. A row is held behind an earlier row of its key in this call
    -- or an unfinished row of its key in the table (one probe of
    -- job_ordering_idx per distinct key; LATERAL ... LIMIT 1 keeps it a probe
    -- under a generic plan, where a semi-join read every unfinished row of
    -- the queue).
    IF enqueue_batch.idempotency_keys IS NULL THEN
        WITH source AS (
            SELECT r.ord, r.payload, r.ordering_key
            FROM unnest(enqueue_batch.payloads, enqueue_batch.ordering_keys)
                 WITH ORDINALITY AS r(payload, ordering_key, ord)),
        busy_keys AS (
            SELECT k.ordering_key
            FROM (SELECT DISTINCT s.ordering_key FROM source AS s
                  WHERE s.ordering_key IS NOT NULL) AS k
            CROSS JOIN LATERAL (SELECT 1 FROM outbox.job AS e
                                WHERE e.queue = enqueue_batch.queue
                                  AND e.ordering_key = k.ordering_key
                                  AND e.state IN ('ready', 'running')
                                LIMIT 1) AS unfinished),
        inserted AS (
            INSERT INTO outbox.job (queue, payload, headers, priority, run_at, max_attempts,
                                    ordering_key, exchange, routing_key, held)
            SELECT enqueue_batch.queue, s.payload, enqueue_batch.headers,
                   coalesce(enqueue_batch.priority, 0), coalesce(enqueue_batch.run_at, now()),
                   enqueue_batch.max_attempts, s.ordering_key, enqueue_batch.exchange,
                   enqueue_batch.routing_key,
                   s.ordering_key IS NOT NULL
                   AND (s.ord > min(s.ord) OVER (PARTITION BY s.ordering_key)
                        OR s.ordering_key IN (SELECT b.ordering_key FROM busy_keys AS b))
            FROM source AS s ORDER BY s.ord
            RETURNING job_id)
        SELECT array_agg(job_id ORDER BY job_id) INTO ids FROM inserted;
        RETURN ids;
    END IF;

    -- Keyed rows. A key already in the queue returns its row; the first row
    -- of each new key goes in and its repeats return it; a row is held behind
    -- an unfinished row of its ordering key, in the table or earlier in this
    -- call. A concurrent insert of the same key makes ON CONFLICT wait for it
    -- and skip the row, and the next round finds it (as would a row purged
    -- in between: the next round inserts it). ids keeps what earlier rounds
    -- found, so no row goes in twice.
    FOR attempt IN 1..3 LOOP
        WITH source AS (
            SELECT r.ord::int AS ord, r.payload, r.idempotency_key, r.ordering_key,
                   r.idempotency_key IS NULL
                   OR r.ord = min(r.ord) OVER (PARTITION BY r.idempotency_key) AS first_of_key
            FROM unnest(enqueue_batch.payloads, enqueue_batch.idempotency_keys,
                        enqueue_batch.ordering_keys)
                 WITH ORDINALITY AS r(payload, idempotency_key, ordering_key, ord)),
        existing AS (
            SELECT j.idempotency_key, j.job_id FROM outbox.job AS j
            WHERE j.queue = enqueue_batch.queue
              AND j.idempotency_key = ANY (enqueue_batch.idempotency_keys)),
        -- the keys with an unfinished row in the table: one probe per distinct key
        busy_keys AS (
            SELECT k.ordering_key
            FROM (SELECT DISTINCT s.ordering_key FROM source AS s
                  WHERE s.ordering_key IS NOT NULL) AS k
            CROSS JOIN LATERAL (SELECT 1 FROM outbox.job AS e
                                WHERE e.queue = enqueue_batch.queue
                                  AND e.ordering_key = k.ordering_key
                                  AND e.state IN ('ready', 'running')
                                LIMIT 1) AS unfinished),
        to_insert AS (
            SELECT s.ord, s.payload, s.idempotency_key, s.ordering_key,
                   s.ordering_key IS NOT NULL
                   AND (s.ord > min(s.ord) OVER (PARTITION BY s.ordering_key)
                        OR s.ordering_key IN (SELECT b.ordering_key FROM busy_keys AS b)) AS held
            FROM source AS s
            WHERE s.first_of_key AND ids[s.ord] IS NULL
              AND NOT EXISTS (SELECT 1 FROM existing AS x
                              WHERE x.idempotency_key = s.idempotency_key)),
        inserted AS (
            INSERT INTO outbox.job (queue, payload, headers, idempotency_key, priority, run_at,
                                    max_attempts, ordering_key, exchange, routing_key, held)
            SELECT enqueue_batch.queue, t.payload, enqueue_batch.headers, t.idempotency_key,
                   coalesce(enqueue_batch.priority, 0), coalesce(enqueue_batch.run_at, now()),
                   enqueue_batch.max_attempts, t.ordering_key, enqueue_batch.exchange,
                   enqueue_batch.routing_key, t.held
            FROM to_insert AS t ORDER BY t.ord
            ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
            RETURNING job_id, idempotency_key),
        -- keyless rows never conflict: the n-th of them inserted is the n-th in array order
        keyless_ids AS (
            SELECT array_agg(i.job_id ORDER BY i.job_id) AS job_ids
            FROM inserted AS i WHERE i.idempotency_key IS NULL),
        keyless AS (
            SELECT t.ord,
                   (SELECT k.job_ids FROM keyless_ids AS k)[row_number() OVER (ORDER BY t.ord)] AS job_id
            FROM to_insert AS t WHERE t.idempotency_key IS NULL)
        SELECT array_agg(coalesce(ids[s.ord], x.job_id, i.job_id, k.job_id) ORDER BY s.ord)
        INTO ids
        FROM source AS s
        LEFT JOIN existing AS x ON x.idempotency_key = s.idempotency_key
        LEFT JOIN inserted AS i ON i.idempotency_key = s.idempotency_key
        LEFT JOIN keyless AS k ON k.ord = s.ord;

        IF array_position(ids, NULL) IS NULL THEN
            RETURN ids;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'outbox idempotency keys of queue % kept changing', enqueue_batch.queue
        USING ERRCODE = 'serialization_failure';
END
$$;

-- ---- the insert guard -------------------------------------------------------

-- True when the ordering key has a ready or running row before before_job_id:
-- a probe of job_ordering_idx. Reads rows a producer may not read, hence
-- SECURITY DEFINER with a fixed search_path; PL/pgSQL keeps the probe's plan
-- for the session.
CREATE OR REPLACE FUNCTION outbox.ordering_key_busy(queue text, ordering_key text, before_job_id bigint)
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM outbox.job AS e
                   WHERE e.queue = $1 AND e.ordering_key = $2 AND e.job_id < $3
                     AND e.state IN ('ready', 'running'));
END
$$;

CREATE OR REPLACE FUNCTION outbox.job_insert_guard() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF NOT isfinite(NEW.run_at) THEN
        RAISE EXCEPTION 'outbox run_at must be a finite time, got %', NEW.run_at
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT isfinite(NEW.created_at) THEN
        RAISE EXCEPTION 'outbox created_at must be a finite time, got %', NEW.created_at
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The owner holds every privilege WITH GRANT OPTION; a role the owner gave
    -- INSERT WITH GRANT OPTION administers the table and is trusted alike.
    -- A privilege test is a plain function call, where a catalog query per
    -- row cost a keyed batch a third of its speed.
    IF has_table_privilege(TG_RELID, 'INSERT WITH GRANT OPTION') THEN
        RETURN NEW;
    END IF;
    IF NEW.state = 'ready' AND NEW.worker_id IS NULL AND NEW.lease_until IS NULL
       AND NEW.attempts = 0 AND NEW.finished_at IS NULL THEN
        -- only held is left: it stays when the key has an earlier unfinished
        -- row, else the row is ready at once (a held row without a key is
        -- refused by job_held_shape)
        IF NEW.held AND NEW.ordering_key IS NOT NULL
           AND NOT outbox.ordering_key_busy(NEW.queue, NEW.ordering_key, NEW.job_id) THEN
            NEW.held := false;
        END IF;
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'outbox producers may insert only ready rows: state ready, no worker, lease, attempts or finish time'
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'use outbox.enqueue(), or insert the message columns only';
END
$$;

-- ---- the inbox, in key order ------------------------------------------------

CREATE TABLE outbox.inbox_key (
    consumer     text NOT NULL,
    ordering_key text NOT NULL,
    last_job_id  bigint NOT NULL,
    accepted_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, ordering_key)
);

COMMENT ON TABLE outbox.inbox_key IS
    'the last job id each consumer applied per ordering key, for consumers that keep key order';

-- outboxctl inbox purge, oldest first.
CREATE INDEX inbox_key_accepted_idx ON outbox.inbox_key (accepted_at);

-- True when consumer may apply message_id (a job id) of ordering_key: its job
-- id is above the last one the consumer accepted for that key. False for a
-- repeat and for a message older than one already applied (a late publish of
-- a stale batch). A NULL ordering_key is the plain inbox_accept(consumer,
-- message_id). Like the plain one, the record belongs to the caller's
-- transaction, and a concurrent accept of the same key waits for it.
CREATE FUNCTION outbox.inbox_accept(consumer text, message_id text, ordering_key text)
RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    job_id bigint;
BEGIN
    IF $3 IS NULL THEN
        RETURN outbox.inbox_accept($1, $2);
    END IF;
    IF $2 IS NULL OR $2 !~ '^[0-9]{1,18}$' THEN
        RAISE EXCEPTION 'outbox inbox_accept with an ordering key needs a job id as message id, got %',
                        coalesce(to_json(left($2, 60))::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    job_id := $2::bigint;
    INSERT INTO outbox.inbox_key AS k (consumer, ordering_key, last_job_id)
    VALUES ($1, $3, job_id)
    ON CONFLICT ON CONSTRAINT inbox_key_pkey DO UPDATE
        SET last_job_id = excluded.last_job_id, accepted_at = excluded.accepted_at
        WHERE k.last_job_id < excluded.last_job_id;
    RETURN FOUND;
END
$$;
