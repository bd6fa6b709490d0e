#!/usr/bin/python3
"""torture.py - a permanent adversary: randomized histories and faults, an independent checker.

    torture.py            (the settings come from the environment)

    TORTURE_SECONDS   length of the history with faults (default 600)
    TORTURE_SEED      the seed (default random); everything random derives from it
    TORTURE_BROKERS   amqp,redis,nats,kafka (default all)
    TORTURE_MODES     row,stream (default both)
    TORTURE_SELFTEST  1: plant one violation of every kind the checker reports in the
                      observed history; the checker must name each (exit non-zero)
    TORTURE_FAULTS    only these faults (names of faults.FAULTS, comma-separated)
    TORTURE_BATCH_SIZE the relays' --batch-size (default 50)
    TORTURE_RELAY     the relay binary (default $BIN/outbox-relay): the mutation gate runs
                      build-mutants/bin/outbox-relay with OUTBOX_MUTANT set
    TORTURE_LEASES    the leases of each database's two relays, in seconds (5,8)
    TORTURE_TAG       a prefix of this run's database and broker names (runs side by side)
    TORTURE_METRICS_WAIT seconds to wait for /metrics to agree with the table (30; 0: not
                      compared)
    TORTURE_DRAIN     seconds the relays get after the faults to deliver everything (120)
    TORTURE_DATABASES databases per destination, 1 or 2 (default 2)
    TORTURE_ID_FORM   job or database: every database on that older message id form (the
                      history faults' teeth: ids reused across histories must be reported)
    TORTURE_CLOUDEVENTS off, binary or structured: the relays' --cloudevents (default off);
                      the checker reads a structured event's data as the row's payload and
                      holds its id to the message id

History faults (histories.py: a copy, restore, promotion, dump restored twice, lost
asynchronous commits, a TEMPLATE copy) are drawn like the faults (TORTURE_FAULTS names
them too), one per 90 s of history and at least one; they need a PostgreSQL of the run's
own, started in the run's directory when the stack is the suite's.
    TORTURE_RELAYS    url: each relay serves one database (--database-url); list: the
                      cell's relays serve its databases from a list (--databases, a budget
                      of 4 connections, the list edited under them as a fault); mixed
                      (default): each cell draws one of the two from the seed

Each broker x mode is a cell: two databases (a and b), each with two relays of different
leases (or two relays of different leases serving both from a list), and producers, all
publishing into one destination of the broker. All cells run
at once against one stack (tests/harness/stack.sh: the suite's, from OUTBOX_TEST_STACK_DIR,
or one started here), under one fault schedule. After TORTURE_SECONDS the producers stop,
the faults undo themselves, and the relays drain; then the checker reads each destination
with its own consumer and the tables, and judges (checker.py).

Each relay names its database sessions (application_name) after itself, so that the
transition log every torture database keeps (producers.SETUP_SQL) tells who moved a row.
Per cell, the paths the faults exercised are counted and printed (rows reaped, claimed
again, published again, kept from a second append by the dedup, replayed; duplicates).

The last line is exactly `torture: seed=<S> rows=<N> violations=<V>`; exit 0 only with 0.
"""

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import psycopg2  # noqa: E402

import brokers  # noqa: E402
import checker  # noqa: E402
import faults  # noqa: E402
import histories  # noqa: E402
import producers  # noqa: E402

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
STACK = os.path.join(SOURCE_DIR, "tests", "harness", "stack.sh")
LEASES = [5, 8]
HISTORY_TAIL_SECONDS = 4


def log(text):
    print("torture: %s" % text, flush=True)


def named_url(url, application_name):
    """url with its sessions named application_name (the transition log's actor)."""
    return "%s%sapplication_name=%s" % (url, "&" if "?" in url else "?", application_name)


def list_relay_name(cell, index):
    return "%s-list-%d" % (cell.slug, index)


