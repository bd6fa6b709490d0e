"""histories.py - the history faults: the database replaced by another history of itself.

Each fault is what an operator recovering from an ordinary accident does to the cluster (or
one database) under the relays, while producers and relays go on:

  cold_copy      a copy of the data directory started in place of the cluster: a cold copy
                 (`cp -a` of the stopped directory) or an online base backup started as it is
                 (`pg_basebackup -X stream`, no archive recovery): same system identifier,
                 same timeline
  pitr           a base backup restored to a point (an LSN) before rows published since,
                 from a WAL archive; the restore archiving to the same place or its own; once
                 or twice from the one backup (case 3: a timeline number used twice)
  standby        an asynchronous standby promoted while behind; or two, the second (which
                 never followed the first) promoted after the first has published and died
  dump_twice     one database's pg_dump restored twice (drop, restore, drop, restore again)
  async_crash    every session on synchronous_commit = off, the WAL writer stopped, then an
                 immediate stop: the last commits are lost and their xids handed out again
  async_crash_disable
                 the same with the stream cells' relays hung from the old server's end (hung
                 before it, the old server once outlived the wait for its end), and their queues
                 disabled once the producers have committed at the lost rows' places: those
                 rows go to the claims, which must not believe the broker's order record
  template_copy  CREATE DATABASE ... TEMPLATE of a database of a list cell, listed beside its
                 original without `identity set` (row-state list cells)

The cluster ones need a cluster of the torture's own (Cluster: started by torture.py in its
work directory, never the suite's). Each fault records, per database it touches, the window
of commit times whose rows may be lost (Record.windows): from the moment the copy, backup,
dump or restore point was taken (or the WAL writer stopped) to the moment the new history
started. The checker follows the database the relays end on: a row committed inside a window
and missing from the table may be delivered or not; every other committed row must arrive.
A history fault holds the schedule's history gate alone: no pause or stream toggle is under
way in the history it copies (a restore would bring back a half-done one).
"""

import os
import shutil
import signal
import subprocess
import threading
import time

import psycopg2

import producers

PG_BIN = os.environ.get("OUTBOX_PG_BIN", "/usr/lib/postgresql/15/bin")
DISCARD = "/bin/true"


def applies_cluster(run):
    return run.cluster is not None


def applies_cluster_stream(run):
    return run.cluster is not None and any(c.mode == "stream" for c in run.cells)


def applies_copy(run):
    return run.cluster is not None and any(c.list_path and c.mode == "row" for c in run.cells)


# (name, weight, applies to the run): one of these is drawn for each history slot
HISTORY_FAULTS = [
    ("cold_copy", 2, applies_cluster),
    ("pitr", 2, applies_cluster),
    ("standby", 2, applies_cluster),
    ("dump_twice", 1, applies_cluster),
    ("async_crash", 2, applies_cluster),
    ("async_crash_disable", 1, applies_cluster_stream),
    ("template_copy", 1, applies_copy),
]
HISTORY_NAMES = {f[0] for f in HISTORY_FAULTS}


def as_postgres(args):
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"] + args


