"""faults.py - the run's fault schedule, drawn from its seed.

Every few seconds the schedule starts one fault on a thread of its own (at most two at
once; a server fault never beside another): a relay killed with -9 and restarted; a
relay stopped with SIGSTOP past its lease, then continued; a broker killed with -9 or
restarted; PostgreSQL restarted fast or immediate; a stream disabled and enabled again
with another partition count while rows flow; a queue paused then resumed; succeeded
rows replayed; a database taken out of a cell's list and put back. Each fault undoes itself, so the drain phase starts from a whole system.
"""

import random
import subprocess
import threading
import time
from collections import Counter


class Schedule(threading.Thread):
    def __init__(self, run, seed, log):
        super().__init__(name="faults", daemon=True)
        self.run_ = run
        self.rng = random.Random("faults-%s" % seed)
        self.log = log
        self.stop = threading.Event()
        self.active = []
        self.server_busy = threading.Lock()
        self.done = Counter()

    def choices(self):
        run = self.run_
        faults = [("relay_kill", 6), ("relay_stop", 3), ("postgres_restart", 1), ("pause", 2)]
        faults += [("broker_kill", 2) for _ in run.brokers()]
        if any(cell.mode == "stream" for cell in run.cells):
            faults.append(("stream_toggle", 5))
        if any(cell.mode == "row" for cell in run.cells):
            faults.append(("replay", 2))
        if any(cell.list_path for cell in run.cells):
            faults.append(("list_edit", 3))
        return faults

    def run(self):
        faults = self.choices()
        names, weights = [f[0] for f in faults], [f[1] for f in faults]
        # a short history (make test's) gets its faults closer together
        gap = (0.4, 1.5) if self.run_.seconds < 60 else (1.0, 3.5)
        while not self.stop.wait(self.rng.uniform(*gap)):
            self.active = [t for t in self.active if t.is_alive()]
            if len(self.active) >= 2:
                continue
            name = self.rng.choices(names, weights)[0]
            fault_rng = random.Random(self.rng.random())
            thread = threading.Thread(target=self.guarded, args=(name, fault_rng), daemon=True)
            thread.start()
            self.active.append(thread)

    def finish(self):
        self.stop.set()
        self.join()
        for thread in self.active:
            thread.join()

    def guarded(self, name, rng):
        try:
            getattr(self, name)(rng)
            self.done[name] += 1
        except Skipped:
            pass  # another server fault is under way
        except Exception as error:  # a fault that failed to apply is reported, not fatal
            self.log("fault %s failed: %s" % (name, error))

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

    def server(self, action):
        if not self.server_busy.acquire(blocking=False):
            return False
        try:
            action()
        finally:
            self.server_busy.release()
        return True

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

        if not self.server(action):
            raise Skipped()

    def postgres_restart(self, rng):
        mode = rng.choice(["fast", "immediate"])

        def action():
            self.log("fault: postgres restart -m %s" % mode)
            if mode == "fast":
                self.run_.stack("restart-service", "postgres")
            else:
                self.run_.stack("kill-service", "postgres")
                self.run_.stack("start-service", "postgres")

        if not self.server(action):
            raise Skipped()

    def stream_toggle(self, rng):
        cell = rng.choice([c for c in self.run_.cells if c.mode == "stream"])
        database = rng.choice(cell.databases)
        self.run_.outboxctl(database, "stream", "disable", "tq")
        time.sleep(rng.choice([0, 0.2, 1.0]))
        self.run_.outboxctl_until_done(database, "stream", "enable", "tq", "--partitions",
                                       str(rng.randint(1, 4)))

    def pause(self, rng):
        cell = rng.choice(self.run_.cells)
        database = rng.choice(cell.databases)
        self.run_.outboxctl(database, "pause", "tq", "--reason", "torture")
        time.sleep(rng.uniform(0.5, 3.0))
        self.run_.outboxctl_until_done(database, "resume", "tq")

    def replay(self, rng):
        cell = rng.choice([c for c in self.run_.cells if c.mode == "row"])
        database = rng.choice(cell.databases)
        rows = database.query("SELECT job_id, payload->>'u' FROM outbox.job WHERE queue = 'tq' AND "
                              "state = 'succeeded' ORDER BY random() LIMIT 3")
        if not rows:
            return
        # recorded first: a replay that half-happened may still deliver
        cell.replayed.update(token for _, token in rows)
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


class Skipped(Exception):
    pass


def run_quietly(args, timeout=120):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                          text=True)