class Database:
    def __init__(self, run, cell, letter, copy_of=None):
        self.name = "%s_%s" % (cell.slug, letter)
        self.letter = letter
        base = run.env["OUTBOX_TEST_PG_URL"].rsplit("/", 1)[0]
        self.url = "%s/tt_%s" % (base, self.name)
        self.copy_of = copy_of
        if copy_of is not None:  # a TEMPLATE copy made by a history fault: its identity too
            producers.setup_database(self.url, self.name)
            self.record = producers.Record()
            return
        admin = psycopg2.connect(run.env["OUTBOX_TEST_PG_URL"])
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute("DROP DATABASE IF EXISTS tt_%s WITH (FORCE)" % self.name)
            cur.execute("CREATE DATABASE tt_%s TEMPLATE %s" % (self.name, run.env["OUTBOX_TEST_TEMPLATE_DB"]))
        admin.close()
        producers.setup_database(self.url, self.name)
        self.record = producers.Record()
        # a copy of the template keeps the template's identity: each database gets its own, as
        # the README asks of a copy that publishes beside its original
        try:
            run.outboxctl(self, "identity", "set", "--database-id", "%012x" % run.rng.getrandbits(48))
        except RuntimeError as error:
            if "unknown command" not in str(error):
                raise
            log("%s: outboxctl has no identity command (a release before database identities)" % self.name)
        if run.id_form:  # an older form of message id (the history faults' self-check)
            run.outboxctl(self, "identity", "set", "--id-form", run.id_form)

    def connect(self):
        return psycopg2.connect(self.url, connect_timeout=5)

    def query(self, sql, args=None):
        return producers.query(self.url, sql, args)


class Cell:
    def __init__(self, run, broker, mode):
        self.broker, self.mode = broker, mode
        self.name = "%s/%s" % (broker, mode)
        self.slug = "%s%s_%s" % (run.tag, broker, mode)
        self.relay_count = len(run.leases)  # a list file per relay of a list
        self.destination = brokers.DESTINATIONS[broker](self.slug, run.env)
        self.databases = [Database(run, self, letter) for letter in "ab"[:run.database_count]]
        self.replayed = set()
        self.replay_counts = Counter()  # replays asked per token (a restore may forget some)
        self.copied_keys = set()  # (letter, idempotency key) of rows a TEMPLATE copy inherited
        self.pauses = []  # (database letter, from, to): windows when nothing of it may go out
        form = run.relay_form if run.relay_form != "mixed" else run.rng.choice(["url", "list"])
        self.list_path = None
        self.list_lock = threading.Lock()
        if form == "list":
            # one list per relay, each naming its sessions (application_name) after the relay
            self.list_path = os.path.join(run.work, self.slug + ".list")
            self.write_list(self.databases)
        if mode == "stream":
            for database in self.databases:
                run.outboxctl(database, "stream", "enable", "tq", "--partitions",
                              str(run.rng.randint(1, 4)))


    def write_list(self, databases, extra=()):
        """The cell's lists as an operator writes them: in place, not renamed into place; extra:
        (name, url) lines of other databases after the cell's."""
        for index in range(self.relay_count):
            with open("%s.%d" % (self.list_path, index), "w") as out:
                out.write("# torture cell %s\n" % self.name)
                for database in databases:
                    out.write("%s %s\n" % (database.name, named_url(database.url, list_relay_name(self, index))))
                for name, url in extra:
                    out.write("%s %s\n" % (name, url))


