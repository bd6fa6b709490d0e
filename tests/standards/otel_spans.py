"""otel_spans.py - the relay's spans, as an OTLP receiver of the tests takes them.

The receiver (otlp_receiver.py) parses every export into opentelemetry-proto's
ExportTraceServiceRequest. Cases:
  parent <broker>  one span per published message, a child of the row's traceparent (its
                   trace id, its span id as parent), none for a row whose parent was not
                   sampled, a root span for a row without one; the messaging conventions,
                   the wait in the table, OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
  ratio            OTEL_TRACES_SAMPLER=traceidratio keeps about its share of the traces
  down             no collector: the drain is as fast as without spans, drops are counted
  slow             a collector answering after 5 s (the export timeout 3 s): the same, with
                   a small queue
  restart          the collector stops and starts again mid-run: rows go on meanwhile, and
                   spans of the rows after the restart arrive
"Fast as without" is: within 1.5 x the drain without spans + 1 s, for 3000 rows.
"""

import json
import os
import subprocess
import sys
import time
import urllib.request

from otlp_receiver import Receiver
from standards import ENV, MESSAGE_IDS, RELAY, Report, brokers, database, free_port, query

SAMPLED = "00-%032x-%016x-01"
UNSAMPLED = "00-%032x-%016x-00"


def relay_env(endpoint, **extra):
    env = dict(ENV, OTEL_SERVICE_NAME="orders-relay",
               OTEL_RESOURCE_ATTRIBUTES="deployment.environment=test%20env,team=payments")
    if endpoint:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    env.update(extra)
    return env


def enqueue(url, rows):
    """rows: (payload, traceparent or None, ordering key or None), enqueued in one statement
    (the traceparent as the header outbox.enqueue() would copy it into); returns the job ids."""
    payloads = [json.dumps(payload) for payload, _, _ in rows]
    headers = [json.dumps({"traceparent": tp} if tp else {}) for _, tp, _ in rows]
    keys = [key for _, _, key in rows]
    return [r[0] for r in query(
        url, "SELECT outbox.enqueue('tq', p::jsonb, headers => h::jsonb, ordering_key => k)"
             " FROM unnest(%s::text[], %s::text[], %s::text[]) WITH ORDINALITY AS u(p, h, k, i)"
             " ORDER BY i", (payloads, headers, keys))]


def wait_until(condition, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def metric(port, name):
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))


# ---------------------------------------------------------------- parent and conventions


def check_span(span, row, message_id, system):
    problems = []
    payload, traceparent, key = row
    want = {"messaging.system": system, "messaging.destination.name": "tq",
            "messaging.message.id": message_id, "messaging.operation.type": "publish",
            "outbox.queue": "tq", "outbox.attempt": 1, "outbox.ordering_key": key}
    for name, value in want.items():
        if span["attributes"].get(name) != value:
            problems.append("%s = %r, expected %r" % (name, span["attributes"].get(name), value))
    if traceparent:
        if (span["trace_id"], span["parent_span_id"]) != (traceparent[3:35], traceparent[36:52]):
            problems.append("not a child of the row's traceparent %s" % traceparent)
    elif span["parent_span_id"]:
        problems.append("a row without trace context got a parent")
    wait = span["attributes"].get("outbox.wait_seconds")
    if wait is None or not 0 <= wait < 120:
        problems.append("outbox.wait_seconds = %r" % wait)
    if span["kind"] != 4 or span["name"] != "publish tq" or not 0 < span["start"] <= span["end"]:
        problems.append("kind %d name %r start %d end %d" % (span["kind"], span["name"],
                                                             span["start"], span["end"]))
    if span["resource"].get("service.name") != "orders-relay" or \
            span["resource"].get("deployment.environment") != "test env":
        problems.append("resource %r" % span["resource"])
    return problems


