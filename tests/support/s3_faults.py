"""A fault a real S3 server cannot be made to give, put in front of one: `SlowDown` (HTTP 503, what
S3 answers a client it throttles). S3Faults is a small HTTP proxy on a loopback port that forwards
every request to the real server (SeaweedFS) unchanged, Host header included, so the client's
SigV4 signature still holds; while `storm` is set, it answers every part of a multipart upload
(a PUT with a partNumber: the upload is begun, its data throttled) and every whole-object PUT with
503 SlowDown instead, and counts them. Only the clients pointed at it (one rank) see the storm.

    faults = S3Faults(server.endpoint).start()   # faults.endpoint; faults.storm = True
    faults.stop()
"""
from __future__ import annotations

import http.client
import http.server
import threading
import urllib.parse

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b'<Message>Please reduce your request rate.</Message></Error>')


class S3Faults:
    def __init__(self, upstream: str):
        self.upstream = urllib.parse.urlsplit(upstream)
        self.storm = False
        self.refused = 0
        self._lock = threading.Lock()
        self.server: http.server.ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> "S3Faults":
        faults = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if faults.storm and self.command == "PUT":
                    with faults._lock:
                        faults.refused += 1
                    self.send_response(503, "Slow Down")
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(SLOW_DOWN)))
                    self.end_headers()
                    self.wfile.write(SLOW_DOWN)
                    return
                conn = http.client.HTTPConnection(faults.upstream.hostname, faults.upstream.port, timeout=120)
                try:
                    conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                    for name, value in self.headers.items():
                        conn.putheader(name, value)
                    conn.endheaders(body)
                    reply = conn.getresponse()
                    data = reply.read()
                    self.send_response(reply.status, reply.reason)
                    for name, value in reply.getheaders():
                        if name.lower() not in ("transfer-encoding", "content-length", "connection"):
                            self.send_header(name, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True, name="s3-faults").start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