class Relay:
    """A relay of one database, or of the cell's list when database is None."""

    def __init__(self, run, cell, database, lease, index):
        self.run_, self.lease, self.cell = run, lease, cell
        self.name = "%s-%s-%d" % (cell.slug, database.letter, index) if database else list_relay_name(cell, index)
        self.metrics_port = run.free_port()
        if database:
            serves = ["--database-url", named_url(database.url, self.name)]
        else:
            serves = ["--databases", "%s.%d" % (cell.list_path, index), "--max-db-connections", "4"]
        self.args = [run.relay_binary] + serves + [
                     "--lease", str(lease), "--concurrency", "2", "--batch-size", str(run.batch_size),
                     "--poll-interval", "50ms", "--retry-base", "200ms", "--retry-max", "1s",
                     "--retention", "0", "--max-message-bytes", "1048576",
                     "--metrics-addr", "127.0.0.1:%d" % self.metrics_port,
                     "--cloudevents", run.cloudevents]
        self.args += cell.destination.relay_args()
        self.database = database
        self.process = None
        self.lock = threading.Lock()
        self.log_path = os.path.join(run.work, self.name + ".log")

    def start(self):
        with self.lock:
            # two faults on one relay at once (kill, then start) would start it twice and
            # lose track of the first process, left running after the run
            if self.process is not None and self.process.poll() is None:
                return
            out = open(self.log_path, "a")
            self.process = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT)
            out.close()

    def signal(self, number):
        with self.lock:
            if self.process is not None and self.process.poll() is None:
                self.process.send_signal(number)

    def kill(self):
        self.signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait()

    def pause(self):
        self.signal(signal.SIGSTOP)

    def resume(self):
        self.signal(signal.SIGCONT)

    def ensure_running(self):
        self.resume()
        if self.process is None or self.process.poll() is not None:
            self.start()

    def stop(self):
        self.resume()
        self.signal(signal.SIGTERM)
        if self.process is not None:
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def metrics(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.metrics_port, timeout=5) as page:
            return page.read().decode()


