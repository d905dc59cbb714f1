# SPDX-License-Identifier: Apache-2.0
"""Local stand-ins for the places cloud credentials come from, for testing a client's credential
chain without a cloud: the EC2 instance metadata service (IMDSv2, and v1 on request), the ECS/EKS
Pod Identity container credentials endpoint, the GCE/GKE metadata server, and Google's OAuth2 token
endpoint for service-account JWTs; plus ``expiry_gate``, which a FaultProxy consults to answer S3's
ExpiredToken/InvalidToken (or GCS's 401) for credentials these servers issued once they expire.

Every server is an in-process ``ThreadingHTTPServer`` on 127.0.0.1 with a free port, served from a
daemon thread: a context manager with ``url``, ``port``, ``close()``, and a record of what it was
asked (``requests``: (method, path) in order; ``counts``: Counter of the same; ``log``: method,
target with query, lower-cased headers). AWS credentials come from a shared ``Issuer``, which
remembers each one with its expiry, so a test (or the gate) can tell whether a key a client used was
issued, and whether it had expired.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import http.server
import json
import re
import secrets
import socket
import socketserver
import string
import threading
import time
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Self

UTC = dt.timezone.utc
# The form of "Expiration" and "LastUpdated" in AWS credential answers.
AWS_TIME = "%Y-%m-%dT%H:%M:%SZ"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
# The audience Google documents for a service account's JWT, whatever the token endpoint is.
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"
IMDS_TOKEN_TTL_MAX = 21600
ACCOUNT = "123456789012"

# An answer: status, headers, body.
Answer = tuple[int, list[tuple[str, str]], bytes]
# What a FaultProxy consults per request: (method, target, headers) -> None (forward) or an answer.
Gate = Callable[[str, str, Mapping[str, str]], Answer | None]


def _now() -> dt.datetime:
    return dt.datetime.now(UTC)


def _random(alphabet: str, n: int) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


def _json(status: int, obj: Any, ctype: str = "application/json") -> Answer:
    return status, [("Content-Type", ctype)], json.dumps(obj).encode()


def _text(status: int, text: str, ctype: str = "text/plain") -> Answer:
    return status, [("Content-Type", ctype)], text.encode()


# ------------------------------------------------------------------------------------------------
# Credentials and their issuers
# ------------------------------------------------------------------------------------------------


class Creds(NamedTuple):
    """AWS temporary credentials as an issuer made them. ``expiration`` is exact (UTC);
    ``expiration_str`` is it cut to whole seconds, as the servers send it: never later than
    the moment the issuer (and the gate) count the key expired."""

    access_key_id: str
    secret_access_key: str
    session_token: str
    expiration: dt.datetime

    @property
    def expiration_str(self) -> str:
        return self.expiration.strftime(AWS_TIME)


class Issuer:
    """Makes AWS-style temporary credentials and remembers each with its expiry. ``lifetime_s``
    (settable at any time) is the life of the next ones; ``issued`` lists them all in order.
    ``fail_next(n, status)``: the next ``n`` credential answers of the servers using this issuer
    fail with ``status`` instead. Thread-safe."""

    def __init__(self, lifetime_s: float = 3600) -> None:
        self.lifetime_s = lifetime_s
        self.issued: list[Creds] = []
        self.failures = 0  # credential answers that failed on schedule
        self._by_key: dict[str, Creds] = {}
        self._expiry: dict[str, dt.datetime] = {}
        self._fail: list[int] = []
        self._lock = threading.Lock()

    def issue(self) -> Creds:
        """New credentials: "ASIA" + 16 (20 characters), a 40-character secret, a session token
        with +, / and = in it (as real ones have), expiring ``lifetime_s`` from now."""
        akid = "ASIA" + _random(string.ascii_uppercase + string.digits, 16)
        secret = _random(string.ascii_letters + string.digits + "+/", 40)
        token = "IQoJ" + base64.b64encode(secrets.token_bytes(242)).decode()
        c = Creds(akid, secret, token, _now() + dt.timedelta(seconds=self.lifetime_s))
        with self._lock:
            self.issued.append(c)
            self._by_key[akid] = c
            self._expiry[akid] = c.expiration
        return c

    def get(self, access_key_id: str) -> Creds | None:
        """The credentials issued with this key (None: never issued here)."""
        with self._lock:
            return self._by_key.get(access_key_id)

    def expired(self, access_key_id: str) -> bool | None:
        """Whether the key has expired; None: this issuer never issued it."""
        with self._lock:
            exp = self._expiry.get(access_key_id)
        return None if exp is None else _now() >= exp

    def expire(self, access_key_id: str | None = None) -> None:
        """Expire that key now (None: every key issued so far), whatever its lifetime said."""
        now = _now()
        with self._lock:
            for k in [access_key_id] if access_key_id is not None else list(self._expiry):
                if k in self._expiry:
                    self._expiry[k] = min(self._expiry[k], now)

    def fail_next(self, n: int, status: int = 500) -> None:
        """The next ``n`` credential answers (any server using this issuer) are ``status``."""
        with self._lock:
            self._fail += [status] * n

    def _take_failure(self) -> int | None:
        with self._lock:
            if not self._fail:
                return None
            self.failures += 1
            return self._fail.pop(0)


class _Tokens:
    """Google OAuth2 access tokens ("ya29." + random) one server issued, with their expiry."""

    def __init__(self) -> None:
        self.issued: list[tuple[str, dt.datetime]] = []
        self.failures = 0
        self._expiry: dict[str, dt.datetime] = {}
        self._fail: list[int] = []
        self._lock = threading.Lock()

    def mint(self, lifetime_s: float) -> tuple[str, int]:
        tok = "ya29." + secrets.token_urlsafe(96)
        exp = _now() + dt.timedelta(seconds=lifetime_s)
        with self._lock:
            self.issued.append((tok, exp))
            self._expiry[tok] = exp
        return tok, max(0, int(lifetime_s))  # expires_in never says later than the real expiry

    def expired(self, tok: str) -> bool | None:
        with self._lock:
            exp = self._expiry.get(tok)
        return None if exp is None else _now() >= exp

    def expire(self, tok: str | None) -> None:
        now = _now()
        with self._lock:
            for k in [tok] if tok is not None else list(self._expiry):
                if k in self._expiry:
                    self._expiry[k] = min(self._expiry[k], now)

    def fail_next(self, n: int, status: int) -> None:
        with self._lock:
            self._fail += [status] * n

    def take_failure(self) -> int | None:
        with self._lock:
            if not self._fail:
                return None
            self.failures += 1
            return self._fail.pop(0)


# ------------------------------------------------------------------------------------------------
# The HTTP plumbing every server shares
# ------------------------------------------------------------------------------------------------


class Seen(NamedTuple):
    """One request a server received: method, target (path and query), headers (lower-case)."""

    method: str
    target: str
    headers: dict[str, str]


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    owner: _Server

    def server_bind(self) -> None:
        # No reverse lookup of the address (HTTPServer's getfqdn): 127.0.0.1 is all it needs.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the real services do
    server_version = "ckptio-credservers"
    sys_version = ""
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.owner._track(self.connection, True)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.server.owner._track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        pass

    def _body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            out = b""
            while True:
                n = int(self.rfile.readline(65537).split(b";")[0].strip() or b"0", 16)
                if n == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(n)
                self.rfile.readline(65537)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _any(self) -> None:
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, hdrs, body = self.server.owner._dispatch(self.command, self.path, headers, self._body())
        self.send_response(status)
        for k, v in hdrs:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = do_PATCH = do_OPTIONS = _any


class _Server:
    """A started HTTP server on 127.0.0.1 (port chosen by the kernel), answering through
    ``answer``; records every request."""

    name = "credserver"

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self.counts: Counter[tuple[str, str]] = Counter()
        self.log: list[Seen] = []
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self.port: int = self._httpd.server_port
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=self.name, daemon=True)  # fmt: skip
        self._thread.start()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving; open keep-alive connections are cut."""
        if not self._thread.is_alive():
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)

    def reset_counts(self) -> None:
        with self._lock:
            self.requests.clear()
            self.counts.clear()
            self.log.clear()

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    def _dispatch(self, method: str, target: str, headers: dict[str, str], body: bytes) -> Answer:
        path, _, query = target.partition("?")
        with self._lock:
            self.requests.append((method, path))
            self.counts[(method, path)] += 1
            self.log.append(Seen(method, target, headers))
        try:
            return self.answer(method, path, urllib.parse.parse_qs(query, keep_blank_values=True), headers, body)
        except Exception as e:  # a bug here shows as a 500 with its reason, not a hung client
            return _text(500, f"{type(e).__name__}: {e}")

    def answer(self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str],
               body: bytes) -> Answer:  # fmt: skip
        raise NotImplementedError


