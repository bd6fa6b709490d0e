"""brokers.py - the torture checker's own view of each broker.

Every destination is prepared and read here with a client of its own, never with the
relay's code: a few lines of RESP for Redis, of the NATS text protocol for JetStream,
pika for RabbitMQ and confluent-kafka for Kafka. A reader returns every message the
destination holds (or, for RabbitMQ, has handed over so far) as a list of deliveries
(delivery()) in the broker's order; for Kafka, in offset order per partition, which is
the order a key's records are kept in.

A cell (one broker, one mode) has one destination that both of its databases publish
into; its name comes from the cell so that cells never share one.
"""

import base64
import json
import socket
import time


# Names this run's broker objects where an earlier run's would otherwise be read back.
RUN = "%x" % (int(time.time() * 1000) % (1 << 32))


def delivery(payload, message_id=None, job_id=None, headers=None, at=None):
    """One message as the checker reads it: the payload text, the message id and job id the
    broker carries (None where it has no field for them), the headers (a dict, None when the
    broker carries none) and when the broker took it (epoch seconds; None when it does not say)."""
    return {"payload": payload, "message_id": message_id, "job_id": job_id, "headers": headers,
            "at": at}


class Destination:
    """What a relay of a cell needs (relay_args) and what the checker reads."""

    def __init__(self, cell, env):
        self.cell = cell
        self.env = env

    def relay_args(self):
        raise NotImplementedError

    def bad_routing_keys(self):
        """Routing keys of rows this broker must refuse: they end dead, never published."""
        return []

    def bad_headers(self):
        """Row headers this broker reserves: such a row ends dead, never published."""
        return []

    def read(self):
        raise NotImplementedError

    def restarted(self):
        """Sets again what the broker forgot of the run's settings when it restarted."""

    def close(self):
        pass


# ---------------------------------------------------------------- Redis


class Resp:
    """A minimal RESP2 client: enough for AUTH, SET, DEL, XRANGE, CONFIG SET."""

    def __init__(self, host, port, password):
        self.sock = socket.create_connection((host, port), timeout=10)
        self.buffer = b""
        if password:
            self.call("AUTH", password)

    def call(self, *args):
        out = b"*%d\r\n" % len(args)
        for arg in args:
            data = arg if isinstance(arg, bytes) else str(arg).encode()
            out += b"$%d\r\n%s\r\n" % (len(data), data)
        self.sock.sendall(out)
        reply = self._reply()
        if isinstance(reply, RespError):
            raise reply
        return reply

    def _line(self):
        while b"\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def _exact(self, size):
        while len(self.buffer) < size + 2:
            chunk = self.sock.recv(max(65536, size))
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buffer += chunk
        data, self.buffer = self.buffer[:size], self.buffer[size + 2:]
        return data

    def _reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return RespError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            return None if size < 0 else self._exact(size)
        if kind == b"*":
            count = int(rest)
            return None if count < 0 else [self._reply() for _ in range(count)]
        raise ConnectionError("unexpected redis reply %r" % line)

    def close(self):
        self.sock.close()


class RespError(Exception):
    pass


