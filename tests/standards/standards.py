"""standards.py - what the standards tests share: fresh databases, free ports, the relay.

The stack's environment (DIR/env), OUTBOX_BIN and OUTBOX_SOURCE_DIR come from
tests/run.sh; the torture's broker clients (tests/torture/brokers.py) prepare and read
the destinations.
"""

import os
import random
import socket
import sys

import psycopg2

sys.path.insert(0, os.path.join(os.environ["OUTBOX_SOURCE_DIR"], "tests", "torture"))
import brokers  # noqa: E402,F401  (re-exported for the tests)

ENV = dict(os.environ)
RELAY = os.path.join(ENV["OUTBOX_BIN"], "outbox-relay")

# Each row's message id as the database's id form makes it: (message id, job id) per row.
MESSAGE_IDS = """
    SELECT CASE i.id_form WHEN 'uid' THEN i.database_id || ':' || j.message_uid
                          WHEN 'database' THEN i.database_id || ':' || i.epoch || ':' || j.job_id
                          ELSE j.job_id::text END, j.job_id
      FROM outbox.job AS j, outbox.identity AS i"""


def database(name):
    """A fresh database of the stack, cloned from the migrated template; returns its URL."""
    admin = psycopg2.connect(ENV["OUTBOX_TEST_PG_URL"])
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute("DROP DATABASE IF EXISTS %s WITH (FORCE)" % name)
        cur.execute("CREATE DATABASE %s TEMPLATE %s" % (name, ENV["OUTBOX_TEST_TEMPLATE_DB"]))
    admin.close()
    return ENV["OUTBOX_TEST_PG_URL"].rsplit("/", 1)[0] + "/" + name


def query(url, sql, args=()):
    conn = psycopg2.connect(url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall() if cur.description else None
    finally:
        conn.close()


def free_port():
    """A port of OUTBOX_TEST_PORT_RANGE (default 20000-32000) that nothing listens on."""
    low, high = (int(p) for p in ENV.get("OUTBOX_TEST_PORT_RANGE", "20000-32000").split("-"))
    for _ in range(200):
        port = random.randint(low, high)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port in %d-%d" % (low, high))


class Report:
    """'ok'/'FAILED' lines per case and the closing 'N passed, N failed'."""

    def __init__(self, what):
        self.what, self.passed, self.failed = what, 0, 0

    def case(self, name, problems):
        if problems:
            self.failed += 1
            print("FAILED  %s %s" % (self.what, name))
            for problem in problems[:20]:
                print("        " + problem)
        else:
            self.passed += 1
            print("ok      %s %s" % (self.what, name))
        sys.stdout.flush()

    def close(self):
        print("%d passed, %d failed" % (self.passed, self.failed))
        return 1 if self.failed else 0