# ------------------------------------------------------------------------------------------------
# AWS: EC2 instance metadata, container credentials
# ------------------------------------------------------------------------------------------------


class Imds(_Server):
    """The EC2 instance metadata service. IMDSv2: ``PUT /latest/api/token`` with
    ``X-aws-ec2-metadata-token-ttl-seconds`` (1..21600; missing or bad: 400) answers a session
    token (text/plain, and the TTL header back); a GET must carry ``X-aws-ec2-metadata-token``
    equal to a live token (else 401; a wrong token is 401 even with ``require_token=False``,
    which answers tokenless IMDSv1 GETs too). Any request with ``X-Forwarded-For`` is 403.
    Paths: ``/latest/meta-data/iam/security-credentials/`` (the role name),
    ``.../security-credentials/<role>`` (fresh credentials from the issuer each time, JSON with
    Code/LastUpdated/Type/AccessKeyId/SecretAccessKey/Token/Expiration; another role: 404),
    ``/latest/meta-data/iam/info``, ``/latest/dynamic/instance-identity/document`` (JSON with
    "region"), ``/latest/meta-data/placement/region`` and ``.../placement/availability-zone``.
    Other paths 404; other methods 405. As the real service, every answer is text/plain.
    ``token_puts``: tokens handed out; ``expire_tokens()`` makes every token so far stale."""

    name = "imds"

    def __init__(self, issuer: Issuer, role: str = "ckptio-role", region: str = "us-west-2",
                 require_token: bool = True) -> None:  # fmt: skip
        self.issuer = issuer
        self.role = role
        self.region = region
        self.require_token = require_token
        self.tokens: dict[str, float] = {}  # token -> monotonic time it dies
        self.token_puts = 0
        super().__init__()

    def expire_tokens(self) -> None:
        with self._lock:
            for t in self.tokens:
                self.tokens[t] = 0.0

    def _live(self, tok: str) -> bool:
        with self._lock:
            return self.tokens.get(tok, 0.0) > time.monotonic()

    def answer(self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str],
               body: bytes) -> Answer:  # fmt: skip
        if "x-forwarded-for" in headers:
            return _text(403, "Forbidden")
        if path == "/latest/api/token":
            if method != "PUT":
                return _text(405, "Method Not Allowed")
            ttl = headers.get("x-aws-ec2-metadata-token-ttl-seconds", "")
            if not ttl.isdigit() or not 1 <= int(ttl) <= IMDS_TOKEN_TTL_MAX:
                return _text(400, "Bad Request")
            tok = base64.b64encode(secrets.token_bytes(42)).decode()
            with self._lock:
                self.tokens[tok] = time.monotonic() + int(ttl)
                self.token_puts += 1
            s, h, b = _text(200, tok)
            return s, h + [("X-aws-ec2-metadata-token-ttl-seconds", ttl)], b
        if method not in ("GET", "HEAD"):
            return _text(405, "Method Not Allowed")
        tok = headers.get("x-aws-ec2-metadata-token")
        if (tok is not None and not self._live(tok)) or (tok is None and self.require_token):
            return _text(401, "Unauthorized")
        creds_dir = "/latest/meta-data/iam/security-credentials"
        if path in (creds_dir, creds_dir + "/"):
            return _text(200, self.role)
        if path.startswith(creds_dir + "/"):
            if path[len(creds_dir) + 1 :].rstrip("/") != self.role:
                return _text(404, "Not Found")
            fail = self.issuer._take_failure()
            if fail is not None:
                return _text(fail, "credentials unavailable (scheduled failure)")
            c = self.issuer.issue()
            return _text(200, json.dumps({
                "Code": "Success", "LastUpdated": _now().strftime(AWS_TIME), "Type": "AWS-HMAC",
                "AccessKeyId": c.access_key_id, "SecretAccessKey": c.secret_access_key,
                "Token": c.session_token, "Expiration": c.expiration_str}, indent=2))  # fmt: skip
        if path == "/latest/meta-data/iam/info":
            return _text(200, json.dumps({
                "Code": "Success", "LastUpdated": _now().strftime(AWS_TIME),
                "InstanceProfileArn": f"arn:aws:iam::{ACCOUNT}:instance-profile/{self.role}",
                "InstanceProfileId": "AIPA" + "C" * 17}, indent=2))  # fmt: skip
        if path == "/latest/dynamic/instance-identity/document":
            return _text(200, json.dumps({
                "accountId": ACCOUNT, "architecture": "x86_64", "availabilityZone": self.region + "a",
                "imageId": "ami-0123456789abcdef0", "instanceId": "i-0123456789abcdef0",
                "instanceType": "p5.48xlarge", "pendingTime": "2026-01-01T00:00:00Z",
                "privateIp": "10.0.0.1", "region": self.region, "version": "2017-09-30"}, indent=2))  # fmt: skip
        if path.rstrip("/") == "/latest/meta-data/placement/region":
            return _text(200, self.region)
        if path.rstrip("/") == "/latest/meta-data/placement/availability-zone":
            return _text(200, self.region + "a")
        return _text(404, "Not Found")


