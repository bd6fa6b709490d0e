"""cloudevents_consumer.py - the CloudEvents SDK reads what the relay published.

For each broker (amqp, redis, nats, kafka, or those named on the command line) and each
mode (binary, structured): rows go into a fresh database, `outbox-relay --once
--cloudevents MODE` publishes them, a client of the test's own reads every message with
its headers, and the CloudEvents Python SDK (`cloudevents` from PyPI) parses it by the
broker's binding: Kafka's and AMQP's bindings as the SDK has them, NATS' binary mode
through the HTTP binding (the same ce- headers), Redis' fields as Kafka headers (the
relay names them so). Every message must parse, carry the row's payload as data (JSON
as JSON), the broker's own message id as id, and the attributes the row asked for.

Environment: the stack's DIR/env, OUTBOX_BIN, OUTBOX_SOURCE_DIR (as tests/run.sh sets).
Prints one line per cell and 'N passed, N failed'; exit 1 on any failure.
"""

import base64
import json
import subprocess
import sys
import time

import psycopg2
from cloudevents.core.bindings import amqp as ce_amqp
from cloudevents.core.bindings import http as ce_http
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat

from standards import ENV, MESSAGE_IDS, RELAY, Report, brokers, database, query

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
# (payload, headers, ordering key): what a producer writes; the queue is "tq"
ROWS = [
    ({"order": 1, "lines": [{"sku": "a", "n": 2}], "note": "caf\u00e9"},
     {"ce_type": "com.example.order.created", "ce_subject": "order/1", "ce_tenant": "acme",
      "x-other": "kept"}, "customer-7"),
    ([1, 2, 3], {}, None),
    ("just a string", {"ce_dataschema": "https://example.com/schema/v1"}, "customer-7"),
    (42, {"ce_type": "com.example.number"}, None),
    ({"nested": {"deep": [True, None, 1.5]}}, {}, "customer-8"),
]


def enqueue(url):
    """Enqueues ROWS in one transaction with a trace context; returns {job_id: row}."""
    conn = psycopg2.connect(url)
    out = {}
    with conn, conn.cursor() as cur:
        cur.execute("SET LOCAL outbox.traceparent = %s", (TRACEPARENT,))
        for payload, headers, key in ROWS:
            cur.execute("SELECT outbox.enqueue('tq', %s::jsonb, headers => %s::jsonb,"
                        " ordering_key => %s)", (json.dumps(payload), json.dumps(headers), key))
            out[cur.fetchone()[0]] = (payload, headers, key)
        cur.execute("SELECT job_id, extract(epoch FROM created_at) FROM outbox.job")
        created = dict(cur.fetchall())
        cur.execute(MESSAGE_IDS)
        created["message_ids"] = dict(cur.fetchall())
    conn.close()
    return out, created


# ---------------------------------------------------------------- readers: (event, message id)


def text(value):
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def read_amqp(dest):
    channel = dest._channel()
    got = []
    try:
        while True:
            method, props, body = channel.basic_get(dest.queue, auto_ack=True)
            if method is None:
                break
            headers = {k: text(v) for k, v in (props.headers or {}).items()}
            message = ce_amqp.AMQPMessage(properties={"content-type": props.content_type},
                                          application_properties=headers, application_data=body)
            got.append((ce_amqp.from_amqp(message, JSONFormat()), props.message_id))
    finally:
        dest._close()
    return got


def read_redis(dest):
    redis = dest._connect()
    try:
        entries = redis.call("XRANGE", dest.prefix + "tq", "-", "+")
    finally:
        redis.close()
    got = []
    for _, fields in entries:
        values = {text(k): v for k, v in zip(fields[0::2], fields[1::2])}
        headers = {k: v for k, v in values.items() if k.startswith("ce_") or k == "content-type"}
        message = ce_kafka.KafkaMessage(headers=headers, key=None, value=values["payload"])
        got.append((ce_kafka.from_kafka(message, JSONFormat()), text(values["message_id"])))
    return got


def nats_headers(raw):
    lines = raw.decode().split("\r\n")[1:]
    return dict(line.split(": ", 1) for line in lines if ": " in line)


