# SPDX-License-Identifier: Apache-2.0
"""A fault-injecting HTTP/1.1 proxy for the S3 tests: passes requests through to one upstream server with keep-alive and streamed bodies, and, on a programmable schedule, answers 503 SlowDown or 500 InternalError, resets the connection before or during a response, or stalls; it counts requests by kind and logs each one (method, target, status, bytes), so a test can prove retries happened and a bench can count requests."""

from __future__ import annotations

import contextlib
import http.client
import math
import select
import socket
import struct
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO

# A gate's answer to a request it stops: status, headers (pairs or a mapping; the proxy adds
# Content-Length and Connection), body.
GateAnswer = tuple[int, Iterable[tuple[str, str]] | Mapping[str, str], bytes]
# Consulted with (method, target, headers with lower-case names) for each request head before the
# fault rules: None forwards the request (the rules still apply), an answer is sent instead.
Gate = Callable[[str, str, Mapping[str, str]], GateAnswer | None]

# What a rule can do to a request it matches.
#   "503"        answer 503 SlowDown (S3's XML error body)
#   "500"        answer 500 InternalError
#   "reset"      reset the client's connection (RST: SO_LINGER 0) as soon as the head is read
#   "reset_body" forward, then reset after the response head and half of its body
#   "stall"      send nothing for stall_s seconds after the head (math.inf: until clear() or
#                close()), then reset, or with resume=True go on as if nothing happened; a stall
#                that clear() ends always goes on
#   "stall_body" forward, send the response head and half the body, stall stall_s seconds, reset
ACTIONS = ("503", "500", "reset", "reset_body", "stall", "stall_body")
COPY = 1 << 20  # bytes per streamed piece


@dataclass
class Seen:
    """One request the proxy saw, for a per-request log: its method and target (path and
    query), its kind(), the bytes of its body (Content-Length), and, once answered, the status
    and the bytes of the answer's body by its Content-Length (0 until then, for a HEAD, and for
    an answer without one). Logged under the proxy's lock; read the answers once the traffic
    is over."""

    method: str
    target: str
    kind: str
    sent: int
    status: int = 0
    received: int = 0


@dataclass
class Rule:
    """Which requests a fault hits. A request matches when its method is ``method`` (None: any)
    and ``match`` (None: any) is a substring of its target (path and query, e.g.
    "partNumber=", "uploads", "/manifest"). Of the matching requests, the rule fires on every
    ``every``-th (0: each one), after skipping the first ``skip``, at most ``count`` times
    (None: no limit). "The next K part uploads": Rule("503", "PUT", "partNumber=", count=K)."""

    action: str
    method: str | None = None
    match: str | None = None
    every: int = 0
    skip: int = 0
    count: int | None = None
    stall_s: float = 5.0
    resume: bool = False
    seen: int = 0  # matching requests so far
    fired: int = 0  # times the fault was injected

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown fault {self.action!r}: one of {ACTIONS}")

    def hit(self, method: str, target: str) -> bool:
        """Whether this request gets the fault (counts it; call once per request)."""
        if self.method is not None and method != self.method:
            return False
        if self.match is not None and self.match not in target:
            return False
        self.seen += 1
        n = self.seen - self.skip
        if n <= 0 or (self.count is not None and self.fired >= self.count):
            return False
        if self.every and n % self.every:
            return False
        self.fired += 1
        return True


def kind(method: str, target: str, headers: dict[str, str]) -> str:
    """The S3 operation a request is, for counting: "PUT part", "PUT object", "POST create",
    "POST complete", "DELETE abort", "DELETE object", "GET range", "GET object", "GET list",
    "HEAD" or method and "other"."""
    path, _, query = target.partition("?")
    q = urllib.parse.parse_qs(query, keep_blank_values=True)
    on_bucket = path.strip("/").count("/") == 0
    if method == "PUT":
        return "PUT part" if "partNumber" in q else "PUT object"
    if method == "POST":
        return "POST create" if "uploads" in q else "POST complete" if "uploadId" in q else "POST other"
    if method == "DELETE":
        return "DELETE abort" if "uploadId" in q else "DELETE object"
    if method == "GET":
        if on_bucket:
            return "GET list"
        return "GET range" if "range" in headers else "GET object"
    if method == "HEAD":
        return "HEAD"
    return f"{method} other"


def _error_body(code: str, message: str, target: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
            f"<Resource>{target}</Resource><RequestId>faultproxy</RequestId></Error>").encode()  # fmt: skip