class ContainerCreds(_Server):
    """The ECS task / EKS Pod Identity credentials endpoint: ``GET /v1/credentials`` or any path
    under ``/v1/credentials`` or ``/v2/credentials/`` answers fresh credentials from the issuer,
    JSON {AccessKeyId, SecretAccessKey, Token, Expiration, RoleArn}. With ``token`` set (settable;
    None: no check) the ``Authorization`` header must equal it, else 401. Other paths 404, other
    methods 405. ``full_uri`` is for AWS_CONTAINER_CREDENTIALS_FULL_URI."""

    name = "container-creds"

    def __init__(self, issuer: Issuer, token: str | None = "ckptio-container-token",
                 role_arn: str = f"arn:aws:iam::{ACCOUNT}:role/ckptio-role") -> None:  # fmt: skip
        self.issuer = issuer
        self.token = token
        self.role_arn = role_arn
        super().__init__()
        self.full_uri = self.url + "/v1/credentials"

    def answer(self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str],
               body: bytes) -> Answer:  # fmt: skip
        if not (path == "/v1/credentials" or path.startswith(("/v1/credentials/", "/v2/credentials/"))):
            return _json(404, {"code": "NotFound", "message": f"no credentials at {path}"})
        if method != "GET":
            return _json(405, {"code": "MethodNotAllowed", "message": method})
        if self.token is not None and headers.get("authorization") != self.token:
            return _json(401, {"code": "AccessDeniedException", "message": "Authorization header is wrong or missing"})
        fail = self.issuer._take_failure()
        if fail is not None:
            return _json(fail, {"code": "InternalServerException", "message": "scheduled failure"})
        c = self.issuer.issue()
        return _json(200, {"AccessKeyId": c.access_key_id, "SecretAccessKey": c.secret_access_key,
                           "Token": c.session_token, "Expiration": c.expiration_str,
                           "RoleArn": self.role_arn})  # fmt: skip