def read_nats(dest):
    nats = dest._connect()
    got = []
    try:
        info = nats.request("$JS.API.STREAM.INFO." + dest.stream, {})
        for seq in range(info["state"]["first_seq"], info["state"]["last_seq"] + 1):
            message = nats.request("$JS.API.STREAM.MSG.GET." + dest.stream, {"seq": seq})["message"]
            headers = nats_headers(base64.b64decode(message.get("hdrs", "")))
            body = base64.b64decode(message.get("data", ""))
            event = ce_http.from_http(ce_http.HTTPMessage(headers=headers, body=body), JSONFormat())
            got.append((event, headers["Nats-Msg-Id"]))
    finally:
        nats.close()
    return got


def read_kafka(dest):
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": dest.bootstrap, "group.id": "ce-test",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "log_level": 3})
    got, at_end, deadline = [], set(), time.monotonic() + 60
    try:
        consumer.assign([TopicPartition(dest.topic, p, 0) for p in range(dest.PARTITIONS)])
        while len(at_end) < dest.PARTITIONS and time.monotonic() < deadline:
            record = consumer.poll(1.0)
            if record is None:
                continue
            if record.error():
                at_end.add(record.partition())
                continue
            headers = {k: v for k, v in (record.headers() or [])}
            message = ce_kafka.KafkaMessage(headers=headers, key=record.key(), value=record.value())
            got.append((ce_kafka.from_kafka(message, JSONFormat()), text(headers["message-id"])))
    finally:
        consumer.close()
    return got


READERS = {"amqp": read_amqp, "redis": read_redis, "nats": read_nats, "kafka": read_kafka}


# ---------------------------------------------------------------- one cell


def check_event(event, message_id, rows, created, database_id):
    """Problems of one parsed event, compared with the row it came from."""
    job_id = created["message_ids"][message_id]
    payload, headers, key = rows[job_id]
    attributes = event.get_attributes()
    want = {
        "specversion": "1.0", "id": message_id, "source": "urn:outbox:" + database_id,
        "type": headers.get("ce_type", "tq"), "datacontenttype": "application/json",
        "subject": headers.get("ce_subject"), "traceparent": TRACEPARENT, "partitionkey": key,
        "tenant": headers.get("ce_tenant"), "dataschema": headers.get("ce_dataschema"),
    }
    problems = ["%s: %r, expected %r" % (name, attributes.get(name), value)
                for name, value in want.items() if attributes.get(name) != value]
    if event.get_data() != payload:
        problems.append("data: %r, expected the payload %r" % (event.get_data(), payload))
    if abs(event.get_time().timestamp() - float(created[job_id])) > 1e-5:
        problems.append("time: %s, created_at %s" % (event.get_time(), created[job_id]))
    if "x-other" in attributes or "ce_type" in attributes:
        problems.append("a row header that is no attribute became one")
    return problems


def run_cell(broker, mode):
    cell = "ce_%s_%s_%s" % (mode, broker, brokers.RUN)  # redis dedups a job id for 24 h
    dest = brokers.DESTINATIONS[broker](cell, ENV)
    try:
        url = database(cell)
        rows, created = enqueue(url)
        database_id = query(url, "SELECT database_id FROM outbox.identity")[0][0]
        relay = subprocess.run([RELAY, "--database-url",
                                url, "--once", "--metrics-addr", "off", "--cloudevents", mode]
                               + dest.relay_args(), capture_output=True, text=True, timeout=120)
        if relay.returncode != 0:
            return ["relay exited %d: %s" % (relay.returncode, relay.stderr[-500:])]
        got = READERS[broker](dest)
        problems = [] if len(got) == len(rows) else [
            "%d messages read, %d rows enqueued" % (len(got), len(rows))]
        for event, message_id in got:
            problems += ["%s: %s" % (message_id, p)
                         for p in check_event(event, message_id, rows, created, database_id)]
        return problems
    finally:
        dest.close()


def main():
    report = Report("cloudevents")
    for broker in sys.argv[1:] or ["amqp", "redis", "nats", "kafka"]:
        for mode in ("binary", "structured"):
            try:
                problems = run_cell(broker, mode)
            except Exception as error:  # a message the SDK refused lands here
                problems = ["%s: %s" % (type(error).__name__, error)]
            report.case("%s %s" % (broker, mode), problems)
    return report.close()


if __name__ == "__main__":
    sys.exit(main())
