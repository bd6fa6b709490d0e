"""producers.py - the torture run's producers and what they record for the checker.

A producer is a session on one database with a random generator of its own, drawn from
the run's seed. Each transaction it runs is one of the shapes applications use (single
rows, enqueue_batch, the C outbox_enqueue_many, savepoints rolled back, whole
transactions rolled back, a long transaction that takes its xid early and enqueues late,
rows scheduled a few seconds ahead (run_at),
PREPARE TRANSACTION then COMMIT or ROLLBACK PREPARED, idle in transaction, repeated
idempotency keys, payloads near and over the size limit, routing keys the broker must
refuse).

Every row's payload is {"u": token, "k": key, "n": counter, ...}: the token names the row
for the checker whatever message id the relay gives it. Producers come in two shapes.
A serialising one (the usual application) first increments its keys' counters in
torture.key_counter (row locks held to commit), so for one key the committed
transactions' counters rise in commit order: the checker expects a key's rows delivered
in (n, job_id) order. A late one enqueues first and takes the counters of its keys (keys
of its own, "<db>:L<i>") after, recording each row's counter in torture.key_order: only
the relay's own locks order its transactions (a stream queue's key lock, taken by the
insert and held to commit; in row-state mode nothing, and the checker holds the relay to
job_id order among rows committed before the later one went out).

A burst (set by a fault) makes a producer's next transaction one of 60-150 rows, so that
batches are full when the fault lands.

What the checker needs is recorded here: tokens committed (COMMIT returned), rolled back
(ROLLBACK, ROLLBACK TO SAVEPOINT, ROLLBACK PREPARED), uncertain (the connection died in
COMMIT: the table decides), and bad by construction (they may only end dead).
"""

import ctypes
import json
import random
import threading
import time

import psycopg2

KEYS_PER_DATABASE = 12
# A good row's retry budget. Every kill or stop of a relay holding a row costs it an attempt
# when its lease is reaped (as it must: a row that kills its relay is given up at its
# max_attempts), and the torture kills or stops a cell's relays every few seconds: at the
# default of 10 a row waiting through a long backlog was reaped ten times and died in a
# 20-minute run, the fault rate's doing, not a defect's. The checker prints the most
# attempts a good row took (paths most_attempts); a relay that burns attempts by itself
# still runs rows out of 50 and shows as 'dead'.
GOOD_MAX_ATTEMPTS = 50
BUSINESS_ROWS = 50
# over the relays' --max-message-bytes (1 MiB): dead at once; near it: published
NEAR_LIMIT_BYTES = 900_000
OVER_LIMIT_BYTES = 1_100_000
SETUP_SQL = """
CREATE SCHEMA IF NOT EXISTS torture;
CREATE TABLE IF NOT EXISTS torture.key_counter (key text PRIMARY KEY, n bigint NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS torture.business (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS torture.key_order (token text PRIMARY KEY, key text NOT NULL, n bigint NOT NULL);
INSERT INTO torture.business SELECT g FROM generate_series(1, %d) g ON CONFLICT DO NOTHING;
-- The transition log (the checker's fence and reap promises): every change of a row's state,
-- owner or finish, with the session that made it (each relay names its sessions) and when;
-- last_error only when this change wrote it (a reap writes 'lease expired ...').
CREATE TABLE IF NOT EXISTS torture.transition (
    seq bigserial PRIMARY KEY, job_id bigint NOT NULL, old_state text, new_state text,
    old_worker text, new_worker text, old_attempts int, new_attempts int,
    old_lease timestamptz, last_error text, actor text, at timestamptz NOT NULL);
CREATE OR REPLACE FUNCTION torture.log_transition() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO torture.transition (job_id, old_state, new_state, old_worker, old_attempts,
                                        new_attempts, old_lease, last_error, actor, at)
        VALUES (OLD.job_id, OLD.state, 'deleted', OLD.worker_id, OLD.attempts, OLD.attempts,
                OLD.lease_until, OLD.last_error, current_setting('application_name'), clock_timestamp());
        RETURN OLD;
    END IF;
    IF OLD.state IS DISTINCT FROM NEW.state OR OLD.worker_id IS DISTINCT FROM NEW.worker_id
       OR OLD.finished_at IS DISTINCT FROM NEW.finished_at THEN
        INSERT INTO torture.transition (job_id, old_state, new_state, old_worker, new_worker,
                                        old_attempts, new_attempts, old_lease, last_error, actor, at)
        VALUES (NEW.job_id, OLD.state, NEW.state, OLD.worker_id, NEW.worker_id, OLD.attempts,
                NEW.attempts, OLD.lease_until,
                CASE WHEN NEW.last_error IS DISTINCT FROM OLD.last_error THEN NEW.last_error END,
                current_setting('application_name'), clock_timestamp());
    END IF;
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS torture_transition ON outbox.job;
CREATE TRIGGER torture_transition AFTER UPDATE OR DELETE ON outbox.job
    FOR EACH ROW EXECUTE FUNCTION torture.log_transition();
""" % BUSINESS_ROWS