# ------------------------------------------------------------------------------------------------
# Google: the metadata server, the OAuth2 token endpoint for service-account JWTs
# ------------------------------------------------------------------------------------------------


class _GoogleTokens:
    """What the two Google token sources share: the tokens they issued, and their failures."""

    _tokens: _Tokens

    @property
    def issued(self) -> list[tuple[str, dt.datetime]]:
        """(access token, exact expiry) of every token issued, in order."""
        return self._tokens.issued

    def token_expired(self, tok: str) -> bool | None:
        """Whether the access token has expired; None: never issued here."""
        return self._tokens.expired(tok)

    def expire(self, tok: str | None = None) -> None:
        """Expire that token now (None: every token issued so far)."""
        self._tokens.expire(tok)

    def fail_next(self, n: int, status: int = 500) -> None:
        """The next ``n`` token answers are ``status`` instead."""
        self._tokens.fail_next(n, status)


class GceMetadata(_GoogleTokens, _Server):
    """The GCE/GKE metadata server. Every request needs ``Metadata-Flavor: Google`` (else 403;
    ``GET /``, the ping Google's libraries do, answers 200 either way); ``X-Forwarded-For`` is
    403; every answer carries ``Metadata-Flavor: Google``. Under ``/computeMetadata/v1``:
    ``instance/service-accounts/{default,<email>}/token`` (a fresh "ya29." token each time:
    {"access_token", "expires_in" (whole seconds, never past the real expiry), "token_type":
    "Bearer"}; query ``scopes=`` accepted), ``.../email``, ``.../scopes``, ``.../?recursive=true``
    (JSON with aliases/email/scopes), ``instance/service-accounts/``, ``project/project-id``,
    ``project/numeric-project-id``, ``instance/zone``. Other paths 404, methods other than GET
    405. ``token_lifetime_s`` is settable."""

    name = "gce-metadata"

    def __init__(self, token_lifetime_s: float = 3600, project: str = "ckptio-proj",
                 email: str = "sa@ckptio-proj.iam.gserviceaccount.com") -> None:  # fmt: skip
        self.token_lifetime_s = token_lifetime_s
        self.project = project
        self.email = email
        self.scopes = [CLOUD_PLATFORM]
        self._tokens = _Tokens()
        super().__init__()

    def answer(self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str],
               body: bytes) -> Answer:  # fmt: skip
        s, h, b = self._answer(method, path, query, headers)
        return s, h + [("Metadata-Flavor", "Google")], b

    def _answer(self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str]) -> Answer:
        text = "application/text"
        if "x-forwarded-for" in headers:
            return _text(403, "Forbidden", text)
        if method not in ("GET", "HEAD"):
            return _text(405, "Method Not Allowed", text)
        if path == "/":
            return _text(200, "computeMetadata/\n", text)
        if headers.get("metadata-flavor") != "Google":
            return _text(403, "Missing required header: Metadata-Flavor", text)
        p = path.removeprefix("/computeMetadata/v1")
        if p == path:
            return _text(404, "Not Found", text)
        sa = "/instance/service-accounts/"
        if p == sa:
            return _text(200, f"default/\n{self.email}/\n", text)
        if p.startswith(sa):
            who, _, what = p[len(sa) :].partition("/")
            if who not in ("default", self.email):
                return _text(404, "Not Found", text)
            if what == "":
                if query.get("recursive", [""])[0].lower() == "true":
                    return _json(200, {"aliases": ["default"], "email": self.email, "scopes": self.scopes})
                return _text(200, "aliases\nemail\nidentity\nscopes\ntoken\n", text)
            if what == "email":
                return _text(200, self.email, text)
            if what == "scopes":
                return _text(200, "".join(s + "\n" for s in self.scopes), text)
            if what == "token":
                fail = self._tokens.take_failure()
                if fail is not None:
                    return _text(fail, "scheduled failure", text)
                tok, expires_in = self._tokens.mint(self.token_lifetime_s)
                return _json(200, {"access_token": tok, "expires_in": expires_in, "token_type": "Bearer"})
            return _text(404, "Not Found", text)
        if p == "/project/project-id":
            return _text(200, self.project, text)
        if p == "/project/numeric-project-id":
            return _text(200, ACCOUNT, text)
        if p == "/instance/zone":
            return _text(200, f"projects/{ACCOUNT}/zones/us-central1-a", text)
        return _text(404, "Not Found", text)