class Run:
    def __init__(self):
        self.seed = os.environ.get("TORTURE_SEED") or str(random.SystemRandom().randrange(1, 10**9))
        log("seed=%s" % self.seed)
        self.rng = random.Random("run-%s" % self.seed)
        self.seconds = float(os.environ.get("TORTURE_SECONDS", "600"))
        self.drain = float(os.environ.get("TORTURE_DRAIN", "120"))
        self.selftest = os.environ.get("TORTURE_SELFTEST") == "1"
        # two databases publish into each destination; 1 isolates a single database's promises
        self.database_count = int(os.environ.get("TORTURE_DATABASES", "2"))
        self.broker_names = [b for b in os.environ.get("TORTURE_BROKERS", "amqp,redis,nats,kafka").split(",") if b]
        self.modes = [m for m in os.environ.get("TORTURE_MODES", "row,stream").split(",") if m]
        self.relay_form = os.environ.get("TORTURE_RELAYS", "mixed")
        self.cloudevents = os.environ.get("TORTURE_CLOUDEVENTS", "off")
        self.batch_size = int(os.environ.get("TORTURE_BATCH_SIZE", "50"))
        self.metrics_wait = int(os.environ.get("TORTURE_METRICS_WAIT", "30"))
        # names this run's databases and broker objects apart from another run's on the stack
        self.tag = re.sub(r"[^a-z0-9]", "", os.environ.get("TORTURE_TAG", "").lower())
        self.tag += "_" if self.tag else ""
        self.leases = [int(x) for x in os.environ.get("TORTURE_LEASES", ",".join(map(str, LEASES))).split(",")]
        self.pause_grace = 0.05 + 1.0 + 0.5  # --poll-interval + 1 s (docs), and a margin
        if self.relay_form not in ("url", "list", "mixed"):
            sys.exit("torture: unknown TORTURE_RELAYS %r (url, list, mixed)" % self.relay_form)
        if self.cloudevents not in ("off", "binary", "structured"):
            sys.exit("torture: unknown TORTURE_CLOUDEVENTS %r (off, binary, structured)" % self.cloudevents)
        for name in self.broker_names:
            if name not in brokers.DESTINATIONS:
                sys.exit("torture: unknown broker %r in TORTURE_BROKERS (amqp, redis, nats, kafka)" % name)
        for mode in self.modes:
            if mode not in ("row", "stream"):
                sys.exit("torture: unknown mode %r in TORTURE_MODES (row, stream)" % mode)
        self.bin = os.path.abspath(os.environ.get("BIN", os.path.join(SOURCE_DIR, "bin")))
        self.lib = os.path.abspath(os.environ.get("LIB", os.path.join(SOURCE_DIR, "lib")))
        self.relay_binary = os.path.abspath(os.environ.get("TORTURE_RELAY") or os.path.join(self.bin, "outbox-relay"))
        self.work = tempfile.mkdtemp(prefix="torture.")
        os.chmod(self.work, 0o755)  # the servers run as their own users
        self.own_stack = None
        self.cluster = None  # the torture's own PostgreSQL, for the history faults
        self.pg_stack_dir = None
        self.id_form = os.environ.get("TORTURE_ID_FORM", "")
        self.cells, self.relays, self.producers = [], [], []
        self.used_ports = set()

    # ---- the stack

    def start_stack(self):
        stack_dir = os.environ.get("OUTBOX_TEST_STACK_DIR")
        if not stack_dir:
            stack_dir = os.path.join(self.work, "stack")
            services = ["postgres"] + sorted({brokers.SERVICE[b] for b in self.broker_names})
            log("starting %s" % " ".join(services))
            subprocess.run([STACK, "start", stack_dir] + services, check=True)
            self.own_stack = stack_dir
        self.stack_dir = self.pg_stack_dir = stack_dir
        self.env = read_env(stack_dir)
        if faults.history_faults_wanted():
            # the history faults replace the cluster under the databases: one of the run's own,
            # never the suite's (its other databases are not the torture's to roll back)
            if not self.own_stack:
                self.pg_stack_dir = os.path.join(self.work, "pg")
                log("starting a PostgreSQL of its own for the history faults")
                subprocess.run([STACK, "start", self.pg_stack_dir, "postgres"], check=True,
                               stdout=subprocess.DEVNULL)
                self.env.update({k: v for k, v in read_env(self.pg_stack_dir).items()
                                 if k.startswith("OUTBOX_TEST_PG") or k == "OUTBOX_TEST_TEMPLATE_DB"})
            self.cluster = histories.Cluster(self.pg_stack_dir, self.env["OUTBOX_TEST_PG_PORT"])
            self.cluster.prepare()

    def stack(self, command, service):
        where = self.pg_stack_dir if service == "postgres" else self.stack_dir
        result = faults.run_quietly([STACK, command, where, service], timeout=180)
        if result.returncode != 0:
            raise RuntimeError("stack.sh %s %s: %s" % (command, service, result.stdout.strip()[-300:]))

    def service_of(self, broker):
        return brokers.SERVICE[broker]

    def brokers(self):
        return self.broker_names

    def free_port(self):
        import socket

        low, _, high = os.environ.get("OUTBOX_TEST_PORT_RANGE", "20000-32000").partition("-")
        # not from the run's generator: a port taken by another run must not shift the seed's draws
        ports = random.Random()
        while True:
            port = ports.randint(int(low), int(high))
            if port in self.used_ports:
                continue
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    continue
            self.used_ports.add(port)
            return port

    def outboxctl(self, database, *args):
        result = faults.run_quietly([os.path.join(self.bin, "outboxctl"), "--database-url", database.url]
                                    + list(args))
        if result.returncode != 0:
            raise RuntimeError("outboxctl %s: %s" % (" ".join(args), result.stdout.strip()[-300:]))
        return result.stdout

    def outboxctl_until_done(self, database, *args, seconds=90, done_if=None):
        """outboxctl for a fault's undo: retried while the server restarts, since an undo that
        failed would leave the queue paused (or no stream) and its rows waiting to the end; an
        error saying done_if means the state the undo wanted is there already."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                return self.outboxctl(database, *args)
            except RuntimeError as error:
                if done_if is not None and done_if in str(error):
                    log("%s: %s" % (args[0], str(error).splitlines()[-1]))
                    return ""
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    # ---- the history

    def setup(self):
        for broker in self.broker_names:
            for mode in self.modes:
                self.cells.append(Cell(self, broker, mode))
        self.stop_producers = threading.Event()
        clib_path = os.path.join(self.lib, "liboutbox.so")
        clib = None
        if not os.path.exists(clib_path):
            log("no %s: the producers use the SQL functions only" % clib_path)
        elif "libasan" in subprocess.run(["ldd", clib_path], stdout=subprocess.PIPE, text=True).stdout:
            # a sanitizer's runtime must be the first library of the process: not in python
            log("%s is built with AddressSanitizer: the producers use the SQL functions only" % clib_path)
        else:
            clib = producers.CLibrary(clib_path)
        self.clib = clib
        for cell in self.cells:
            if cell.list_path:
                log("cell %s: its relays serve its databases from a list" % cell.name)
                for index, lease in enumerate(self.leases):
                    self.relays.append(Relay(self, cell, None, lease, index))
            for database in cell.databases:
                if not cell.list_path:
                    for index, lease in enumerate(self.leases):
                        self.relays.append(Relay(self, cell, database, lease, index))
                self.producers += self.producers_of(cell, database)

    def producers_of(self, cell, database):
        sessions = int(os.environ.get("TORTURE_SESSIONS", "2"))
        # the draws leave the tag out: a run of the mutation gate (tagged) writes what the
        # untagged replay of its seed writes
        untagged = database.name[len(self.tag):] if database.name.startswith(self.tag) else database.name
        # with history faults, some sessions commit asynchronously (their own generator: the
        # seed's other draws stay as they were)
        asynchronous = random.Random("async-%s-%s" % (self.seed, untagged))
        return [producers.Producer(
                "p%d" % session, database.url, database.name,
                "%s-%s-%d" % (self.seed, untagged, session), database.record,
                cell.destination, self.clib, self.stop_producers, 0.05, late=session % 2 == 1,
                asynchronous=self.cluster is not None and asynchronous.random() < 0.5)
                for session in range(sessions)]

    def add_copy(self, cell, original, letter):
        """A TEMPLATE copy of original (made by a history fault) listed beside it in the cell's
        lists, with producers of its own."""
        copy = Database(self, cell, letter, copy_of=original)
        with cell.list_lock:
            cell.databases.append(copy)
            cell.write_list(cell.databases)
        started = self.producers_of(cell, copy)
        self.producers += started
        for producer in started:
            producer.start()

    def history(self):
        for relay in self.relays:
            relay.start()
        for producer in self.producers:
            producer.start()
        schedule = faults.Schedule(self, self.seed, log)
        schedule.start()
        time.sleep(self.seconds)
        if schedule.wait_histories():
            # rows committed after the last split: every one must arrive
            time.sleep(HISTORY_TAIL_SECONDS)
        log("history done; stopping producers and faults")
        self.stop_producers.set()
        for producer in self.producers:
            producer.join(60)
        schedule.finish()
        for producer in self.producers:  # a copy's, started by a fault meanwhile
            producer.join(60)
        log("faults applied: %s" % ", ".join("%s=%d" % kv for kv in sorted(schedule.done.items())))
        if schedule.skipped:
            log("faults skipped (their turn came after the history): %s"
                % ", ".join("%s=%d" % kv for kv in sorted(schedule.skipped.items())))
        self.rollback_leftover_prepared()

    def rollback_leftover_prepared(self):
        for cell in self.cells:
            for database in cell.databases:
                for (gid,) in database.query("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"):
                    database.query("ROLLBACK PREPARED %s", (gid,))

    # ---- drain and observe

    def observe(self, cell):
        rows = {}
        for database in cell.databases:
            result = database.query("""
                SELECT j.job_id, j.state, j.payload->>'u', j.last_error, j.idempotency_key,
                       CASE WHEN j.state = 'stream'
                            THEN (j.xid, j.job_id) <= (c.cursor_xid, c.cursor_job_id) END,
                       j.payload::text, j.headers::text, extract(epoch FROM j.run_at)::float8,
                       j.replays, j.attempts, j.message_uid::text
                  FROM outbox.job AS j
                  LEFT JOIN outbox.stream_cursor AS c ON c.queue = j.queue AND c.partition = j.stream_partition
                 WHERE j.queue = 'tq'""")
            late = dict(database.query("SELECT token, n FROM torture.key_order"))
            for (job_id, state, token, error, idempotency_key, published, payload, headers, run_at,
                 replays, attempts, message_uid) in result:
                if token in rows:
                    # a TEMPLATE copy's row of its original: the original's stands; its
                    # idempotency key is the copy's too
                    cell.copied_keys.add((database.letter, idempotency_key))
                    continue
                rows[token] = {"db": database.letter, "job_id": job_id, "state": state,
                               "published": published, "error": error,
                               "idempotency_key": idempotency_key, "payload": json.loads(payload),
                               "headers": json.loads(headers), "run_at": run_at, "replays": replays,
                               "attempts": attempts, "late": late.get(token),
                               "message_uid": message_uid}
        return rows

    def transitions(self, cell):
        """The transition log of the cell's databases, oldest first per database."""
        log_rows = []
        for database in cell.databases:
            result = database.query("""
                SELECT t.seq, t.job_id, t.old_state, t.new_state, t.old_worker, t.new_worker,
                       t.old_attempts, t.new_attempts, extract(epoch FROM t.old_lease)::float8,
                       t.last_error, t.actor, extract(epoch FROM t.at)::float8, j.payload->>'u'
                  FROM torture.transition AS t LEFT JOIN outbox.job AS j USING (job_id)
                 ORDER BY t.seq""")
            for row in result:
                log_rows.append(dict(zip(checker.TRANSITION_FIELDS, row), db=database.letter))
        return log_rows

    def waiting(self, cell):
        """Committed good rows not delivered yet, and bad rows not yet dead."""
        observed = self.history_of(cell, [])
        delivered = {p["u"] for p in map(checker.parse, observed["deliveries"]) if p}
        rows = observed["rows"]
        missing = len(checker.expected(observed) - delivered)
        missing += sum(1 for token in observed["bad"] if token in rows and rows[token]["state"] != "dead")
        # what the relays may still change: rows not finished, stream rows ahead of their cursor
        unfinished = sum(1 for row in rows.values()
                         if row["state"] in ("ready", "running") or
                         (row["state"] == "stream" and not row["published"]))
        return missing, unfinished

    PORTS = {"postgres": "OUTBOX_TEST_PG_PORT", "rabbitmq": "OUTBOX_TEST_AMQP_PORT",
             "redis": "OUTBOX_TEST_REDIS_PORT", "nats": "OUTBOX_TEST_NATS_PORT",
             "kafka": "OUTBOX_TEST_KAFKA_PORT"}

    def ensure_servers(self):
        """Starts again a server a fault left down (its restart timed out on a loaded host)."""
        import socket

        for service in ["postgres"] + sorted({brokers.SERVICE[b] for b in self.broker_names}):
            try:
                socket.create_connection(("127.0.0.1", int(self.env[self.PORTS[service]])), 2).close()
            except OSError:
                log("%s is down after the faults: starting it" % service)
                try:
                    self.stack("start-service", service)
                except Exception as error:
                    log("unable to start %s: %s" % (service, error))

    def drain_all(self):
        self.ensure_servers()
        for relay in self.relays:
            relay.ensure_running()
        deadline = time.monotonic() + self.drain
        pending = {cell.name: None for cell in self.cells}
        settled = 0
        while time.monotonic() < deadline:
            before = dict(pending)
            for cell in self.cells:
                try:
                    pending[cell.name] = self.waiting(cell)
                except Exception as error:
                    pending[cell.name] = "unreadable (%s)" % error
            if all(value == (0, 0) for value in pending.values()):
                return
            if any(isinstance(value, str) for value in pending.values()):
                self.ensure_servers()
            # nothing left for the relays to do and nothing moved for three looks: what is
            # missing will stay missing (a planted defect's lost rows end the run early)
            quiet = all(isinstance(value, tuple) and value[1] == 0 for value in pending.values())
            settled = settled + 1 if quiet and pending == before else 0
            if settled >= 3:
                log("drain: nothing left for the relays to do, still missing: %s" % pending)
                return
            time.sleep(2)
        log("drain: still waiting after %.0f s: %s" % (self.drain, pending))

    def counts(self, cell):
        """(what, table, reported) triples for `outboxctl status` and each database's /metrics."""
        triples = []
        for database in cell.databases:
            table = dict(database.query("""
                SELECT s, count(j.job_id) FROM unnest(ARRAY['ready','running','succeeded','dead']) s
                LEFT JOIN outbox.job j ON j.state = s AND j.queue = 'tq' GROUP BY s"""))
            status = json.loads(self.outboxctl(database, "status", "--json"))
            queue = next((q for q in status["queues"] if q["queue"] == "tq"), {})
            for state in ("ready", "running", "succeeded", "dead"):
                triples.append(("db %s status %s" % (database.letter, state), table[state], queue.get(state)))
            relay = next((r for r in self.relays if r.database is database), None)
            if relay is None or self.metrics_wait == 0:
                continue  # a relay of a list samples no table gauges (docs/databases.md)
            got = (None, None)
            for _ in range(self.metrics_wait):  # the gauges are sampled every few seconds
                metrics = relay.metrics()
                got = (gauge(metrics, "outbox_ready_rows", "tq"), gauge(metrics, "outbox_succeeded_rows"))
                if got == (table["ready"], table["succeeded"]):
                    break
                time.sleep(1)
            triples.append(("db %s /metrics outbox_ready_rows" % database.letter, table["ready"], got[0]))
            triples.append(("db %s /metrics outbox_succeeded_rows" % database.letter, table["succeeded"],
                            got[1]))
        return triples

    def judge(self):
        total_rows, total_violations, lines = 0, 0, []
        for cell in self.cells:
            try:
                counts = self.counts(cell)
                observed = self.history_of(cell, counts)
            except Exception as error:  # a destination or database that cannot be read is no pass
                total_violations += 1
                print("cell %-14s unreadable: %s" % (cell.name, error), flush=True)
                continue
            planted = []
            if self.selftest:
                planted = checker.plant(observed, random.Random("plant-%s" % self.seed))
            result, violations, summary = checker.check(observed)
            total_rows += summary["committed"]
            total_violations += sum(result.values())
            lines += violations
            print("cell %-14s committed=%d delivered=%d %s" % (
                cell.name, summary["committed"], summary["delivered"],
                " ".join("%s=%d" % (p, result[p]) for p in checker.PROMISES)), flush=True)
            paths = summary["paths"]
            print("paths %-13s %s%s" % (cell.name, " ".join("%s=%s" % kv for kv in paths.items()),
                  "" if any(paths[p] for p in checker.WINDOW_PATHS) or cell.mode == "stream" else
                  "  (no row was in flight when a fault hit: the reap and re-publish paths never ran)"),
                  flush=True)
            if self.selftest:
                missed = [name for name in planted if result[name] == 0]
                print("selftest %s planted %s; %s" % (cell.name, ",".join(planted),
                      "all reported" if not missed else "NOT REPORTED: " + ",".join(missed)))
        for line in lines:
            print(line)
        self.report_mutants()
        if total_violations:
            self.explain_waiting()
            print("replay with: TORTURE_SEED=%s TORTURE_SECONDS=%g TORTURE_BROKERS=%s TORTURE_MODES=%s make torture"
                  % (self.seed, self.seconds, ",".join(self.broker_names), ",".join(self.modes)))
        return total_rows, total_violations

    def report_mutants(self):
        """The planted defects the relays' logs say fired (the mutation gate's evidence)."""
        fired, broken = {}, set()
        for relay in self.relays:
            try:
                with open(relay.log_path) as log_file:
                    text = log_file.read()
            except OSError:
                continue
            for name in set(re.findall(r"^outbox mutant (\S+) fired$", text, re.M)):
                fired[name] = fired.get(name, 0) + 1
            broken |= set(re.findall(r"^outbox mutant (\S+): its fragment is gone", text, re.M))
        for name in sorted(fired):
            print("torture: mutant %s fired in %d relay(s)" % (name, fired[name]))
        for name in sorted(broken):
            print("torture: mutant %s could not be planted: its fragment is gone" % name)

    def explain_waiting(self):
        """What holds rows back that never went out: each database's rows not finished, its
        pauses and leases, and the relays' last lines."""
        for cell in self.cells:
            for database in cell.databases:
                try:
                    rows = database.query("""
                        SELECT job_id, state, held, round(extract(epoch FROM run_at - now())::numeric, 1),
                               attempts, worker_id, left(last_error, 80)
                          FROM outbox.job WHERE queue = 'tq' AND state IN ('ready', 'running')
                         ORDER BY job_id LIMIT 10""")
                    if not rows:
                        continue
                    print("waiting in %s: (job_id, state, held, due in s, attempts, worker, error) %s"
                          % (database.name, rows))
                    print("  paused: %s" % database.query("SELECT queue, ordering_key FROM outbox.paused"))
                    print("  leases: %s" % database.query(
                        "SELECT *, now() FROM outbox.database_lease"))
                    print("  members: %s" % database.query("SELECT * FROM outbox.relay_member"))
                except Exception as error:
                    print("waiting in %s: unreadable (%s)" % (database.name, error))
        for relay in self.relays:
            try:
                with open(relay.log_path) as log_file:
                    tail = log_file.readlines()[-15:]
            except OSError:
                continue
            print("last lines of %s:\n  %s" % (relay.name, "  ".join(tail)), end="")

    def history_of(self, cell, counts):
        rows = self.observe(cell)
        deliveries = cell.destination.read()
        merged = {"committed": set(), "uncertain": set(), "bad": set(), "rolled": {}, "idempotent": {},
                  "branch": set(), "histories": set()}
        for database in cell.databases:
            record = database.record
            merged["branch"] |= branch_rows(record)
            if record.windows or database.copy_of:
                merged["histories"].add(database.letter)
            merged["committed"] |= record.committed
            merged["uncertain"] |= record.uncertain
            merged["bad"] |= record.bad
            merged["rolled"].update(record.rolled)
            merged["idempotent"].update(record.idempotent)
        return dict(merged, name=cell.name, mode=cell.mode, at_most_once=cell.broker in brokers.AT_MOST_ONCE,
                    exact_replays=cell.broker in brokers.EXACT_REPLAYS,
                    dedup_window=brokers.DEDUP_WINDOW.get(cell.broker),
                    deliveries=deliveries, rows=rows, replayed=cell.replayed, counts=counts,
                    replay_counts=cell.replay_counts, copied_keys=cell.copied_keys,
                    transitions=self.transitions(cell), pauses=list(cell.pauses))

    def cleanup(self):
        for relay in self.relays:
            try:
                relay.stop()
            except Exception:
                pass
        for cell in self.cells:
            cell.destination.close()
        if self.own_stack:
            subprocess.run([STACK, "stop", self.own_stack])
        elif self.pg_stack_dir and self.pg_stack_dir != self.stack_dir:
            subprocess.run([STACK, "stop", self.pg_stack_dir])
        if os.environ.get("TORTURE_KEEP"):
            log("kept %s (relay logs)" % self.work)
        else:
            shutil.rmtree(self.work, ignore_errors=True)