class RedisDestination(Destination):
    def __init__(self, cell, env):
        super().__init__(cell, env)
        self.prefix = "tt_%s:" % cell
        self.port = int(env["OUTBOX_TEST_REDIS_PORT"])
        self.password = env["OUTBOX_TEST_REDIS_PASSWORD"]
        redis = self._connect()
        # acknowledged appends must survive a kill -9 of the server (and again after a restart:
        # redis.conf says everysec, which loses up to a second of them)
        redis.call("CONFIG", "SET", "appendfsync", "always")
        # the whole destination, its dedup and order records too: a seed run again on one stack
        # gives its databases the same ids, and an earlier run's records would drop its messages
        cursor = "0"
        while True:
            cursor, keys = redis.call("SCAN", cursor, "MATCH", "*%s*" % self.prefix, "COUNT", 1000)
            cursor = cursor.decode()
            if keys:
                redis.call("DEL", *keys)
            if cursor == "0":
                break
        # a key of another type: an append to it is refused (WRONGTYPE)
        redis.call("SET", self.prefix + "wrongtype", "not a stream")
        redis.close()

    def _connect(self):
        return Resp("127.0.0.1", self.port, self.password)

    def restarted(self):
        for attempt in range(100):
            try:
                redis = self._connect()
                try:
                    redis.call("CONFIG", "SET", "appendfsync", "always")
                    return
                finally:
                    redis.close()
            except (OSError, RespError):  # still loading its append-only file
                time.sleep(0.1)
        raise RuntimeError("redis did not take appendfsync always after its restart")

    def relay_args(self):
        return ["--broker", self.env["OUTBOX_TEST_REDIS_URL"], "--stream-prefix", self.prefix]

    def bad_routing_keys(self):
        return ["wrongtype"]

    def read(self):
        redis = self._connect()
        try:
            messages, start = [], "-"
            while True:
                entries = redis.call("XRANGE", self.prefix + "tq", start, "+", "COUNT", 1000)
                for entry_id, fields in entries:
                    values = {k.decode(): v.decode() for k, v in zip(fields[0::2], fields[1::2])}
                    try:
                        headers = json.loads(values.get("headers", "{}"))
                    except ValueError:
                        headers = {"?": values.get("headers")}
                    messages.append(delivery(values.get("payload", ""), values.get("message_id"),
                                             values.get("job_id"), headers,
                                             int(entry_id.split(b"-")[0]) / 1000.0))
                if len(entries) < 1000:
                    return messages
                start = "(" + entries[-1][0].decode()
        finally:
            redis.close()


# ---------------------------------------------------------------- NATS JetStream


class Nats:
    """A minimal NATS client for JetStream API requests (request/reply on one inbox)."""

    def __init__(self, host, port):
        self.sock = socket.create_connection((host, port), timeout=10)
        self.buffer = b""
        self._line()  # INFO
        connect = {"verbose": False, "pedantic": False, "headers": True, "no_responders": True,
                   "protocol": 1, "lang": "torture", "version": "1"}
        self.sock.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\r\nSUB _INBOX.torture 1\r\n")

    def _line(self):
        while b"\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("nats closed the connection")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def _exact(self, size):
        while len(self.buffer) < size + 2:
            chunk = self.sock.recv(max(65536, size))
            if not chunk:
                raise ConnectionError("nats closed the connection")
            self.buffer += chunk
        data, self.buffer = self.buffer[:size], self.buffer[size + 2:]
        return data

    def request(self, subject, body):
        data = json.dumps(body).encode()
        self.sock.sendall(b"PUB %s _INBOX.torture %d\r\n%s\r\n" % (subject.encode(), len(data), data))
        while True:
            line = self._line()
            if line.startswith(b"PING"):
                self.sock.sendall(b"PONG\r\n")
            elif line.startswith(b"MSG "):
                parts = line.split()
                return json.loads(self._exact(int(parts[-1])) or b"{}")
            elif line.startswith(b"HMSG "):
                parts = line.split()
                raw = self._exact(int(parts[-1]))
                headers_size = int(parts[-2])
                status = raw[:headers_size].split(b"\r\n", 1)[0]
                if b"503" in status:
                    raise ConnectionError("jetstream: no responders for %s" % subject)
                return json.loads(raw[headers_size:] or b"{}")
            elif line.startswith(b"-ERR"):
                raise ConnectionError(line.decode())

    def close(self):
        self.sock.close()


