-- 004_routing_and_trace.sql - a destination per row, and the W3C trace context.
--
-- Routing: outbox.job gains exchange and routing_key, both nullable. The
-- relay publishes a row to its exchange (else --exchange) with its
-- routing_key (else its queue); Redis appends it to the stream
-- --stream-prefix + (routing_key, else queue).
--
-- Tracing: outbox.enqueue() copies the session settings outbox.traceparent
-- and outbox.tracestate into the row's headers traceparent / tracestate,
-- unless the caller's headers already hold a traceparent:
--
--   BEGIN;
--   SET LOCAL outbox.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
--   ... business writes ...; SELECT outbox.enqueue('orders', '{"id": 7}');
--   COMMIT;
--
-- On an existing database: ADD COLUMN without a default changes the
-- catalog only (no table rewrite, no scan); the CHECK constraint is
-- added NOT VALID, so nothing is scanned either: it holds for every row
-- written from now on, and the rows already there have NULL in both
-- columns. The whole migration holds ACCESS EXCLUSIVE on outbox.job for a
-- few milliseconds, once the transactions using the table have finished.
-- (ALTER TABLE outbox.job VALIDATE CONSTRAINT job_destination_valid checks
-- the old rows later, if wanted, under a lock that blocks no writer.)

-- True when value can name an AMQP exchange or routing key: at most 255
-- bytes (an AMQP short string) and no control characters. The same rule
-- as the table's job_destination_valid.
CREATE FUNCTION outbox.destination_valid(value text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT octet_length(value) <= 255 AND value !~ '[\x01-\x1f\x7f]'
$$;

-- True when value is a W3C traceparent of version 00: "00-" 32 lowercase
-- hex digits of trace id (not all zero) "-" 16 of parent id (not all zero)
-- "-" 2 of flags. Without a regular expression: this runs in enqueue().
CREATE FUNCTION outbox.traceparent_valid(value text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT octet_length(value) = 55 AND left(value, 3) = '00-'
       AND substr(value, 36, 1) = '-' AND substr(value, 53, 1) = '-'
       AND ltrim(substr(value, 4, 32) || substr(value, 37, 16) || substr(value, 54, 2),
                 '0123456789abcdef') = ''
       AND substr(value, 4, 32) <> '00000000000000000000000000000000'
       AND substr(value, 37, 16) <> '0000000000000000'
$$;

-- True when value is a W3C tracestate: at most 512 bytes, at most 32
-- comma-separated members key=value (empty members allowed), keys of
-- lowercase letters, digits and _ - * / with one optional @, values of
-- printable ASCII other than , and = and not ending in a space.
CREATE FUNCTION outbox.tracestate_valid(value text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT octet_length(value) <= 512 AND value !~ '[^\x20-\x7e\t]'
       AND (SELECT count(*) <= 32
                   AND coalesce(bool_and(m ~ '^[a-z0-9][a-z0-9_*/-]*(@[a-z][a-z0-9_*/-]*)?=[\x20-\x2b\x2d-\x3c\x3e-\x7e]*[\x21-\x2b\x2d-\x3c\x3e-\x7e]$'), true)
            FROM regexp_split_to_table(value, '[ \t]*,[ \t]*') AS m
            WHERE m !~ '^[ \t]*$')
$$;

-- headers with the trace context added: traceparent (validated) and, when
-- set, tracestate (validated), each unless headers already hold it. The
-- defaults read the session settings outbox.traceparent and
-- outbox.tracestate; an empty or unset traceparent, or headers that carry
-- their own traceparent, leave headers as they are (a tracestate never
-- comes without its traceparent). An invalid value raises 22023.
-- enqueue() and the C library (which passes the message's own values) use it.
CREATE FUNCTION outbox.trace_headers(
    headers     jsonb,
    traceparent text DEFAULT current_setting('outbox.traceparent', true),
    tracestate  text DEFAULT current_setting('outbox.tracestate', true)
) RETURNS jsonb
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
BEGIN
    IF trace_headers.traceparent IS NULL OR trace_headers.traceparent = ''
       OR coalesce(trace_headers.headers ? 'traceparent', false) THEN
        RETURN trace_headers.headers;
    END IF;
    IF NOT outbox.traceparent_valid(trace_headers.traceparent) THEN
        RAISE EXCEPTION 'invalid traceparent %', to_json(left(trace_headers.traceparent, 80))
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'a W3C traceparent: 00-<32 lowercase hex, not all 0>-<16 lowercase hex, not all 0>-<2 hex>';
    END IF;
    headers := coalesce(trace_headers.headers, '{}') || jsonb_build_object('traceparent', trace_headers.traceparent);
    IF trace_headers.tracestate <> '' AND NOT headers ? 'tracestate' THEN
        IF NOT outbox.tracestate_valid(trace_headers.tracestate) THEN
            RAISE EXCEPTION 'invalid tracestate %', to_json(left(trace_headers.tracestate, 80))
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'a W3C tracestate: up to 32 comma-separated key=value members, at most 512 bytes';
        END IF;
        headers := headers || jsonb_build_object('tracestate', trace_headers.tracestate);
    END IF;
    RETURN headers;
END
$$;

-- Raises 22023 unless value (an exchange or routing key) is NULL or valid.
-- Bad values are shown as JSON strings, so a control character in one
-- cannot break the message's line.
CREATE FUNCTION outbox.check_destination(what text, value text) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF value IS NOT NULL AND NOT outbox.destination_valid(value) THEN
        RAISE EXCEPTION 'invalid outbox % %', what, to_json(left(value, 60))
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'at most 255 bytes, without control characters';
    END IF;
END
$$;

-- One constraint, written out rather than through destination_valid():
-- PostgreSQL prepares every CHECK anew for each INSERT statement, and a
-- function call to inline costs that a few microseconds per enqueue(). A
-- row without a destination pays two IS NULL tests, also on every claim
-- and mark.
ALTER TABLE outbox.job
    ADD COLUMN exchange text,
    ADD COLUMN routing_key text,
    ADD CONSTRAINT job_destination_valid CHECK (
        (exchange IS NULL OR (octet_length(exchange) <= 255 AND exchange !~ '[\x01-\x1f\x7f]'))
        AND (routing_key IS NULL
             OR (octet_length(routing_key) <= 255 AND routing_key !~ '[\x01-\x1f\x7f]'))
    ) NOT VALID;

COMMENT ON COLUMN outbox.job.exchange IS 'AMQP exchange of this row; NULL: the relay''s --exchange';
COMMENT ON COLUMN outbox.job.routing_key IS
    'AMQP routing key / Redis stream suffix of this row; NULL: its queue';

-- enqueue() gains exchange and routing_key after ordering_key. The old
-- signature goes, so that no call is ambiguous; its grants (the role
-- script's REVOKE from PUBLIC, GRANT to outbox_producer) carry over.
ALTER FUNCTION outbox.enqueue(text, jsonb, text, jsonb, integer, timestamptz, integer, text)
    RENAME TO enqueue_before_004;

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
    IF enqueue.exchange IS NOT NULL OR enqueue.routing_key IS NOT NULL THEN
        PERFORM outbox.check_destination('exchange', enqueue.exchange),
                outbox.check_destination('routing key', enqueue.routing_key);
    END IF;
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

-- The old function's grants, on the new one: a revoked PUBLIC stays revoked.
DO $$
DECLARE
    old_acl aclitem[];
    grantee text;
BEGIN
    SELECT proacl INTO old_acl FROM pg_proc
    WHERE oid = 'outbox.enqueue_before_004(text, jsonb, text, jsonb, integer, timestamptz, integer, text)'::regprocedure;
    IF old_acl IS NULL THEN
        RETURN; -- default privileges: EXECUTE for PUBLIC, as the new function has
    END IF;
    REVOKE ALL ON FUNCTION outbox.enqueue(text, jsonb, text, jsonb, integer, timestamptz, integer,
                                          text, text, text) FROM PUBLIC;
    FOR grantee IN
        SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END
        FROM aclexplode(old_acl) AS a LEFT JOIN pg_roles AS r ON r.oid = a.grantee
        WHERE a.privilege_type = 'EXECUTE'
    LOOP
        EXECUTE 'GRANT EXECUTE ON FUNCTION outbox.enqueue(text, jsonb, text, jsonb, integer,'
                ' timestamptz, integer, text, text, text) TO ' || grantee;
    END LOOP;
END
$$;

DROP FUNCTION outbox.enqueue_before_004(text, jsonb, text, jsonb, integer, timestamptz, integer, text);
