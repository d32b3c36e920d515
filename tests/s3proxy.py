"""A fault-injecting proxy on the loopback, in front of the test S3 server: it passes
requests through, except those a rule matches, which it answers with an error (503
SlowDown, 500) or by dropping the connection, as often as the rule says."""

from __future__ import annotations

import http.client
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_ERRORS = {
    503: ("SlowDown", "Please reduce your request rate."),
    500: ("InternalError", "We encountered an internal error. Please try again."),
}


@dataclass
class Rule:
    """Requests of `method` whose path matches `path` (a regex), answered with `fault`
    (503, 500, or "drop") `times` times (None: always)."""

    method: str
    path: str
    fault: int | str
    times: int | None = None
    hits: int = 0

    def take(self, method: str, path: str) -> bool:
        if method != self.method or not re.search(self.path, path):
            return False
        if self.times is not None and self.hits >= self.times:
            return False
        self.hits += 1
        return True


class FaultProxy:
    """Serves on 127.0.0.1 (`endpoint`), forwarding to `upstream` (an http:// URL)."""

    def __init__(self, upstream: str) -> None:
        self.rules: list[Rule] = []
        self.seen: list[tuple[str, str]] = []
        self.headers: list[tuple[str, str, dict[str, str]]] = []  # each request's, as sent
        self._lock = threading.Lock()
        target = urlsplit(upstream)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with proxy._lock:
                    sent = {k.lower(): v for k, v in self.headers.items()}
                    proxy.headers.append((self.command, self.path, sent))
                fault = proxy._fault(self.command, self.path)
                if fault == "drop":
                    self.close_connection = True
                    self.connection.close()
                    return
                if isinstance(fault, int):
                    code, message = _ERRORS[fault]
                    xml = (
                        f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
                        f"<Message>{message}</Message></Error>"
                    ).encode()
                    self.send_response(fault)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(xml)))
                    self.end_headers()
                    self.wfile.write(xml)
                    return
                upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                # the body is read already: no `Expect: 100-continue` goes on
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in ("host", "expect")
                }
                headers["Host"] = target.netloc
                upstream.request(self.command, self.path, body=body, headers=headers)
                reply = upstream.getresponse()
                data = reply.read()
                self.send_response(reply.status, reply.reason)
                length = reply.getheader("Content-Length") if self.command == "HEAD" else None
                for key, value in reply.getheaders():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(key, value)
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                upstream.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _fault(self, method: str, path: str) -> int | str | None:
        with self._lock:
            self.seen.append((method, path))
            for rule in self.rules:
                if rule.take(method, path):
                    return rule.fault
        return None

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