class Cluster:
    """The torture's own PostgreSQL (stack.sh's layout: DIR/pg, DIR/pg.log)."""

    def __init__(self, stack_dir, port):
        self.dir, self.port = stack_dir, int(port)
        self.data = os.path.join(stack_dir, "pg")
        self.url = "postgresql://postgres@127.0.0.1:%d/postgres" % self.port
        self.serial = 0

    def run(self, args, timeout=180):
        result = subprocess.run(as_postgres(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError("%s: %s" % (os.path.basename(args[0]), result.stdout.strip()[-400:]))
        return result.stdout

    def sql(self, statement, args=None, database="postgres"):
        return producers.query(self.url.rsplit("/", 1)[0] + "/" + database, statement, args,
                               attempts=150)

    def pg_ctl(self, *args):
        return self.run([os.path.join(PG_BIN, "pg_ctl"), "-D", self.data, "-l",
                         os.path.join(self.dir, "pg.log"), "-w", "-t", "150"] + list(args), timeout=200)

    def place(self, name):
        """A fresh directory of the cluster's user under the stack directory."""
        self.serial += 1
        path = os.path.join(self.dir, "%s-%d" % (name, self.serial))
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        shutil.chown(path, "postgres", "postgres")
        os.chmod(path, 0o700)
        return path

    def prepare(self):
        """Archiving possible (archive_mode needs a restart), discarded until a PITR asks."""
        self.sql("ALTER SYSTEM SET archive_mode = on")
        self.sql("ALTER SYSTEM SET archive_command = %s", (DISCARD,))
        self.pg_ctl("-m", "fast", "restart")

    def archive_to(self, path):
        command = DISCARD if path is None else "test ! -f %s/%%f && cp %%p %s/%%f" % (path, path)
        self.sql("ALTER SYSTEM SET archive_command = %s", (command,))
        self.sql("SELECT pg_reload_conf()")

    def base_backup(self, standby=False):
        """pg_basebackup -X stream into a new directory; standby: with standby.signal (a
        standby cut off from its primary: nothing streams to it after the backup)."""
        path = self.place("backup")
        self.run([os.path.join(PG_BIN, "pg_basebackup"), "-d", "host=127.0.0.1 port=%d user=postgres"
                  % self.port, "-D", path, "-X", "stream", "--no-sync", "-c", "fast"])
        if standby:
            open(os.path.join(path, "standby.signal"), "w").close()
            shutil.chown(os.path.join(path, "standby.signal"), "postgres", "postgres")
        return path

    def stop(self, mode="fast"):
        self.pg_ctl("-m", mode, "stop")

    def start(self):
        self.pg_ctl("start")

    def replace(self, source, keep_source=False):
        """The data directory replaced by source (the cluster stopped)."""
        old = self.data + ".old"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(self.data, old)
        if keep_source:
            subprocess.run(["cp", "-a", source, self.data], check=True)
        else:
            os.rename(source, self.data)
        for leftover in ("postmaster.pid", "postmaster.opts"):
            try:
                os.unlink(os.path.join(self.data, leftover))
            except FileNotFoundError:
                pass
        shutil.rmtree(old, ignore_errors=True)

    def promote(self):
        self.pg_ctl("promote")
        for _ in range(300):
            if self.sql("SELECT pg_is_in_recovery()")[0][0] is False:
                return
            time.sleep(0.2)
        raise RuntimeError("the promoted standby stayed in recovery")

    def insert_lsn(self):
        return self.sql("SELECT pg_current_wal_insert_lsn()::text")[0][0]

    def wait_archived(self):
        """The WAL written so far switched out and archived."""
        segment = self.sql("SELECT pg_walfile_name(pg_switch_wal())")[0][0]
        for _ in range(300):
            done = self.sql("SELECT last_archived_wal FROM pg_stat_archiver")[0][0]
            if done is not None and done[8:] >= segment[8:]:
                return
            time.sleep(0.2)
        raise RuntimeError("WAL segment %s was not archived in 60 s" % segment)

    def postmaster_pid(self):
        with open(os.path.join(self.data, "postmaster.pid")) as pidfile:
            return int(pidfile.readline())


def pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


class HistoryFaults:
    """The history faults, as methods of faults.Schedule (self.run_, self.log, self.server)."""

    def history(self, databases, action):
        """Runs action() holding the PostgreSQL lock and the history gate alone; action returns
        the time its window opened; each of databases gets the window up to now."""
        def guarded():
            with self.gate.exclusive():
                opened = action()
                closed = time.time()
                for database in databases:
                    database.record.windows.append((opened, closed))
                self.settle_prepared()
                self.log("history: window %.1f s on %s" % (closed - opened,
                                                         ",".join(d.name for d in databases) or "-"))
        self.server(guarded, "postgres")

    def flushed(self):
        """A moment before which every commit is on disk: a synchronous commit of a transaction
        that wrote WAL flushes the WAL up to its own record, and every asynchronous commit's
        before it (the WAL writer of a loaded host lagged over a second behind: a window opened a
        second before the crash missed lost commits). A transaction that only took an xid wrote
        none, and PostgreSQL commits it asynchronously whatever synchronous_commit says: it
        writes a transactional logical message. A crash can lose only commits made after it."""
        opened = time.time()
        self.run_.cluster.sql("SET synchronous_commit = on;"
                              " SELECT pg_logical_emit_message(true, 'torture', 'flush')")
        return opened

    def settle_prepared(self):
        """Prepared transactions the new history brought back though their producers finished
        them (the locks they hold would stop the producers of their keys): rolled back."""
        cluster = self.run_.cluster
        with producers.FINISHED_LOCK:
            finished = set(producers.FINISHED_GIDS)
        for gid, database in cluster.sql("SELECT gid, database FROM pg_prepared_xacts"):
            if gid in finished:
                self.log("history: prepared transaction %s came back finished: rolled back" % gid)
                try:
                    cluster.sql("ROLLBACK PREPARED %s", (gid,), database=database)
                except psycopg2.Error as error:  # its producer, retrying, finished it meanwhile
                    self.log("history: %s: %s" % (gid, str(error).strip()))

    def all_databases(self):
        return [d for cell in self.run_.cells for d in cell.databases]

    def cold_copy(self, rng):
        cluster = self.run_.cluster
        how = rng.choice(["cold", "base_backup"])

        def action():
            opened = time.time()
            self.log("fault: history cold_copy (%s)" % how)
            if how == "cold":
                cluster.stop("fast")
                copy = cluster.place("cold")
                os.rmdir(copy)
                subprocess.run(["cp", "-a", cluster.data, copy], check=True)
                cluster.start()
            else:
                copy = cluster.base_backup()
            time.sleep(rng.uniform(1.5, 4.0))
            cluster.stop("immediate")
            cluster.replace(copy)
            cluster.start()
            return opened

        self.history(self.all_databases(), action)

    def pitr(self, rng):
        cluster = self.run_.cluster
        own, twice = rng.random() < 0.5, rng.random() < 0.5

        def action():
            self.log("fault: history pitr (%s archive%s)" % ("own" if own else "shared", ", twice" if twice else ""))
            archive = cluster.place("archive")
            cluster.archive_to(archive)
            backup = cluster.base_backup()
            targets = []
            for _ in range(2 if twice else 1):
                time.sleep(rng.uniform(0.8, 2.0))
                targets.append((time.time(), cluster.insert_lsn()))
            time.sleep(rng.uniform(0.8, 2.0))
            cluster.wait_archived()
            opened = min(t for t, _ in targets)
            for index, (_, lsn) in enumerate(reversed(targets)):  # the later point first
                self.restore_to(cluster, backup, archive, lsn, own, last=index == len(targets) - 1)
                if index < len(targets) - 1:
                    time.sleep(rng.uniform(1.5, 3.0))
            shutil.rmtree(backup, ignore_errors=True)
            return opened

        self.history(self.all_databases(), action)

    def restore_to(self, cluster, backup, archive, lsn, own, last):
        """The backup restored, recovered from archive to lsn and promoted; archiving then to a
        place of its own (own) or the same archive (shared)."""
        cluster.stop("immediate")
        cluster.replace(backup, keep_source=True)
        with open(os.path.join(cluster.data, "postgresql.auto.conf"), "a") as conf:
            conf.write("restore_command = 'cp %s/%%f %%p'\nrecovery_target_lsn = '%s'\n"
                       "recovery_target_action = 'promote'\nrecovery_target_timeline = 'current'\n"
                       % (archive, lsn))
        open(os.path.join(cluster.data, "recovery.signal"), "w").close()
        subprocess.run(["chown", "-R", "postgres:postgres", cluster.data], check=True)
        cluster.start()
        for _ in range(300):
            if cluster.sql("SELECT pg_is_in_recovery()")[0][0] is False:
                break
            time.sleep(0.2)
        for name in ("restore_command", "recovery_target_lsn", "recovery_target_action",
                     "recovery_target_timeline"):
            cluster.sql("ALTER SYSTEM RESET %s" % name)
        cluster.archive_to(None if last else (cluster.place("archive") if own else archive))

    def standby(self, rng):
        cluster = self.run_.cluster
        two = rng.random() < 0.5

        def action():
            self.log("fault: history standby (%s)" % ("two standbys" if two else "one standby"))
            opened = time.time()
            second = cluster.base_backup(standby=True) if two else None
            if two:
                time.sleep(rng.uniform(1.0, 2.5))
            first = cluster.base_backup(standby=True)
            time.sleep(rng.uniform(1.0, 3.0))
            self.log("history: standby backups taken (%.1f s)" % (time.time() - opened))
            for standby in (first, second):
                if standby is None:
                    break
                cluster.stop("immediate")
                cluster.replace(standby)
                cluster.start()
                self.log("history: standby started (%.1f s)" % (time.time() - opened))
                cluster.promote()
                self.log("history: standby promoted (%.1f s)" % (time.time() - opened))
                if standby is first and second is not None:
                    time.sleep(rng.uniform(1.5, 3.0))  # the first publishes, then dies
            return opened

        self.history(self.all_databases(), action)

    def dump_twice(self, rng):
        cluster = self.run_.cluster
        database = rng.choice([d for d in self.all_databases() if not d.copy_of])
        dbname = database.url.rsplit("/", 1)[1]
        dump = os.path.join(self.run_.work, "%s.dump" % dbname)

        def action():
            self.log("fault: history dump_twice (%s)" % dbname)
            opened = time.time()
            subprocess.run([os.path.join(PG_BIN, "pg_dump"), "-Fc", "-f", dump, database.url], check=True,
                           stdout=subprocess.DEVNULL, timeout=120)
            for _ in range(2):
                time.sleep(rng.uniform(1.0, 2.5))
                self.without_sessions(cluster, dbname, lambda: (
                    cluster.sql("DROP DATABASE %s WITH (FORCE)" % dbname),
                    cluster.sql("CREATE DATABASE %s TEMPLATE template0" % dbname)))
                subprocess.run([os.path.join(PG_BIN, "pg_restore"), "--single-transaction", "-d",
                                database.url, dump], check=True, stdout=subprocess.DEVNULL, timeout=120)
            return opened

        self.history([database], action)

    def without_sessions(self, cluster, dbname, action, attempts=50):
        """action() once no session nor prepared transaction holds dbname (producers and relays
        come back at once: retried)."""
        for attempt in range(attempts):
            for (gid,) in cluster.sql("SELECT gid FROM pg_prepared_xacts WHERE database = %s", (dbname,)):
                cluster.sql("ROLLBACK PREPARED %s", (gid,), database=dbname)
            cluster.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (dbname,))
            try:
                return action()
            except psycopg2.Error as error:
                if attempt == attempts - 1 or "accessed by other users" not in str(error):
                    raise
                time.sleep(0.05)

    def copy_database(self, cluster, dbname, copy):
        """CREATE DATABASE copy TEMPLATE dbname: no session nor prepared transaction may hold
        dbname; producers and relays reconnect at once, so connections are refused meanwhile
        (a prepared transaction is rolled back from its own database: connections allowed)."""
        for attempt in range(30):
            for (gid,) in cluster.sql("SELECT gid FROM pg_prepared_xacts WHERE database = %s", (dbname,)):
                cluster.sql("ROLLBACK PREPARED %s", (gid,), database=dbname)
            cluster.sql("ALTER DATABASE %s WITH ALLOW_CONNECTIONS false" % dbname)
            try:
                cluster.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (dbname,))
                if not cluster.sql("SELECT 1 FROM pg_prepared_xacts WHERE database = %s", (dbname,)):
                    cluster.sql("CREATE DATABASE %s TEMPLATE %s" % (copy, dbname))
                    return
            except psycopg2.Error as error:
                if attempt == 29 or "accessed by other users" not in str(error):
                    raise
            finally:
                cluster.sql("ALTER DATABASE %s WITH ALLOW_CONNECTIONS true" % dbname)
        raise RuntimeError("%s stayed in use" % dbname)

    def async_crash(self, rng):
        self.history(self.all_databases(), lambda: self.crash_losing_commits(rng, "async_crash"))

    def async_crash_disable(self, rng):
        cells = [c for c in self.run_.cells if c.mode == "stream"]
        relays = [r for cell in cells for r in self.relays_of(cell)]

        def hang():
            for relay in relays:
                relay.pause()

        def action():
            try:
                opened = self.crash_losing_commits(rng, "async_crash_disable", before_start=hang)
                # the producers commit at the places of the lost rows, and the queue is handed
                # to the claims before any relay is back (a prepared transaction the crash kept
                # though its producer finished it would hold the disable off)
                time.sleep(rng.uniform(0.5, 1.5))
                self.settle_prepared()
                self.log("fault: stream queues disabled after the crash")
                for cell in cells:
                    for database in cell.databases:
                        try:
                            self.run_.outboxctl(database, "stream", "disable", "tq")
                        except RuntimeError as error:  # the crash happened: its window stands
                            self.log("fault: %s: %s" % (database.name, error))
            finally:
                for relay in relays:
                    relay.resume()
            return opened

        self.history(self.all_databases(), action)

    def crash_losing_commits(self, rng, name, before_start=lambda: None):
        """Every session on synchronous_commit = off, the WAL writer stopped, an immediate
        stop, the cluster started again (before_start() once the old one is gone): the time
        from which commits may be lost."""
        cluster = self.run_.cluster
        self.log("fault: history %s" % name)
        cluster.sql("ALTER SYSTEM SET synchronous_commit = off")
        cluster.sql("SELECT pg_reload_conf()")
        time.sleep(0.3)
        writer = cluster.sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'")[0][0]
        opened = self.flushed()
        os.kill(writer, signal.SIGSTOP)
        try:
            time.sleep(rng.uniform(0.5, 2.0))
            postmaster = cluster.postmaster_pid()
            os.kill(postmaster, signal.SIGQUIT)  # pg_ctl stop -m immediate
            time.sleep(0.3)
        finally:
            os.kill(writer, signal.SIGKILL)
        for _ in range(300):
            if not pid_alive(postmaster):
                break
            time.sleep(0.1)
        before_start()
        cluster.start()
        cluster.sql("ALTER SYSTEM RESET synchronous_commit")
        cluster.sql("SELECT pg_reload_conf()")
        return opened

    def template_copy(self, rng):
        cluster = self.run_.cluster
        cell = rng.choice([c for c in self.run_.cells if c.list_path and c.mode == "row"])
        original = rng.choice([d for d in cell.databases if not d.copy_of])
        dbname = original.url.rsplit("/", 1)[1]

        def action():
            letter = next(l for l in "cdefgh" if l not in {d.letter for d in cell.databases})
            copy_name = "%s_%s" % (cell.slug, letter)
            self.log("fault: history template_copy (tt_%s of %s)" % (copy_name, dbname))
            cluster.sql("DROP DATABASE IF EXISTS tt_%s WITH (FORCE)" % copy_name)
            self.copy_database(cluster, dbname, "tt_" + copy_name)
            self.run_.add_copy(cell, original, letter)
            return time.time()

        self.history([], action)


