-- shop: the database whose overview docs/console.png shows. Three queues with an hour of
-- traffic, rows held by two relays, dead rows, invoices paused with a backlog, and a stream.

-- an hour of published rows, more at the busy times
INSERT INTO outbox.job (queue, payload, state, attempts, created_at, finished_at)
SELECT queue, jsonb_build_object('n', n), 'succeeded', 1,
       now() - make_interval(mins => minute, secs => n * 60.0 / per_minute),
       now() - make_interval(mins => minute, secs => n * 60.0 / per_minute)
             + interval '150 milliseconds'
  FROM (VALUES ('orders', 4), ('emails', 2), ('webhooks', 1)) AS q (queue, rate),
       generate_series(0, 59) AS minute,
       LATERAL (SELECT round(rate * (6 + 3 * sin(minute / 9.0) + sin(minute / 2.3)))::int
                AS per_minute) AS m,
       generate_series(1, per_minute) AS n;

-- waiting to be published, the oldest a few seconds old
INSERT INTO outbox.job (queue, payload, ordering_key, created_at)
SELECT 'orders', jsonb_build_object('order_id', 81200 + n), 'customer-' || (n % 9),
       now() - make_interval(secs => n / 4.0)
  FROM generate_series(1, 14) AS n;
INSERT INTO outbox.job (queue, payload, created_at)
SELECT 'emails', jsonb_build_object('template', 'receipt', 'order_id', 81100 + n),
       now() - make_interval(secs => n)
  FROM generate_series(1, 5) AS n;

-- taken by the two relays
INSERT INTO outbox.job (queue, payload, state, attempts, worker_id, lease_until)
SELECT queue, '{}', 'running', 1, worker, now() + interval '25 seconds'
  FROM (VALUES ('orders', 'relay-7f3c'), ('orders', 'relay-7f3c'), ('orders', 'relay-a21e'),
               ('emails', 'relay-a21e')) AS r (queue, worker);

-- given up on
INSERT INTO outbox.job (queue, payload, state, attempts, max_attempts, created_at, finished_at,
                        last_error)
VALUES ('webhooks', '{"url": "https://partner.example/hooks"}', 'dead', 10, 10,
        now() - interval '52 minutes', now() - interval '9 minutes',
        'rejected: message of 1.4 MB exceeds the broker''s max.message.bytes (1 MB)'),
       ('webhooks', '{"url": "https://partner.example/hooks"}', 'dead', 10, 10,
        now() - interval '50 minutes', now() - interval '8 minutes',
        'rejected: message of 1.4 MB exceeds the broker''s max.message.bytes (1 MB)'),
       ('orders', '{"order_id": 80977}', 'dead', 10, 10, now() - interval '41 minutes',
        now() - interval '3 minutes', 'rejected: headers must be strings');

-- paused for the month's close, its rows piling up
INSERT INTO outbox.job (queue, payload, created_at, run_at)
SELECT 'invoices', jsonb_build_object('invoice', 'INV-' || (40310 + n)),
       now() - interval '18 minutes' + make_interval(secs => n * 17),
       now() - interval '18 minutes' + make_interval(secs => n * 17)
  FROM generate_series(1, 61) AS n;
INSERT INTO outbox.paused (queue, reason, paused_by, paused_at)
VALUES ('invoices', 'month-end close, resume after 18:00', 'ops', now() - interval '18 minutes');

-- a stream of two partitions, its cursors a few rows behind
SELECT outbox.stream_enable('inventory', 2);
SELECT outbox.enqueue('inventory', jsonb_build_object('sku', 'SKU-' || n),
                      ordering_key => 'warehouse-' || (n % 3))
  FROM generate_series(1, 9) AS n;
