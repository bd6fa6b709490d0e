"""faults.py - the run's fault schedule, drawn from its seed before the history starts.

FAULTS is the table of faults: a name, a weight, and which runs it applies to; the method
of Schedule of that name applies it and undoes it (so the drain phase starts from a whole
system). A new fault is one row of the table and one method. TORTURE_FAULTS (names,
comma-separated) keeps only those rows; TORTURE_FAULTS=none, none.

The schedule is drawn whole from the seed up front: the moment of every fault, its name
and its own random generator. Each starts at its moment on a thread of its own, whatever
else is under way (faults of one server wait for one another, a PostgreSQL restart for
all, instead of being skipped), so one
seed gives the same faults in every run; the schedule's digest is printed.

The faults: a relay killed with -9 and restarted; a relay stopped with SIGSTOP past its
lease, then continued; a broker killed with -9 or restarted; PostgreSQL restarted fast or
immediate; a stream disabled and enabled again with another partition count while rows
flow; a queue paused then resumed; succeeded rows replayed; a database taken out of a
cell's list and put back; a tenant's session holding a listed database's outbox.job locked;
a server that accepts connections and never answers listed for a while. And the faults that hit the windows where rows are in flight,
each after a producer burst that fills batches and with the broker stalled (SIGSTOP) so
that relays hold claimed rows mid-publish: a relay then killed, or stopped past its lease
while the broker goes on; or the broker continued with outbox.job locked, so that the
rows just published wait for their marks, while their relay is killed (and its sessions
ended), or past the rows' leases.
"""

import hashlib
import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections import Counter

import psycopg2

import histories


def always(run):
    return True


def has_mode(mode):
    return lambda run: any(cell.mode == mode for cell in run.cells)


def has_list(run):
    return any(cell.list_path for cell in run.cells)


# (name, weight, applies to the run)
FAULTS = [
    ("relay_kill", 6, always),
    ("relay_stop", 3, always),
    ("postgres_restart", 1, always),
    ("pause", 2, always),
    ("broker_kill", 2, always),
    ("stream_toggle", 5, has_mode("stream")),
    ("replay", 2, has_mode("row")),
    ("list_edit", 3, has_list),
    ("tenant_lock", 2, has_list),
    ("hung_server", 2, has_list),
    ("broker_stall_kill", 3, always),
    ("broker_stall_stop", 2, always),
    ("mark_stall_kill", 3, always),
    ("mark_stall_long", 1, always),
]


# A history fault holds every other fault off for its window, 10-60 s on a loaded 2-core host
# beside its backups: one per 150 s leaves the other faults most of the history.
HISTORY_FAULT_EVERY_SECONDS = 150


