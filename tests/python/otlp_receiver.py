"""An OTLP/HTTP trace receiver for the tests: decodes what it is sent with OpenTelemetry's own
protobuf definitions (the `opentelemetry-proto` package) and prints each span as a JSON line.

usage: otlp_receiver.py [--delay SECONDS] [--discard]
Prints `listening PORT` first (it binds a free loopback port), then one line per span:
{"trace_id", "span_id", "parent_span_id", "name", "kind", "flags", "start", "end", "status",
 "attributes", "service"}. With --delay it waits that long before answering each export, as a
collector that has fallen behind does. With --discard it answers without decoding or printing
(a collector that costs nothing, for measuring the gateway's side of exporting).
"""

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

delay = float(sys.argv[sys.argv.index("--delay") + 1]) if "--delay" in sys.argv else 0.0
discard = "--discard" in sys.argv


def value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind is None:
        return None
    return getattr(v, kind)


def attributes(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
            self.send_response(415 if self.path == "/v1/traces" else 404)
            self.end_headers()
            return
        request = ExportTraceServiceRequest()
        if not discard:
            request.ParseFromString(body)
        if delay:
            time.sleep(delay)
        for rs in request.resource_spans:
            service = attributes(rs.resource.attributes).get("service.name")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    print(json.dumps({
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex(),
                        "name": s.name,
                        "kind": s.kind,
                        "flags": s.flags,
                        "start": s.start_time_unix_nano,
                        "end": s.end_time_unix_nano,
                        "status": s.status.code,
                        "attributes": attributes(s.attributes),
                        "service": service,
                        "scope": ss.scope.name,
                    }), flush=True)
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(f"listening {server.server_address[1]}", flush=True)
server.serve_forever()