class Skipped(Exception):
    """A fault whose turn came after the history ended: not applied."""


class Gate:
    """Shared by the faults whose state a restore would bring back half-done (pause, stream
    toggle, replay); a history fault holds it alone. Once closed, a fault that was waiting
    for it is skipped."""

    def __init__(self):
        self.cond = threading.Condition()
        self.sharing = 0
        self.alone = False
        self.queued = 0  # history faults waiting: the shared ones wait behind them
        self.closed = False

    def close(self):
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def shared(self):
        return _Hold(self, False)

    def exclusive(self):
        return _Hold(self, True)


class _Hold:
    def __init__(self, gate, alone):
        self.gate, self.alone = gate, alone

    def __enter__(self):
        gate = self.gate
        with gate.cond:
            if self.alone:
                gate.queued += 1
                gate.cond.wait_for(lambda: gate.closed or (not gate.alone and gate.sharing == 0))
                gate.queued -= 1
                if gate.closed:
                    gate.cond.notify_all()
                    raise Skipped()
                gate.alone = True
            else:
                gate.cond.wait_for(lambda: gate.closed or (not gate.alone and gate.queued == 0))
                if gate.closed:
                    raise Skipped()
                gate.sharing += 1

    def __exit__(self, *exc):
        with self.gate.cond:
            if self.alone:
                self.gate.alone = False
            else:
                self.gate.sharing -= 1
            self.gate.cond.notify_all()