# prepared transactions their producers have finished: a restore may bring one back, its
# locks held with no one to finish it (histories.py rolls such ones back)
FINISHED_GIDS = set()
FINISHED_LOCK = threading.Lock()


class Record:
    """What one database's producers did, shared by its sessions."""

    def __init__(self):
        self.lock = threading.Lock()
        self.committed = set()
        self.rolled = {}  # token -> payload text, for the self-test's planted delivery
        self.uncertain = set()
        self.bad = set()
        self.idempotent = {}  # token -> (database, idempotency key): may name an earlier row
        self.transactions = 0
        self.kinds = {}
        # history faults (histories.py): when each row's COMMIT returned, and the windows of
        # commit times whose rows the database's history may have lost
        self.committed_at = {}
        self.windows = []

    def add(self, outcome, tokens, payloads=None):
        with self.lock:
            if outcome == "committed":
                self.committed.update(tokens)
                now = time.time()
                for token in tokens:
                    self.committed_at[token] = now
            elif outcome == "rolled":
                for token in tokens:
                    self.rolled[token] = (payloads or {}).get(token, "")
            else:
                self.uncertain.update(tokens)

    def count(self, kind):
        with self.lock:
            self.transactions += 1
            self.kinds[kind] = self.kinds.get(kind, 0) + 1


def query(url, sql, args=None, attempts=100):
    """Runs one statement in a session of its own (autocommit: ROLLBACK PREPARED may not run in
    a transaction block) and returns its rows, or None; retried every 0.2 s while the server
    cannot be reached (a fault restarting it, a history being replaced)."""
    for attempt in range(attempts):
        try:
            conn = psycopg2.connect(url, connect_timeout=5)
            conn.autocommit = True
            try:
                with conn.cursor() as cur:
                    cur.execute(sql, args)
                    return cur.fetchall() if cur.description else None
            finally:
                conn.close()
        except psycopg2.OperationalError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.2)


def setup_database(url, database_name):
    conn = psycopg2.connect(url)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(SETUP_SQL)
        for prefix in ("k", "L"):
            cur.execute("INSERT INTO torture.key_counter SELECT %s || ':' || %s || g FROM generate_series(1, %s) g "
                        "ON CONFLICT DO NOTHING", (database_name, prefix, KEYS_PER_DATABASE))
    conn.close()