class Schedule(histories.HistoryFaults, threading.Thread):
    def __init__(self, run, seed, log):
        super().__init__(name="faults", daemon=True)
        self.run_ = run
        self.log = log
        self.stop = threading.Event()
        self.active = []
        self.history_threads = []
        self.gate = histories.Gate()
        # one lock per server: faults of one server wait for one another, PostgreSQL's
        # restart for every other server fault
        self.server_locks = {name: threading.Lock() for name in ["postgres"] + sorted(
            {run.service_of(b) for b in run.brokers()})}
        self.done = Counter()
        self.skipped = Counter()  # drawn, still waiting when the history ended
        self.plan = self.draw(random.Random("faults-%s" % seed))
        drawn = Counter(name for _, name, _ in self.plan)
        digest = hashlib.sha1(repr([(round(at, 3), name) for at, name, _ in self.plan]).encode()).hexdigest()
        log("faults drawn: %s (schedule %s)" % (", ".join("%s=%d" % kv for kv in sorted(drawn.items())) or
                                                 "none", digest[:12]))

    def choices(self, table=FAULTS):
        only = selected()
        if only == ["none"]:
            return []
        return [(name, weight) for name, weight, applies in table
                if applies(self.run_) and (not only or name in only)]

    def draw(self, rng):
        """[(seconds from the start, name, the fault's seed)], drawn before anything runs:
        the faults at random gaps, and the history faults (histories.py), one per
        HISTORY_FAULT_EVERY_SECONDS of history and at least one, each in a slot of its own."""
        plan = []
        faults = self.choices()
        if faults:
            names, weights = [f[0] for f in faults], [f[1] for f in faults]
            # a short history (make test's) gets its faults closer together
            gap = (0.4, 1.5) if self.run_.seconds < 60 else (1.0, 3.5)
            at = rng.uniform(*gap)
            while at < self.run_.seconds:
                plan.append((at, rng.choices(names, weights)[0], rng.random()))
                at += rng.uniform(*gap)
        faults = self.choices(histories.HISTORY_FAULTS)
        if faults:
            names, weights = [f[0] for f in faults], [f[1] for f in faults]
            slots = max(1, int(self.run_.seconds // HISTORY_FAULT_EVERY_SECONDS))
            for slot in range(slots):
                at = self.run_.seconds * (slot + rng.uniform(0.15, 0.6)) / slots
                plan.append((at, rng.choices(names, weights)[0], rng.random()))
        return sorted(plan)

    def run(self):
        start = time.monotonic()
        for at, name, fault_seed in self.plan:
            if self.stop.wait(max(0.0, start + at - time.monotonic())):
                return
            thread = threading.Thread(target=self.guarded, args=(name, random.Random(fault_seed)),
                                      daemon=True)
            thread.start()
            self.active.append(thread)
            if name in histories.HISTORY_NAMES:
                self.history_threads.append(thread)

    def wait_histories(self):
        """Waits for the history faults drawn (rows committed after the last split must
        follow it): returns whether any ran."""
        while any(name in histories.HISTORY_NAMES for _, name, _ in self.plan) and not self.history_threads:
            time.sleep(0.2)  # the schedule has not reached it yet
        for thread in list(self.history_threads):
            thread.join()
        return bool(self.history_threads)

    def finish(self):
        """Ends the schedule: a fault still waiting for its server or for a history fault (a
        slow host runs them later than drawn) is skipped, not run after the history."""
        self.stop.set()
        self.gate.close()
        self.join()
        for thread in self.active:
            thread.join()

    def guarded(self, name, rng):
        try:
            if self.stop.is_set():
                raise histories.Skipped()
            getattr(self, name)(rng)
            self.done[name] += 1
        except histories.Skipped:
            self.skipped[name] += 1
        except Exception as error:  # a fault that failed to apply is reported, not fatal
            self.log("fault %s failed: %s" % (name, error))

    # ---- helpers

    def server(self, action, service=None):
        """Runs a fault of service (None: every server) once no other fault of it is under
        way (never skipped)."""
        names = sorted(self.server_locks) if service is None else [service]
        for name in names:  # in one order: no two faults wait on each other
            self.server_locks[name].acquire()
        try:
            if self.stop.is_set():
                raise histories.Skipped()
            action()
        finally:
            for name in names:
                self.server_locks[name].release()

    def broker_pid(self, cell):
        service = self.run_.service_of(cell.broker)
        path = os.path.join(self.run_.stack_dir, service, service + ".pid")
        with open(path) as pidfile:
            return int("".join(c for c in pidfile.read() if c.isdigit()))

    def relays_of(self, cell, database=None):
        return [r for r in self.run_.relays if r.cell is cell and (database is None or r.database in (None, database))]

    def burst(self, cell, database, rng):
        """Producers of the database each commit one big batch now: batches fill."""
        for producer in self.run_.producers:
            if producer.url == database.url:
                producer.burst.set()
        time.sleep(rng.uniform(0.3, 0.8))

    # ---- the faults

    def relay_kill(self, rng):
        relay = rng.choice(self.run_.relays)
        relay.kill()
        time.sleep(rng.uniform(0.2, 2.0))
        relay.start()

    def relay_stop(self, rng):
        relay = rng.choice(self.run_.relays)
        relay.pause()
        time.sleep(relay.lease + rng.uniform(1.0, 2.5))
        relay.resume()

    def broker_kill(self, rng):
        broker = rng.choice(self.run_.brokers())
        how = rng.choice(["kill", "restart"])
        service = self.run_.service_of(broker)

        def action():
            self.log("fault: %s %s" % (how, service))
            if how == "kill":
                self.run_.stack("kill-service", service)
                time.sleep(rng.uniform(0.2, 1.5))
                self.run_.stack("start-service", service)
            else:
                self.run_.stack("restart-service", service)
            for cell in self.run_.cells:
                if self.run_.service_of(cell.broker) == service:
                    cell.destination.restarted()

        self.server(action, service)

    def postgres_restart(self, rng):
        mode = rng.choice(["fast", "immediate"])

        def crash():
            self.log("fault: postgres restart -m immediate (asynchronous commits since a flush)")
            opened = self.flushed()
            self.run_.stack("kill-service", "postgres")
            self.run_.stack("start-service", "postgres")
            return opened

        if mode == "immediate" and self.run_.cluster is not None:
            # the run has producers committing asynchronously: an immediate stop may lose their
            # last commits, a history of its own (a window on every database)
            self.history(self.all_databases(), crash)
            return

        def action():
            self.log("fault: postgres restart -m %s" % mode)
            if mode == "fast":
                self.run_.stack("restart-service", "postgres")
            else:
                self.run_.stack("kill-service", "postgres")
                self.run_.stack("start-service", "postgres")

        self.server(action)

    def broker_stall(self, rng, then):
        """A burst, then the cell's broker stopped (SIGSTOP) while its relays publish: each
        pipeline with rows is soon stuck mid-publish, its rows claimed. then(relay, resume)
        acts on one relay of the database while the broker stands still and must call
        resume() (the broker continued) once; returns the relay."""
        cell = rng.choice(self.run_.cells)
        database = rng.choice(cell.databases)
        relay = rng.choice(self.relays_of(cell, database))

        def action():
            self.burst(cell, database, rng)
            pid = self.broker_pid(cell)
            stopped = [True]

            def resume():
                if stopped[0]:
                    os.kill(pid, signal.SIGCONT)
                    stopped[0] = False

            os.kill(pid, signal.SIGSTOP)
            try:
                pause = rng.uniform(0.5, 1.5)
                if cell.mode == "row":
                    self.await_claims(database, relay)
                time.sleep(pause)
                then(database, relay, resume)
            finally:
                resume()

        self.server(action, self.run_.service_of(cell.broker))
        return relay

    def await_claims(self, database, relay, seconds=5.0):
        """Waits (a bounded while) until relay holds rows of database: on a busy host its
        claims of the burst can come after the broker stopped, and a fault meant for rows
        in flight would find none."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            held = database.query("""
                SELECT count(*) FROM outbox.job AS j
                  JOIN torture.transition AS t ON t.job_id = j.job_id AND t.new_worker = j.worker_id
                 WHERE j.state = 'running' AND t.new_state = 'running' AND t.actor = %s""",
                                  (relay.name,))
            if held[0][0] > 0:
                return
            time.sleep(0.1)

    def broker_stall_kill(self, rng):
        """Rows claimed, some perhaps appended, and their relay gone: reaped, published again."""
        relay = self.broker_stall(rng, lambda database, relay, resume: relay.kill())
        time.sleep(rng.uniform(0.2, 1.0))
        relay.start()

    def broker_stall_stop(self, rng):
        """The stopped relay comes back past its lease, the rows it held reaped and taken
        by another: whatever it marks then must be refused (the fence)."""
        relay = self.broker_stall(rng, lambda database, relay, resume: (relay.pause(), resume()))
        time.sleep(relay.lease + rng.uniform(2.0, 3.0))
        relay.resume()

    def hold_marks(self, database, resume, seconds, then):
        """outbox.job locked against writes, then the broker continued: the rows the relays
        publish now wait for their marks for seconds; then() runs before the lock goes."""
        conn = database.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SET lock_timeout = '5s'")
                cur.execute("LOCK TABLE outbox.job IN SHARE ROW EXCLUSIVE MODE")
                resume()
                time.sleep(seconds)
                then(cur)
            conn.commit()
        finally:
            conn.close()

    def mark_stall_kill(self, rng):
        """Rows published, their marks held back, their relay killed and its sessions ended:
        the broker has them, the table says running until a reap; published again."""
        def then(database, relay, resume):
            def kill(cur):
                relay.kill()
                cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                            " WHERE application_name = %s AND datname = current_database()",
                            (relay.name,))
            self.hold_marks(database, resume, rng.uniform(0.5, 1.0), kill)

        relay = self.broker_stall(rng, then)
        time.sleep(rng.uniform(0.2, 1.0))
        relay.start()

    def mark_stall_long(self, rng):
        """Marks held back past the leases of the rows they mark: every one must be refused."""
        seconds = min(self.run_.leases) + rng.uniform(1.0, 2.0)
        self.broker_stall(rng, lambda database, relay, resume:
                          self.hold_marks(database, resume, seconds, lambda cur: None))

    def stream_toggle(self, rng):
        with self.gate.shared():
            self.stream_toggle_now(rng)

    def stream_toggle_now(self, rng):
        cell = rng.choice([c for c in self.run_.cells if c.mode == "stream"])
        database = rng.choice(cell.databases)
        self.run_.outboxctl(database, "stream", "disable", "tq")
        time.sleep(rng.choice([0, 0.2, 1.0]))
        # a history fault meanwhile may bring back a copy from before the disable: the queue is
        # a stream again, which is what the undo wanted
        self.run_.outboxctl_until_done(database, "stream", "enable", "tq", "--partitions",
                                       str(rng.randint(1, 4)), done_if="is a stream of")

    def pause(self, rng):
        with self.gate.shared():
            self.pause_now(rng)

    def pause_now(self, rng):
        cell = rng.choice(self.run_.cells)
        database = rng.choice(cell.databases)
        self.run_.outboxctl(database, "pause", "tq", "--reason", "torture")
        paused = time.time()
        time.sleep(rng.uniform(0.5, 3.0))
        # the window in which nothing of the queue may go out: from a poll interval and a
        # second after the pause (docs: relays honour it within that) to the resume
        cell.pauses.append((database.letter, paused + self.run_.pause_grace, time.time()))
        self.run_.outboxctl_until_done(database, "resume", "tq")

    def replay(self, rng):
        with self.gate.shared():
            self.replay_now(rng)

    def replay_now(self, rng):
        cell = rng.choice([c for c in self.run_.cells if c.mode == "row"])
        database = rng.choice(cell.databases)
        rows = database.query("SELECT job_id, payload->>'u' FROM outbox.job WHERE queue = 'tq' AND "
                              "state = 'succeeded' ORDER BY random() LIMIT 3")
        if not rows:
            return
        # recorded first: a replay that half-happened may still deliver
        cell.replayed.update(token for _, token in rows)
        cell.replay_counts.update(token for _, token in rows)
        args = ["replay", "--queue", "tq"]
        for job_id, _ in rows:
            args += ["--job", str(job_id)]
        self.run_.outboxctl(database, *args)

    def list_edit(self, rng):
        cell = rng.choice([c for c in self.run_.cells if c.list_path])
        database = rng.choice(cell.databases)
        with cell.list_lock:  # two edits of one list at once would leave it short
            cell.write_list([d for d in cell.databases if d is not database])
            time.sleep(rng.uniform(0.5, 3.0))
            cell.write_list(cell.databases)


    def tenant_lock(self, rng):
        """A tenant's session holds its outbox.job locked (LOCK TABLE) for a few seconds: the
        list's relays back that database off, and its rows wait for the lock, not the others'."""
        cell = rng.choice([c for c in self.run_.cells if c.list_path])
        database = rng.choice(cell.databases)
        with self.gate.shared():  # a history fault's restart would end the session anyway
            conn = psycopg2.connect(database.url, connect_timeout=5)
            try:
                with conn.cursor() as cur:
                    cur.execute("SET lock_timeout = '5s'")
                    cur.execute("LOCK TABLE outbox.job")
                    time.sleep(rng.uniform(1.0, 4.0))
                conn.commit()
            finally:
                conn.close()

    def hung_server(self, rng):
        """A server that accepts connections and never answers (a socket that listens and
        never accepts), listed beside a cell's databases for a while, then taken out."""
        cell = rng.choice([c for c in self.run_.cells if c.list_path])
        with socket.socket() as hung:
            hung.bind(("127.0.0.1", self.run_.free_port()))
            hung.listen(16)
            url = "postgresql://postgres@127.0.0.1:%d/hung" % hung.getsockname()[1]
            with cell.list_lock:
                cell.write_list(cell.databases, extra=[("hung", url)])
                time.sleep(rng.uniform(5.0, 15.0))
                cell.write_list(cell.databases)


def selected():
    """TORTURE_FAULTS: the names kept (faults and history faults), [] for all, ["none"]."""
    only = [f for f in os.environ.get("TORTURE_FAULTS", "").split(",") if f]
    known = {f[0] for f in FAULTS} | histories.HISTORY_NAMES
    unknown = set(only) - known - {"none"}
    if unknown:
        raise SystemExit("torture: unknown TORTURE_FAULTS %s (%s)" % (",".join(sorted(unknown)),
                                                                      ",".join(sorted(known))))
    return only


def history_faults_wanted():
    """Whether the run may draw a history fault (then it needs a cluster of its own)."""
    only = selected()
    return only != ["none"] and (not only or bool(set(only) & histories.HISTORY_NAMES))


def run_quietly(args, timeout=120):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                          text=True)