class NatsDestination(Destination):
    def __init__(self, cell, env):
        super().__init__(cell, env)
        self.stream = "TT_%s" % cell.upper()
        # the row-state cell publishes with no subject prefix, as the default is: a routing key
        # then names the whole subject, the server's API included; a run of a TORTURE_TAG has
        # a prefix in every cell, or its subjects would overlap an untagged run's beside it
        self.prefix = "" if cell == "nats_row" else "tt_%s." % cell
        self.port = int(env["OUTBOX_TEST_NATS_PORT"])
        nats = self._connect()
        nats.request("$JS.API.STREAM.DELETE." + self.stream, {})
        created = nats.request("$JS.API.STREAM.CREATE." + self.stream, {
            "name": self.stream, "subjects": [self.prefix + "tq"], "storage": "file",
            "retention": "limits", "duplicate_window": 120 * 1000 * 1000 * 1000})
        nats.close()
        if "error" in created:
            raise RuntimeError("unable to create stream %s: %s" % (self.stream, created["error"]))

    def _connect(self):
        return Nats("127.0.0.1", self.port)

    def relay_args(self):
        args = ["--broker", self.env["OUTBOX_TEST_NATS_URL"]]
        return args + ["--subject-prefix", self.prefix] if self.prefix else args

    def bad_routing_keys(self):
        # no stream holds the first subject ("no responders"); the others reach into the server's
        # API when there is no prefix: they must die, and the stream keep every message
        return ["nostream", "$JS.API.STREAM.PURGE." + self.stream, "$JS.API.STREAM.DELETE." + self.stream]

    def bad_headers(self):
        return [{"Nats-Rollup": "all"}, {"Nats-Expected-Last-Sequence": "1"}]

    def read(self):
        nats = self._connect()
        try:
            info = nats.request("$JS.API.STREAM.INFO." + self.stream, {})
            if "error" in info:
                raise ConnectionError("stream %s: %s" % (self.stream, info["error"]))
            messages = []
            first, last = info["state"]["first_seq"], info["state"]["last_seq"]
            for seq in range(max(first, 1), last + 1):
                got = nats.request("$JS.API.STREAM.MSG.GET." + self.stream, {"seq": seq})
                if "message" in got:
                    message = got["message"]
                    headers = nats_headers(base64.b64decode(message.get("hdrs", "")).decode())
                    messages.append(delivery(base64.b64decode(message.get("data", "")).decode(),
                                             headers.pop("Nats-Msg-Id", None),
                                             headers.pop("Outbox-Job-Id", None), headers,
                                             rfc3339_seconds(message.get("time"))))
            self.first_seq = first
            return messages
        finally:
            nats.close()


def nats_headers(block):
    """The headers of a NATS message ("NATS/1.0\r\nName: value\r\n..."), as a dict."""
    headers = {}
    for line in block.split("\r\n")[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip()] = value.strip()
    return headers


def rfc3339_seconds(text):
    """Epoch seconds of JetStream's message time (nanoseconds, UTC), None when absent."""
    import calendar

    if not text:
        return None
    whole, _, fraction = text.rstrip("Z").partition(".")
    seconds = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
    return seconds + float("0." + (fraction or "0"))


# ---------------------------------------------------------------- RabbitMQ


class AmqpDestination(Destination):
    def __init__(self, cell, env):
        super().__init__(cell, env)
        import pika

        self.exchange = "tt_%s" % cell
        self.queue = "tt_%s_q" % cell
        self.url = env["OUTBOX_TEST_AMQP_URL"]
        self.received = []
        channel = self._channel()
        channel.exchange_declare(self.exchange, exchange_type="direct", durable=True)
        channel.queue_declare(self.queue, durable=True)
        channel.queue_purge(self.queue)
        channel.queue_bind(self.queue, self.exchange, routing_key="tq")
        self._close()

    def _channel(self):
        import pika

        self.connection = pika.BlockingConnection(pika.URLParameters(self.url))
        return self.connection.channel()

    def _close(self):
        try:
            self.connection.close()
        except Exception:
            pass

    def relay_args(self):
        return ["--broker", self.env["OUTBOX_TEST_AMQP_URL"], "--exchange", self.exchange]

    def bad_routing_keys(self):
        # bound to no queue: returned as unroutable
        return ["nowhere"]

    def bad_headers(self):
        # sender-selected distribution: would route a copy past the exchange's bindings
        return [{"CC": "tt_other"}, {"BCC": "tt_other"}]

    def read(self):
        """Takes (and acks) what the queue holds now; returns all taken so far."""
        channel = self._channel()
        try:
            while True:
                method, properties, body = channel.basic_get(self.queue, auto_ack=False)
                if method is None:
                    break
                headers = {k: (v.decode() if isinstance(v, bytes) else v)
                           for k, v in (properties.headers or {}).items()}
                self.received.append(delivery(body.decode(), properties.message_id, None, headers))
                channel.basic_ack(method.delivery_tag)
        finally:
            self._close()
        return list(self.received)