def _b64url(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def _unb64url(s: str) -> bytes:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def make_jwt(private_key_pem: str | bytes, claims: Mapping[str, Any], kid: str | None = None,
             alg: str = "RS256") -> str:  # fmt: skip
    """A JWT with ``claims``, signed RS256 (PKCS#1 v1.5, SHA-256) with the RSA private key
    (PEM). ``alg`` is only what the header says (a test of a wrong one)."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding, rsa

    key = serialization.load_pem_private_key(private_key_pem.encode() if isinstance(private_key_pem, str)
                                             else private_key_pem, password=None)  # fmt: skip
    assert isinstance(key, rsa.RSAPrivateKey)
    head: dict[str, str] = {"alg": alg, "typ": "JWT"}
    if kid is not None:
        head["kid"] = kid
    signing_input = _b64url(json.dumps(head).encode()) + "." + _b64url(json.dumps(dict(claims)).encode())
    sig = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return signing_input + "." + _b64url(sig)


def sa_claims(client_email: str, token_url: str, scope: str = CLOUD_PLATFORM, lifetime_s: int = 3600,
              now: float | None = None) -> dict[str, Any]:  # fmt: skip
    """The claims a service account's JWT grant carries (what Google's libraries send)."""
    iat = int(time.time() if now is None else now)
    return {"iss": client_email, "scope": scope, "aud": token_url, "iat": iat, "exp": iat + lifetime_s}


def public_key_pem(private_key_pem: str | bytes) -> str:
    """The public half (SubjectPublicKeyInfo PEM) of a PEM private key."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(private_key_pem.encode() if isinstance(private_key_pem, str)
                                             else private_key_pem, password=None)  # fmt: skip
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()  # fmt: skip


