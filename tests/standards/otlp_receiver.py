"""otlp_receiver.py - an OTLP/HTTP trace receiver for the tests, on the protocol's own messages.

Accepts POST /v1/traces with OTLP/JSON (application/json) or protobuf
(application/x-protobuf) and parses the body into opentelemetry-proto's
ExportTraceServiceRequest (the PyPI package `opentelemetry-proto`), so a body that is
not a valid request is answered 400 and counted as refused. OTLP/JSON writes trace and
span ids as hex where protobuf's JSON mapping expects base64: they are converted first,
as a collector does. Each span is kept as a small dict. `delay` makes every answer wait
(a slow collector); stop() and start() again on the same port is a restart.
"""

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse)


def _value(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def _hex_to_base64(obj):
    for resource in obj.get("resourceSpans", []):
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()


class Receiver:
    def __init__(self, port):
        self.port = port
        self.delay = 0.0
        self.spans = []
        self.requests = 0
        self.refused = 0
        self.lock = threading.Lock()
        self.server = None
        self.stop_event = threading.Event()

    def _handler(self):
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if receiver.delay:
                    receiver.stop_event.wait(receiver.delay)
                try:
                    request = receiver.parse(body, self.headers.get("Content-Type", ""))
                except Exception as error:  # not an OTLP request
                    with receiver.lock:
                        receiver.refused += 1
                    self.send_response(400)
                    self.end_headers()
                    self.wfile.write(str(error).encode()[:200])
                    return
                receiver.keep(request, self.path)
                answer = json_format.MessageToJson(ExportTraceServiceResponse()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                try:
                    self.wfile.write(answer)
                except OSError:
                    pass  # a client that gave up on a slow answer

        return Handler

    @staticmethod
    def parse(body, content_type):
        request = ExportTraceServiceRequest()
        if content_type.startswith("application/x-protobuf"):
            request.ParseFromString(body)
        else:
            obj = json.loads(body)
            _hex_to_base64(obj)
            json_format.ParseDict(obj, request)
        return request

    def keep(self, request, path):
        kept = []
        for resource in request.resource_spans:
            resource_attributes = {a.key: _value(a.value) for a in resource.resource.attributes}
            for scope in resource.scope_spans:
                for span in scope.spans:
                    kept.append({
                        "path": path, "resource": resource_attributes, "scope": scope.scope.name,
                        "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(), "name": span.name,
                        "kind": span.kind, "trace_state": span.trace_state,
                        "start": span.start_time_unix_nano, "end": span.end_time_unix_nano,
                        "attributes": {a.key: _value(a.value) for a in span.attributes},
                        "status": span.status.code, "status_message": span.status.message,
                    })
        with self.lock:
            self.requests += 1
            self.spans.extend(kept)

    def start(self):
        self.stop_event.clear()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.stop_event.set()  # slow answers end now
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def taken(self):
        with self.lock:
            return list(self.spans)


def main():
    """`otlp_receiver.py PORT`: a collector for the bench that takes every export (200)
    without decoding it, counting spans by their ids; SIGTERM prints the count and exits."""
    import signal
    import sys

    counts = {"requests": 0, "spans": 0}

    class Counting(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            counts["requests"] += 1
            counts["spans"] += body.count(b'"spanId"')
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Counting)

    def done(*_):
        print("requests=%d spans=%d" % (counts["requests"], counts["spans"]), flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, done)
    server.serve_forever()


if __name__ == "__main__":
    main()