def check_carried(dest, spans):
    """Each message of a recorded span carries that span as its traceparent (Redis: inside
    the headers field), so the consumer's span is the relay's child."""
    redis = dest._connect()
    try:
        entries = redis.call("XRANGE", dest.prefix + "tq", "-", "+")
    finally:
        redis.close()
    carried = {}
    for _, fields in entries:
        values = dict(zip(fields[0::2], fields[1::2]))
        carried[values[b"message_id"].decode()] = json.loads(values[b"headers"]).get("traceparent")
    return ["%s carries %s, not the relay's span %s" % (message_id, carried.get(message_id), want)
            for message_id, want in ((s["attributes"]["messaging.message.id"],
                                      "00-%s-%s-01" % (s["trace_id"], s["span_id"])) for s in spans)
            if carried.get(message_id) != want]


def case_parent(broker):
    cell = "ot_%s_%s" % (broker, brokers.RUN)
    dest, receiver = brokers.DESTINATIONS[broker](cell, ENV), Receiver(free_port())
    receiver.start()
    try:
        url = database(cell)
        rows = [({"n": i}, SAMPLED % (0xabc000 + i, 0xdef000 + i), "k%d" % (i % 3))
                for i in range(20)]
        rows += [({"n": i}, UNSAMPLED % (0xbbb000 + i, 0xccc000 + i), None) for i in range(5)]
        rows += [({"n": i}, None, None) for i in range(5)]
        ids = enqueue(url, rows)
        relay = subprocess.run([RELAY, "--database-url", url, "--once", "--metrics-addr", "off",
                                "--otel-endpoint", "http://127.0.0.1:%d" % receiver.port]
                               + dest.relay_args(), env=relay_env(None), capture_output=True,
                               text=True, timeout=120)
        if relay.returncode != 0:
            return ["relay exited %d: %s" % (relay.returncode, relay.stderr[-400:])]
        spans = receiver.taken()
        message_ids = {job_id: message_id for message_id, job_id in query(url, MESSAGE_IDS)}
        by_id = {s["attributes"].get("messaging.message.id"): s for s in spans}
        problems = [] if len(spans) == 25 else ["%d spans, expected 25 (20 sampled parents,"
                                                " 5 roots; 5 unsampled parents none)" % len(spans)]
        for job_id, row in zip(ids, rows):
            message_id = message_ids[job_id]
            if row[1] and row[1].endswith("-00"):
                if message_id in by_id:
                    problems.append("%s: a span for a row whose parent was not sampled" % job_id)
                continue
            if message_id not in by_id:
                problems.append("%s: no span" % message_id)
                continue
            system = brokers.SERVICE[broker]
            problems += ["%s: %s" % (job_id, p)
                         for p in check_span(by_id[message_id], row, message_id, system)]
        if broker == "redis":
            problems += check_carried(dest, spans)
        return problems
    finally:
        receiver.stop()
        dest.close()


def case_ratio():
    cell = "ot_ratio_%s" % brokers.RUN
    dest, receiver = brokers.DESTINATIONS["redis"](cell, ENV), Receiver(free_port())
    receiver.start()
    try:
        url = database(cell)
        enqueue(url, [({"n": i}, None, None) for i in range(400)])
        env = relay_env(None, OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="0.25")
        subprocess.run([RELAY, "--database-url", url, "--once", "--metrics-addr", "off",
                        "--otel-endpoint", "http://127.0.0.1:%d" % receiver.port]
                       + dest.relay_args(), env=env, capture_output=True, timeout=120)
        count = len(receiver.taken())
        return [] if 60 <= count <= 140 else ["%d of 400 traces sampled at 0.25" % count]
    finally:
        receiver.stop()


# ---------------------------------------------------------------- a collector down, slow, restarted