def rsa_key_pem(bits: int = 2048) -> str:
    """A new RSA private key (public exponent 65537), PKCS#8 PEM, as service-account files hold."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()  # fmt: skip


def service_account_file(path: str | Any, token_url: str, project: str = "ckptio-proj",
                         email: str | None = None, private_key_pem: str | None = None) -> str:  # fmt: skip
    """Write a service-account key file in Google's JSON format (type "service_account",
    project_id, private_key_id, private_key, client_email (default
    ckptio-sa@<project>.iam.gserviceaccount.com), client_id, token_uri=``token_url``,
    universe_domain) with ``private_key_pem`` or else a new RSA 2048 key; returns the private
    key (PKCS#8 PEM). The Google URLs real files also carry (auth_uri, the certificate URLs)
    are left out: nothing here should reach for them."""
    pem = private_key_pem or rsa_key_pem()
    info = {
        "type": "service_account",
        "project_id": project,
        "private_key_id": secrets.token_hex(20),
        "private_key": pem,
        "client_email": email or f"ckptio-sa@{project}.iam.gserviceaccount.com",
        "client_id": str(secrets.randbelow(10**21 - 10**20) + 10**20),
        "token_uri": token_url,
        "universe_domain": "googleapis.com",
    }
    with open(path, "w") as f:
        json.dump(info, f, indent=2)
    return pem


class OAuthToken(_GoogleTokens, _Server):
    """Google's OAuth2 token endpoint for service accounts: ``POST /token`` with a form body
    ``grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=<JWT>``. The JWT must be
    RS256 with a valid signature for ``public_key_pem`` (a public or private key PEM; None: set
    it later with ``set_key``, as a key file needs ``token_url`` first; until then every
    assertion is refused), ``aud`` Google's token endpoint (what Google documents and
    google-auth sends: GOOGLE_TOKEN_AUDIENCE) or ``token_url`` (a key file's token_uri), ``iss`` and
    ``scope`` present, ``iat``/``exp`` numbers with 0 < exp - iat <= 3600, iat not in the future
    and exp not past (60 s skew allowed). Answers {"access_token": "ya29...", "expires_in",
    "token_type": "Bearer"}, or 400 {"error": "invalid_grant" (or "unsupported_grant_type",
    "invalid_request"), "error_description"}. ``claims``: the claims of each accepted JWT;
    ``rejected``: the error_description of each refusal. ``lifetime_s`` is settable."""

    name = "oauth-token"
    GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
    SKEW_S = 60

    def __init__(self, public_key_pem: str | bytes | None = None, lifetime_s: float = 3600) -> None:
        self._key: Any = None
        if public_key_pem is not None:
            self.set_key(public_key_pem)
        self.lifetime_s = lifetime_s
        self.claims: list[dict[str, Any]] = []
        self.rejected: list[str] = []
        self._tokens = _Tokens()
        super().__init__()
        self.token_url = self.url + "/token"

    def set_key(self, pem: str | bytes) -> None:
        """The key assertions must be signed with from now on (public or private PEM)."""
        from cryptography.hazmat.primitives import serialization

        b = pem.encode() if isinstance(pem, str) else pem
        key = (serialization.load_pem_private_key(b, password=None).public_key() if b"PRIVATE KEY" in b
               else serialization.load_pem_public_key(b))  # fmt: skip
        self._key = key  # one assignment: a request sees the old key or the new

    def _refuse(self, why: str, error: str = "invalid_grant") -> Answer:
        with self._lock:
            self.rejected.append(why)
        return _json(400, {"error": error, "error_description": why})

    def answer(self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str],
               body: bytes) -> Answer:  # fmt: skip
        if path != "/token":
            return _json(404, {"error": "not_found"})
        if method != "POST":
            return _json(405, {"error": "invalid_request", "error_description": "POST only"})
        form = urllib.parse.parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        grant = form.get("grant_type", [""])[0]
        if grant != self.GRANT:
            return self._refuse(f"Invalid grant_type: {grant}", "unsupported_grant_type")
        assertion = form.get("assertion", [""])[0]
        if not assertion:
            return self._refuse("Missing required parameter: assertion", "invalid_request")
        why, claims = self._verify(assertion)
        if why:
            return self._refuse(why)
        fail = self._tokens.take_failure()
        if fail is not None:
            return _json(fail, {"error": "internal_failure", "error_description": "scheduled failure"})
        with self._lock:
            self.claims.append(claims)
        tok, expires_in = self._tokens.mint(self.lifetime_s)
        return _json(200, {"access_token": tok, "expires_in": expires_in, "token_type": "Bearer"})

    def _verify(self, jwt: str) -> tuple[str, dict[str, Any]]:
        """("", claims) for a good assertion, else (why, {})."""
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding, rsa

        parts = jwt.split(".")
        if len(parts) != 3:
            return "Invalid JWT: not three dot-separated parts", {}
        try:
            head = json.loads(_unb64url(parts[0]))
            claims = json.loads(_unb64url(parts[1]))
            sig = _unb64url(parts[2])
        except ValueError:
            return "Invalid JWT: not base64url JSON", {}
        if not isinstance(head, dict) or not isinstance(claims, dict):
            return "Invalid JWT: header and claims must be objects", {}
        if head.get("alg") != "RS256":
            return f"Invalid JWT: alg must be RS256, not {head.get('alg')!r}", {}
        key = self._key
        if not isinstance(key, rsa.RSAPublicKey):
            return "Invalid JWT Signature.", {}
        try:
            key.verify(sig, (parts[0] + "." + parts[1]).encode(), padding.PKCS1v15(), hashes.SHA256())
        except InvalidSignature:
            return "Invalid JWT Signature.", {}
        if claims.get("aud") not in (self.token_url, GOOGLE_TOKEN_AUDIENCE):
            return f"Invalid JWT: aud must be {GOOGLE_TOKEN_AUDIENCE} or {self.token_url}", {}
        if not claims.get("iss"):
            return "Invalid JWT: no iss", {}
        if not claims.get("scope"):
            return "Invalid JWT: no scope", {}
        iat, exp = claims.get("iat"), claims.get("exp")
        now = time.time()
        if (not isinstance(iat, int | float) or not isinstance(exp, int | float) or isinstance(iat, bool)
                or isinstance(exp, bool) or not 0 < exp - iat <= 3600 or iat > now + self.SKEW_S
                or exp < now - self.SKEW_S):  # fmt: skip
            return ("Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable "
                    "timeframe. Check your iat and exp values in the JWT claim."), {}  # fmt: skip
        return "", claims


# ------------------------------------------------------------------------------------------------
# The expiry gate, for a FaultProxy in front of an object store
# ------------------------------------------------------------------------------------------------

_SIGV4 = re.compile(r"AWS4-HMAC-SHA256\s+Credential=([^/,\s]+)/")
_SIGV2 = re.compile(r"AWS\s+([^:\s]+):")


def _aws_key(target: str, h: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(access key id, session token) of a signed S3 request: SigV4 or SigV2, in the
    Authorization header or a presigned URL's query; (None, None) when it is not signed so."""
    auth = h.get("authorization", "")
    m = _SIGV4.match(auth) or _SIGV2.match(auth)
    if m:
        return m.group(1), h.get("x-amz-security-token")
    q = {k.lower(): v[0] for k, v in urllib.parse.parse_qs(target.partition("?")[2]).items()}
    akid = q["x-amz-credential"].split("/")[0] if "x-amz-credential" in q else q.get("awsaccesskeyid")
    return (akid, q.get("x-amz-security-token")) if akid else (None, None)


def _xml_escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _s3_error(status: int, code: str, message: str, extra: str = "") -> Answer:
    rid = uuid.uuid4().hex[:16].upper()
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
            f"{extra}<RequestId>{rid}</RequestId><HostId>credservers</HostId></Error>")  # fmt: skip
    return status, [("Content-Type", "application/xml")], body.encode()