def read_env(stack_dir):
    env = {}
    with open(os.path.join(stack_dir, "env")) as lines:
        for line in lines:
            if line.startswith("export "):
                name, _, value = line[7:].strip().partition("=")
                env[name] = value.strip("'")
    return env


def branch_rows(record):
    """Rows of a branch a history fault may have cut off: committed (or perhaps committed)
    inside one of the database's windows."""
    with record.lock:
        windows = list(record.windows)
        if not windows:
            return set()
        inside = {t for t, at in record.committed_at.items() if any(a <= at <= b for a, b in windows)}
        return inside | set(record.uncertain)


def gauge(metrics, name, queue=None):
    """The value of a gauge (of one queue); a queue the relay has no sample for reads 0."""
    for line in metrics.splitlines():
        if not line.startswith(name) or line[len(name):len(name) + 1] not in ("{", " "):
            continue
        if queue is None or ('queue="%s"' % queue) in line:
            return int(float(line.split()[-1]))
    return 0 if queue else None


def main():
    # a run stopped from outside (make's timeout, an operator) stops its servers and relays too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run = Run()
    rows, violations = 0, 1
    try:
        run.start_stack()
        run.setup()
        run.history()
        run.drain_all()
        rows, violations = run.judge()
    finally:
        run.cleanup()
        print("torture: seed=%s rows=%d violations=%d" % (run.seed, rows, violations), flush=True)
    return 0 if violations == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