# ---------------------------------------------------------------- Kafka


class KafkaDestination(Destination):
    PARTITIONS = 3

    def __init__(self, cell, env):
        super().__init__(cell, env)
        from confluent_kafka.admin import AdminClient, NewTopic

        # a topic of this run alone: an earlier run's records (make test runs two seeds on
        # one stack) carry the same tokens and would be judged as this run's deliveries
        self.prefix = "tt_%s_%s." % (cell, RUN)
        self.topic = self.prefix + "tq"
        self.bootstrap = env["OUTBOX_TEST_KAFKA_URL"].split("://", 1)[1]
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        for future in self.admin.create_topics([NewTopic(self.topic, self.PARTITIONS, 1)]).values():
            future.result(30)

    def close(self):
        try:
            for future in self.admin.delete_topics([self.topic]).values():
                future.result(30)
        except Exception:
            pass  # the stack's Kafka is thrown away with its directory

    def relay_args(self):
        return ["--broker", self.env["OUTBOX_TEST_KAFKA_URL"], "--topic-prefix", self.prefix]

    def bad_routing_keys(self):
        # no such topic (the relay never creates topics, the broker does not either)
        return ["notopic"]

    def read(self):
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "torture-checker",
                             "enable.auto.commit": False, "enable.partition.eof": True,
                             "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                             "log_level": 3})
        try:
            partitions = [TopicPartition(self.topic, p, 0) for p in range(self.PARTITIONS)]
            consumer.assign(partitions)
            per_partition = {p: [] for p in range(self.PARTITIONS)}
            at_end = set()
            deadline = time.monotonic() + 60
            while len(at_end) < self.PARTITIONS and time.monotonic() < deadline:
                record = consumer.poll(1.0)
                if record is None:
                    continue
                if record.error():
                    if record.error().code() == -191:  # _PARTITION_EOF
                        at_end.add(record.partition())
                        continue
                    raise ConnectionError(str(record.error()))
                headers = {k: (v.decode() if v is not None else None) for k, v in (record.headers() or [])}
                # the record's timestamp is the row's created_at (sink_kafka.c), not when it went
                per_partition[record.partition()].append(delivery(
                    record.value().decode(), headers.pop("message-id", None),
                    headers.pop("outbox-job-id", None), headers))
            if len(at_end) < self.PARTITIONS:
                raise ConnectionError("kafka: the partitions' ends were not reached in 60 s")
            return [value for p in range(self.PARTITIONS) for value in per_partition[p]]
        finally:
            consumer.close()


DESTINATIONS = {
    "amqp": AmqpDestination,
    "redis": RedisDestination,
    "nats": NatsDestination,
    "kafka": KafkaDestination,
}

# Brokers that promise at most one append per job (Redis' dedup record, NATS' duplicate
# window); RabbitMQ and Kafka are at least once and consumers deduplicate.
AT_MOST_ONCE = {"redis", "nats"}
# Their dedup windows in seconds (Redis' record: the relay's default 24 h; the JetStream
# streams made above: 120 s): appends further apart than that are not promised away.
DEDUP_WINDOW = {"redis": 86400, "nats": 120}
# Brokers where a replay appends exactly once more (CONTRACT.md: "Redis: once more per
# replay, even inside the dedup window"): a job delivered exactly 1 + its replays times.
EXACT_REPLAYS = {"redis"}
# The stack's service behind each broker, for its faults.
SERVICE = {"amqp": "rabbitmq", "redis": "redis", "nats": "nats", "kafka": "kafka"}