class CLibrary:
    """outbox_enqueue_many() of lib/liboutbox.so on a psycopg2 connection's PGconn."""

    class Message(ctypes.Structure):
        _fields_ = [("queue", ctypes.c_char_p), ("payload_json", ctypes.c_char_p),
                    ("idempotency_key", ctypes.c_char_p), ("headers_json", ctypes.c_char_p),
                    ("ordering_key", ctypes.c_char_p), ("priority", ctypes.c_int32),
                    ("max_attempts", ctypes.c_int32), ("delay_seconds", ctypes.c_double),
                    ("exchange", ctypes.c_char_p), ("routing_key", ctypes.c_char_p),
                    ("traceparent", ctypes.c_char_p), ("tracestate", ctypes.c_char_p)]

    class Error(ctypes.Structure):
        _fields_ = [("code", ctypes.c_int), ("sqlstate", ctypes.c_char * 6),
                    ("message", ctypes.c_char * 512)]

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.outbox_enqueue_many.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                                 ctypes.c_void_p, ctypes.c_void_p]
        self.lib.outbox_enqueue_many.restype = ctypes.c_int

    def enqueue_many(self, conn, rows):
        messages = (self.Message * len(rows))()
        keep = []
        for slot, row in zip(messages, rows):
            fields = {name: (value.encode() if isinstance(value, str) else value)
                      for name, value in row.items()}
            keep.append(fields)
            slot.queue = fields["queue"]
            slot.payload_json = fields["payload"]
            slot.idempotency_key = fields.get("idempotency_key")
            slot.ordering_key = fields.get("ordering_key")
            slot.routing_key = fields.get("routing_key")
            slot.headers_json = fields.get("headers")
            slot.max_attempts = row.get("max_attempts") or GOOD_MAX_ATTEMPTS
            slot.delay_seconds = row.get("delay") or 0.0
        ids = (ctypes.c_int64 * len(rows))()
        error = self.Error()
        if self.lib.outbox_enqueue_many(ctypes.c_void_p(conn.pgconn_ptr), messages, len(rows),
                                        ids, ctypes.byref(error)) != 0:
            raise psycopg2.DatabaseError("outbox_enqueue_many: %s" % error.message.decode(errors="replace"))
        return list(ids)