class Running:
    """A long-running relay on one database, with /metrics."""

    def __init__(self, name, endpoint, **extra):
        self.dest = brokers.DESTINATIONS["redis"](name, ENV)
        self.url = database(name)
        self.metrics_port = free_port()
        args = [RELAY, "--database-url", self.url, "--metrics-addr",
                "127.0.0.1:%d" % self.metrics_port, "--poll-interval", "20ms"]
        args += ["--otel-endpoint", endpoint] if endpoint else []
        self.process = subprocess.Popen(args + self.dest.relay_args(),
                                        env=relay_env(None, **extra),
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def drain(self, rows):
        """Enqueues rows at once; seconds until every one is published and marked."""
        started = time.monotonic()
        ids = enqueue(self.url, rows)
        done = wait_until(lambda: query(self.url, "SELECT count(*) FROM outbox.job WHERE"
                                        " state = 'succeeded' AND job_id >= %s", (ids[0],))[0][0]
                          == len(ids), 120)
        return (time.monotonic() - started) if done else float("inf"), ids

    def stop(self):
        self.process.terminate()
        self.process.wait(30)


ROWS = [({"n": i, "pad": "x" * 100}, SAMPLED % (0xfeed0000 + i, 0xbeef + i), None)
        for i in range(3000)]


def baseline():
    relay = Running("ot_base_%s" % brokers.RUN, None)
    try:
        relay.drain(ROWS[:10])  # connected and warm
        return relay.drain(ROWS)[0]
    finally:
        relay.stop()


def case_collector_trouble(name, base, delay, down):
    port = free_port()
    receiver = Receiver(port)
    receiver.delay = delay
    if not down:
        receiver.start()
    relay = Running("ot_%s_%s" % (name, brokers.RUN), "http://127.0.0.1:%d" % port,
                    OTEL_BSP_MAX_QUEUE_SIZE="200", OTEL_BSP_MAX_EXPORT_BATCH_SIZE="100",
                    OTEL_EXPORTER_OTLP_TIMEOUT="3000")
    try:
        relay.drain(ROWS[:10])
        seconds, _ = relay.drain(ROWS)
        problems = [] if seconds <= base * 1.5 + 1 else [
            "3000 rows drained in %.2f s, %.2f s without spans" % (seconds, base)]
        wait_until(lambda: metric(relay.metrics_port, "outbox_otel_exports_failed_total") > 0, 15)
        dropped = metric(relay.metrics_port, "outbox_otel_spans_dropped_total")
        failed = metric(relay.metrics_port, "outbox_otel_exports_failed_total")
        if dropped < 1 or failed < 1:
            problems.append("dropped %d spans, %d exports failed: expected both > 0" % (dropped, failed))
        print("        %s: drained in %.2f s (without spans %.2f s); dropped %d, failed exports %d"
              % (name, seconds, base, dropped, failed))
        return problems
    finally:
        relay.stop()
        receiver.stop()


def case_restart(base):
    port = free_port()
    receiver = Receiver(port)
    receiver.start()
    relay = Running("ot_restart_%s" % brokers.RUN, "http://127.0.0.1:%d" % port,
                    OTEL_BSP_SCHEDULE_DELAY="200")
    problems = []
    try:
        relay.drain(ROWS[:10])
        for phase in ("before", "down", "after"):
            if phase == "down":
                receiver.stop()
            if phase == "after":
                receiver.start()
            rows = [({"phase": phase, "n": i}, SAMPLED % ({"before": 1, "down": 2, "after": 3}[phase], i + 1), None)
                    for i in range(300)]
            seconds, ids = relay.drain(rows)
            if seconds > base * 1.5 + 1:
                problems.append("%s: 300 rows drained in %.2f s" % (phase, seconds))
            if phase == "down":
                continue
            wanted = {str(job_id) for job_id in ids}
            arrived = lambda: wanted <= {str(s["attributes"].get("outbox.job_id"))
                                          for s in receiver.taken()}
            if not wait_until(arrived, 45):
                problems.append("%s: the spans of its rows did not all arrive" % phase)
        return problems
    finally:
        relay.stop()
        receiver.stop()


def main():
    report = Report("otel")
    cases = sys.argv[1:] or ["parent", "ratio", "down", "slow", "restart"]
    base = baseline() if {"down", "slow", "restart"} & set(cases) else 0
    for case in cases:
        try:
            if case == "parent":
                for broker in ("amqp", "redis", "nats", "kafka"):
                    report.case("parent %s" % broker, case_parent(broker))
                continue
            problems = (case_ratio() if case == "ratio"
                        else case_restart(base) if case == "restart"
                        else case_collector_trouble(case, base, 5.0 if case == "slow" else 0,
                                                    case == "down"))
        except Exception as error:
            problems = ["%s: %s" % (type(error).__name__, error)]
        report.case(case, problems)
    return report.close()


if __name__ == "__main__":
    sys.exit(main())