def _reset(sock: socket.socket) -> None:
    """Close with SO_LINGER 0: the peer sees ECONNRESET, not an orderly end."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class _Dropped(Exception):
    """The connection is over (reset injected, peer gone): stop serving it."""


@dataclass
class _Head:
    line: str
    headers: list[tuple[str, str]] = field(default_factory=list)

    def get(self, name: str) -> str | None:
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    def encode(self, drop: tuple[str, ...] = ()) -> bytes:
        lines = [self.line] + [f"{k}: {v}" for k, v in self.headers if k.lower() not in drop]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _read_head(f: BinaryIO) -> _Head | None:
    """An HTTP head from ``f``; None at a clean end of the connection."""
    line = f.readline(65537)
    while line in (b"\r\n", b"\n"):  # stray CRLF between messages
        line = f.readline(65537)
    if not line:
        return None
    head = _Head(line.decode("latin-1").rstrip("\r\n"))
    while True:
        h = f.readline(65537)
        if not h:
            raise _Dropped("connection closed inside a head")
        if h in (b"\r\n", b"\n"):
            return head
        k, _, v = h.decode("latin-1").partition(":")
        head.headers.append((k.strip(), v.strip()))


def _copy_body(head: _Head, src: BinaryIO, dst: socket.socket | None, no_body: bool = False,
               limit: int | None = None) -> bool:  # fmt: skip
    """Stream the body that follows ``head`` from ``src`` to ``dst`` (None: discard), piece by
    piece. ``limit``: stop after about that many bytes (returns False: body not finished).
    Returns whether the message delimits its own end (False: it runs until the connection
    closes)."""
    if no_body:
        return True
    te = (head.get("transfer-encoding") or "").lower()
    sent = 0

    def out(b: bytes) -> None:
        nonlocal sent
        if dst is not None and b:
            dst.sendall(b)
        sent += len(b)

    if "chunked" in te:
        while True:
            size_line = src.readline(65537)
            if not size_line:
                raise _Dropped("connection closed inside a chunked body")
            out(size_line)
            n = int(size_line.split(b";")[0].strip(), 16)
            if n == 0:
                while True:  # trailers up to the empty line
                    t = src.readline(65537)
                    out(t)
                    if t in (b"\r\n", b"\n", b""):
                        return True
            rem = n + 2  # data and its CRLF
            while rem:
                b = src.read(min(rem, COPY))
                if not b:
                    raise _Dropped("connection closed inside a chunk")
                out(b)
                rem -= len(b)
                if limit is not None and sent >= limit:
                    return False
    cl = head.get("content-length")
    if cl is not None:
        rem = int(cl)
        while rem:
            b = src.read(min(rem, COPY, limit - sent if limit is not None else COPY) or 1)
            if not b:
                raise _Dropped("connection closed inside a body")
            out(b)
            rem -= len(b)
            if limit is not None and sent >= limit and rem:
                return False
        return True
    if head.line.startswith("HTTP/"):  # a response without length: until the connection ends
        while True:
            b = src.read1(COPY) if hasattr(src, "read1") else src.read(COPY)
            if not b:
                return False
            out(b)
            if limit is not None and sent >= limit:
                return False
    return True  # a request without a body


class FaultProxy:
    """The proxy: ``FaultProxy(upstream_endpoint)``, ``start()`` (or a ``with`` block), then
    point clients at ``endpoint`` (``env(server_env)`` gives a copy of a server's client
    environment that does). ``add(Rule(...))`` schedules faults; ``counts`` (Counter by kind(),
    every request the proxy saw) and ``injected`` (Counter by (kind, action)) tell what
    happened; ``log`` lists every request as a Seen, in the order the proxy read their heads.
    Thread-safe; one thread per client connection. ``gate`` (argument or attribute; see Gate)
    answers requests itself before any rule sees them; those are counted in ``counts`` and
    ``log`` too and in ``gated`` (Counter by (kind, status))."""

    def __init__(self, upstream: str, gate: Gate | None = None) -> None:
        u = urllib.parse.urlsplit(upstream)
        assert u.scheme == "http" and u.hostname, upstream
        self.upstream = (u.hostname, u.port or 80)
        self.rules: list[Rule] = []
        self.counts: Counter[str] = Counter()
        self.injected: Counter[tuple[str, str]] = Counter()
        self.gate = gate
        self.gated: Counter[tuple[str, int]] = Counter()
        self.connections = 0  # client connections accepted (keep-alive shows as few)
        self.sizes: dict[str, list[int]] = {}  # request body lengths (Content-Length) by kind
        self.log: list[Seen] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._socks: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"

    # --- schedule and counts --------------------------------------------------------------

    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        """No more faults (stalls in progress end now); counts are kept."""
        with self._lock:
            self.rules.clear()

    def reset_counts(self) -> None:
        with self._lock:
            self.counts.clear()
            self.injected.clear()
            self.gated.clear()
            self.sizes.clear()
            self.log.clear()
            self.connections = 0

    def total(self, prefix: str = "") -> int:
        """Requests seen whose kind starts with ``prefix``."""
        with self._lock:
            return sum(n for k, n in self.counts.items() if k.startswith(prefix))

    def env(self, server_env: dict[str, str]) -> dict[str, str]:
        return {**server_env, "AWS_ENDPOINT_URL": self.endpoint}

    # --- life -------------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        self._listener.listen(128)
        self._listener.settimeout(0.2)
        t = threading.Thread(target=self._accept, name="faultproxy-accept", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def close(self) -> None:
        """Stop accepting, end every stall and connection, join the threads (bounded)."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        for t in self._threads:
            t.join(5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- the work -----------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                c, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            c.settimeout(None)
            t = threading.Thread(target=self._serve, args=(c,), name="faultproxy-conn", daemon=True)
            with self._lock:
                self._socks.add(c)
                self.connections += 1
                self._threads = [x for x in self._threads if x.is_alive()]
                self._threads.append(t)
            t.start()

    def _count(self, method: str, target: str, k: str, length: int) -> Seen:
        """Count a request (the lock held) and log it."""
        self.counts[k] += 1
        self.sizes.setdefault(k, []).append(length)
        seen = Seen(method, target, k, length)
        self.log.append(seen)
        return seen

    def _fault(self, method: str, target: str, k: str, length: int) -> tuple[Rule | None, Seen]:
        with self._lock:
            seen = self._count(method, target, k, length)
            for r in self.rules:
                if r.hit(method, target):
                    self.injected[(k, r.action)] += 1
                    return r, seen
        return None, seen

    def _stall(self, seconds: float) -> bool:
        """Wait ``seconds`` (inf: until close() or clear()); True when clear() ended it."""
        end = time.monotonic() + seconds
        while not self._stop.is_set() and time.monotonic() < end:
            with self._lock:
                if not self.rules:
                    return True
            self._stop.wait(min(0.1, max(0.0, end - time.monotonic())))
        return False

    def _serve(self, c: socket.socket) -> None:
        cf = c.makefile("rb")
        up: socket.socket | None = None
        uf: BinaryIO | None = None
        hard = True  # an unfinished exchange is cut hard (RST), never left half-open

        def drop_upstream() -> None:
            nonlocal up, uf
            if up is not None:
                with self._lock:
                    self._socks.discard(up)
                if uf is not None:
                    uf.close()
                up.close()
            up = uf = None

        try:
            while not self._stop.is_set():
                hard = True
                head = _read_head(cf)
                if head is None:
                    hard = False
                    return
                method, target = head.line.split(" ")[0], head.line.split(" ")[1]
                hdrs = {k.lower(): v for k, v in head.headers}
                length = int(hdrs.get("content-length") or 0)
                gate = self.gate
                answer = gate(method, target, hdrs) if gate is not None else None
                if answer is not None:
                    k = kind(method, target, hdrs)
                    with self._lock:
                        seen = self._count(method, target, k, length)
                        self.gated[(k, answer[0])] += 1
                    seen.status, seen.received = answer[0], 0 if method == "HEAD" else len(answer[2])
                    if (head.get("expect") or "").lower() == "100-continue":
                        close_after = True  # the body never comes: answer and close
                    else:
                        close_after = (head.get("connection") or "").lower() == "close"
                        _copy_body(head, cf, None)
                    status, extra, body = answer
                    pairs = list(extra.items() if isinstance(extra, Mapping) else extra)
                    pairs = [(n, v) for n, v in pairs if n.lower() not in ("content-length", "connection")]
                    c.sendall((f"HTTP/1.1 {status} {http.client.responses.get(status, 'Unknown')}\r\n"
                               + "".join(f"{n}: {v}\r\n" for n, v in pairs)
                               + f"Content-Length: {len(body)}\r\n"
                               f"Connection: {'close' if close_after else 'keep-alive'}\r\n\r\n").encode("latin-1")
                              + (b"" if method == "HEAD" else body))  # fmt: skip
                    hard = False
                    if close_after:
                        return
                    continue
                rule, seen = self._fault(method, target, kind(method, target, hdrs), length)
                expect = (head.get("expect") or "").lower() == "100-continue"
                close_after = (head.get("connection") or "").lower() == "close"
                act = rule.action if rule else ""
                if act == "reset":
                    raise _Dropped("reset injected")
                if act == "stall" and rule is not None:
                    # A client that gave up may have left a whole small request in the socket:
                    # unless asked to go on, it is cut, never sent late to the server.
                    if not self._stall(rule.stall_s) and not rule.resume:
                        raise _Dropped("stalled, then reset")
                if act in ("503", "500"):
                    if expect:  # the body never comes: answer and close
                        close_after = True
                    else:
                        _copy_body(head, cf, None)
                    code, msg = (("SlowDown", "Please reduce your request rate.") if act == "503"
                                 else ("InternalError", "We encountered an internal error. Please try again."))  # fmt: skip
                    body = _error_body(code, msg, target)
                    seen.status, seen.received = int(act), len(body)
                    reason = "Slow Down" if act == "503" else "Internal Server Error"
                    c.sendall((f"HTTP/1.1 {act} {reason}\r\nContent-Type: application/xml\r\n"
                               f"Content-Length: {len(body)}\r\n"
                               f"Connection: {'close' if close_after else 'keep-alive'}\r\n\r\n").encode() + body)  # fmt: skip
                    hard = False
                    if close_after:
                        return
                    continue
                # Pass through. The proxy answers 100-continue itself (and strips Expect), so
                # the client's body streams at once and the upstream never sends interim heads.
                if up is not None and select.select([up], [], [], 0)[0]:
                    # An idle upstream connection that is readable has been closed by the
                    # server (its idle timeout): a fresh one, rather than a failure to relay.
                    drop_upstream()
                if up is None:
                    up = socket.create_connection(self.upstream, timeout=None)
                    with self._lock:
                        self._socks.add(up)
                    uf = up.makefile("rb")
                if expect:
                    c.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                up.sendall(head.encode(drop=("expect",)))
                _copy_body(head, cf, up)
                assert uf is not None
                resp = _read_head(uf)
                while resp is not None and resp.line.split(" ")[1].startswith("1"):
                    resp = _read_head(uf)
                if resp is None:
                    raise _Dropped("upstream closed without answering")
                status = int(resp.line.split(" ")[1])
                no_body = method == "HEAD" or status in (204, 304)
                seen.status, seen.received = status, 0 if no_body else int(resp.get("content-length") or 0)
                te = (resp.get("transfer-encoding") or "").lower()
                delimits = no_body or "chunked" in te or resp.get("content-length") is not None
                up_close = resp.line.startswith("HTTP/1.0") or (resp.get("connection") or "").lower() == "close"
                # The client's connection is kept alive on its own terms, whatever the upstream
                # does (moto's server answers HTTP/1.0 and closes after each response).
                close_after = close_after or not delimits
                resp.line = "HTTP/1.1 " + resp.line.split(" ", 1)[1]
                resp.headers = [(k, v) for k, v in resp.headers if k.lower() not in ("connection", "keep-alive")]
                resp.headers.append(("Connection", "close" if close_after else "keep-alive"))
                c.sendall(resp.encode())
                if act in ("reset_body", "stall_body"):
                    cl = int(resp.get("content-length") or 0)
                    _copy_body(resp, uf, c, no_body, limit=cl // 2)
                    if act == "reset_body":
                        raise _Dropped("reset injected mid-body")
                    self._stall(rule.stall_s if rule else 0)
                    raise _Dropped("stalled mid-body; the rest is not sent")
                delimited = _copy_body(resp, uf, c, no_body)
                hard = False
                if not delimited or up_close:
                    drop_upstream()
                if close_after:
                    return
        except (_Dropped, OSError, ValueError, IndexError):
            pass
        finally:
            with self._lock:
                self._socks.discard(c)
            drop_upstream()
            cf.close()
            if hard:
                _reset(c)
            else:
                with contextlib.suppress(OSError):
                    c.close()


def stall_forever() -> Rule:
    """A rule that stalls every request until the proxy closes: a dead server."""
    return Rule("stall", stall_s=math.inf)