class Producer(threading.Thread):
    """One session of one database, running random transactions until stopped."""

    def __init__(self, name, url, database_name, rng_seed, record, destination, clib, stop,
                 pace_seconds, late=False, asynchronous=False):
        super().__init__(name=name, daemon=True)
        self.late = late  # the second shape: counters taken after the enqueue
        self.asynchronous = asynchronous  # synchronous_commit = off: a crash may lose its last commits
        self.burst = threading.Event()
        self.url = url
        self.database = database_name
        self.rng = random.Random(rng_seed)
        self.record = record
        self.bad_routing_keys = destination.bad_routing_keys()
        self.bad_headers = destination.bad_headers()
        self.clib = clib
        self.stop = stop
        self.pace = pace_seconds
        self.conn = None
        self.serial = 0
        self.errors = 0

    # ---- rows

    def token(self):
        self.serial += 1
        return "%s.%s.%d" % (self.database, self.name, self.serial)

    def key(self):
        return "%s:%s%d" % (self.database, "L" if self.late else "k", self.rng.randint(1, KEYS_PER_DATABASE))

    def row(self, key, counters, size=0, bad=False):
        """A row of one key (or none): its payload carries the key's counter."""
        token = self.token()
        payload = {"u": token, "k": key, "n": counters.get(key)}
        if size:
            payload["pad"] = "x" * size
        row = {"queue": "tq", "payload": json.dumps(payload), "ordering_key": key, "token": token}
        if bad:
            row["max_attempts"] = 2
            if size == 0 and self.bad_headers and self.rng.random() < 0.3:
                row["headers"] = json.dumps(self.rng.choice(self.bad_headers))
            elif size == 0:
                row["routing_key"] = self.rng.choice(self.bad_routing_keys)
            with self.record.lock:
                self.record.bad.add(token)
        elif self.rng.random() < 0.1:
            row["idempotency_key"] = "idem-%d" % self.rng.randint(1, 40)
            with self.record.lock:
                self.record.idempotent[token] = (self.database.rsplit("_", 1)[-1], row["idempotency_key"])
        return row

    # ---- statements

    def count_late(self, cur, rows):
        """The late shape: each key's counter taken after the enqueue, once per transaction
        (its rows go in job_id order within it), and recorded for each of its rows."""
        for key in sorted({r["ordering_key"] for r in rows if r.get("ordering_key")}):
            tokens = [r["token"] for r in rows if r.get("ordering_key") == key]
            cur.execute("WITH n AS (UPDATE torture.key_counter SET n = n + 1 WHERE key = %s RETURNING n)"
                        " INSERT INTO torture.key_order SELECT t, %s, n FROM n, unnest(%s::text[]) AS t",
                        (key, key, tokens))

    def lock_keys(self, cur, keys):
        """Increments each key's counter (sorted: no deadlock); the row locks order commits."""
        counters = {}
        for key in sorted(k for k in set(keys) if k):
            cur.execute("UPDATE torture.key_counter SET n = n + 1 WHERE key = %s RETURNING n", (key,))
            counters[key] = cur.fetchone()[0]
        return counters

    def enqueue(self, cur, rows, how):
        if how == "single" or len(rows) == 1:
            for row in rows:
                cur.execute("SELECT outbox.enqueue(%s, %s::jsonb, idempotency_key => %s, ordering_key => %s,"
                            " routing_key => %s, max_attempts => %s, headers => %s::jsonb,"
                            " run_at => now() + make_interval(secs => %s))",
                            (row["queue"], row["payload"], row.get("idempotency_key"), row.get("ordering_key"),
                             row.get("routing_key"), row.get("max_attempts") or GOOD_MAX_ATTEMPTS, row.get("headers") or "{}",
                             row.get("delay") or 0))
        elif how == "batch" and not any(r.get("routing_key") or r.get("max_attempts") or r.get("headers")
                                        or r.get("delay") for r in rows):
            cur.execute("SELECT outbox.enqueue_batch('tq', %s::jsonb[], %s::text[], %s::text[],"
                        " max_attempts => %s)",
                        ([r["payload"] for r in rows], [r.get("idempotency_key") for r in rows],
                         [r.get("ordering_key") for r in rows], GOOD_MAX_ATTEMPTS))
        elif self.clib is not None:
            self.clib.enqueue_many(self.conn, rows)
        else:
            self.enqueue(cur, rows, "single")

    def keys(self, count):
        """The ordering keys of count rows: most keyed, some not."""
        return [self.key() if self.rng.random() < 0.8 else None for _ in range(count)]

    # ---- transactions

    def transaction(self):
        rng = self.rng
        kind = rng.choices(["single", "batch", "many", "rollback", "savepoint", "early_xid", "prepared",
                            "idle", "bad", "big", "delayed"],
                           weights=[30, 12, 8, 6, 8, 10, 5, 2, 4, 1, 5])[0]
        if self.burst.is_set():
            self.burst.clear()
            kind = "burst"
        self.record.count(kind)
        cur = self.conn.cursor()
        if kind == "idle":
            cur.execute("SELECT pg_current_xact_id()")
            self.sleep(rng.uniform(0.5, 2.0))
            self.commit([])
            return
        if kind == "early_xid":
            cur.execute("UPDATE torture.business SET v = v + 1 WHERE id = %s", (rng.randint(1, BUSINESS_ROWS),))
            self.sleep(rng.uniform(0.2, 1.5))
        sizes = {"batch": (2, 8), "many": (2, 8), "burst": (60, 150)}
        keys = self.keys(rng.randint(*sizes.get(kind, (1, 2))))
        if self.late:
            keys = sorted(keys, key=lambda k: k or "")  # the stream trigger's key locks in one order
        counters = {} if self.late else self.lock_keys(cur, keys)
        rows = [self.row(key, counters) for key in keys]
        if kind == "bad":
            rows.append(self.row(rng.choice([None, keys[0]]), counters, bad=True))
        if kind == "delayed":  # a scheduled row: run_at a few seconds ahead
            for row in rows:
                row["delay"] = rng.uniform(0.5, 4.0)
        if kind == "big":
            size = rng.choice([NEAR_LIMIT_BYTES, OVER_LIMIT_BYTES])
            rows.append(self.row(None, counters, size=size, bad=size == OVER_LIMIT_BYTES))
        tokens = [row["token"] for row in rows]
        payloads = {row["token"]: row["payload"] for row in rows}
        if kind == "savepoint":
            self.enqueue(cur, rows, "single")
            if self.late:
                self.count_late(cur, rows)
            cur.execute("SAVEPOINT s")
            extra = [self.row(key, counters) for key in keys]
            self.enqueue(cur, extra, "single")
            if self.late:
                self.count_late(cur, extra)
            cur.execute("ROLLBACK TO SAVEPOINT s")
            self.record.add("rolled", [r["token"] for r in extra], {r["token"]: r["payload"] for r in extra})
            self.commit(tokens)
            return
        self.enqueue(cur, rows, {"batch": "batch", "many": "many", "burst": "batch"}.get(kind, "single"))
        if self.late:
            self.count_late(cur, rows)
        if kind == "rollback":
            self.conn.rollback()
            self.record.add("rolled", tokens, payloads)
        elif kind == "prepared":
            self.prepared(cur, tokens, payloads)
        else:
            self.commit(tokens)

    def prepared(self, cur, tokens, payloads):
        # the cluster's: a producer of every database is p0, and settle_prepared() rolls back
        # a prepared transaction whose gid a finished one had
        gid = "torture-%s-%s-%d" % (self.database, self.name, self.serial)
        commit = self.rng.random() < 0.6
        cur.execute("PREPARE TRANSACTION %s", (gid,))
        self.conn.commit()  # psycopg2: ends its own transaction block; the PREPARE already ended ours
        self.sleep(self.rng.uniform(0.1, 1.0))
        statement = "COMMIT PREPARED %s" if commit else "ROLLBACK PREPARED %s"
        self.conn.autocommit = True
        answered = False
        try:
            for _ in range(100):  # the server may be restarting: the prepared transaction survives it
                try:
                    self.conn.cursor().execute(statement, (gid,))
                    answered = True
                    break
                except psycopg2.OperationalError:
                    self.reconnect()
                    self.conn.autocommit = True
                except psycopg2.ProgrammingError:
                    break  # already finished, or gone with a history (a restore, a dropped database)
            # unanswered (still prepared, or finished unseen, or gone): the table decides
            outcome = "committed" if answered else "uncertain"
            self.record.add(outcome if commit else "rolled", tokens, payloads)
        finally:
            self.conn.autocommit = False
            with FINISHED_LOCK:
                FINISHED_GIDS.add(gid)

    def commit(self, tokens):
        try:
            self.conn.commit()
        except psycopg2.OperationalError:
            self.record.add("uncertain", tokens)
            raise
        self.record.add("committed", tokens)

    # ---- the session

    def sleep(self, seconds):
        self.stop.wait(seconds)

    def reconnect(self):
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:
                pass
        self.conn = None
        for _ in range(600):
            try:
                self.conn = psycopg2.connect(self.url, connect_timeout=5)
                with self.conn.cursor() as cur:
                    # no wait without end: a lock of a transaction a restore brought back
                    cur.execute("SET lock_timeout = '30s'")
                    if self.asynchronous:
                        cur.execute("SET synchronous_commit = off")
                self.conn.commit()
                return
            except psycopg2.OperationalError:
                time.sleep(0.1)
        raise RuntimeError("%s: the database stayed unreachable" % self.name)

    def run(self):
        self.reconnect()
        while not self.stop.is_set():
            try:
                self.transaction()
            except (psycopg2.OperationalError, psycopg2.InterfaceError):
                self.errors += 1
                self.reconnect()
            except psycopg2.DatabaseError:
                # a refused statement (a deadlock, a serialization failure): nothing committed
                self.errors += 1
                try:
                    self.conn.rollback()
                except Exception:
                    self.reconnect()
            self.sleep(self.rng.uniform(0, self.pace))
        try:
            self.conn.close()
        except Exception:
            pass