def expiry_gate(*sources: Issuer | GceMetadata | OAuthToken, invalid_token_status: int = 403) -> Gate:
    """A FaultProxy gate: ``gate(method, target, headers)`` -> None (forward) or (status,
    headers, body). A signed S3 request (``Authorization: AWS4-HMAC-SHA256 Credential=<AKID>/...``
    with ``x-amz-security-token``, SigV2's ``AWS <AKID>:...``, or a presigned URL's
    X-Amz-Credential or AWSAccessKeyId with its X-Amz-Security-Token) with a key one of the
    issuers issued: a session token (``x-amz-security-token``) other than the one issued with it, or
    none, is ``invalid_token_status`` InvalidToken (S3's error table lists 400 for this code;
    403 is the default asked for); an expired key is 400 ExpiredToken, S3's XML body. A
    ``Bearer`` token one of the Google sources issued that has expired is 401 with GCS's JSON
    error body ("Invalid Credentials") and ``WWW-Authenticate``. Everything else is forwarded.
    The gate counts its refusals in ``gate.refused`` (Counter by code)."""
    issuers = [s for s in sources if isinstance(s, Issuer)]
    google = [s for s in sources if not isinstance(s, Issuer)]
    refused: Counter[str] = Counter()
    lock = threading.Lock()

    def refuse(code: str, ans: Answer) -> Answer:
        with lock:
            refused[code] += 1
        return ans

    def gate(method: str, target: str, headers: Mapping[str, str]) -> Answer | None:
        h = {k.lower(): v for k, v in headers.items()}
        auth = h.get("authorization", "")
        akid, token = _aws_key(target, h)
        if akid is not None:
            for iss in issuers:
                c = iss.get(akid)
                if c is None:
                    continue
                if token != c.session_token:
                    msg = "The provided token is malformed or otherwise invalid."
                    return refuse("InvalidToken", _s3_error(invalid_token_status, "InvalidToken", msg))
                if iss.expired(akid):
                    tok0 = f"<Token-0>{_xml_escape(c.session_token)}</Token-0>"
                    return refuse("ExpiredToken", _s3_error(400, "ExpiredToken", "The provided token has expired.", tok0))
                return None
            return None
        if auth[:7].lower() == "bearer ":
            tok = auth[7:].strip()
            for g in google:
                if g.token_expired(tok):
                    err = {"message": "Invalid Credentials", "domain": "global", "reason": "authError",
                           "locationType": "header", "location": "Authorization"}  # fmt: skip
                    s, hh, b = _json(401, {"error": {"code": 401, "message": "Invalid Credentials", "errors": [err]}},
                                     "application/json; charset=UTF-8")  # fmt: skip
                    return refuse("401", (s, hh + [("WWW-Authenticate", 'Bearer error="invalid_token"')], b))
        return None

    gate.refused = refused  # type: ignore[attr-defined]
    return gate
