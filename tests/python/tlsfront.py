# SPDX-License-Identifier: Apache-2.0
"""A TLS front for the tests: a throwaway certificate authority and server certificates made with
``cryptography``, and ``TlsFront``, which terminates TLS on 127.0.0.1 and bridges each connection
to a plain TCP server (an S3 server, a FaultProxy), so a client's https path, its CA handling and
its refusal of a wrong certificate can be tested locally. It counts connections, handshakes and
handshake failures (a client that refuses the certificate shows as one)."""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import select
import socket
import ssl
import threading
import time
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

COPY = 1 << 16  # bytes per read
BUFFER = 1 << 20  # bytes held for a side before reading more from the other
HANDSHAKE_S = 10.0
CA_DAYS = 30


def _write_key(key: ec.EllipticCurvePrivateKey, path: str) -> None:
    with open(path, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))  # fmt: skip
    os.chmod(path, 0o600)


def make_ca(dir: str | os.PathLike[str], name: str = "ca") -> tuple[str, ec.EllipticCurvePrivateKey]:
    """A new self-signed CA (ECDSA P-256, SHA-256, valid from a day ago for CA_DAYS days, basic
    constraints CA critical, key usage certSign/cRLSign, subject key id): writes
    ``dir/<name>.pem`` (and its key to ``dir/<name>.key``); returns (certificate path, key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ckptio tests"),
                         x509.NameAttribute(NameOID.COMMON_NAME, f"ckptio test CA {name}")])  # fmt: skip
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))  # fmt: skip
    path = os.path.join(os.fspath(dir), f"{name}.pem")
    with open(path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, os.path.join(os.fspath(dir), f"{name}.key"))
    return path, key


def server_cert(ca: tuple[str, ec.EllipticCurvePrivateKey], dir: str | os.PathLike[str],
                names: tuple[str, ...] = ("127.0.0.1", "localhost"), name: str = "server",
                days: float = CA_DAYS - 1) -> tuple[str, str]:  # fmt: skip
    """A server certificate signed by ``ca`` (what make_ca returned) for ``names`` (an IP
    address becomes an IP SAN, anything else a DNS SAN; the first is also the CN): ECDSA P-256,
    serverAuth, not a CA, with authority and subject key ids. ``days`` < 0 makes one that has
    already expired. Writes ``dir/<name>.pem`` and ``dir/<name>.key``; returns (cert path, key
    path)."""
    ca_path, ca_key = ca
    with open(ca_path, "rb") as f:
        ca_cert = x509.load_pem_x509_certificate(f.read())
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for n in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            sans.append(x509.DNSName(n))
    now = dt.datetime.now(dt.timezone.utc)
    start, end = (now - dt.timedelta(hours=1), now + dt.timedelta(days=days)) if days > 0 else \
        (now + dt.timedelta(days=days) - dt.timedelta(days=1), now + dt.timedelta(days=days))  # fmt: skip
    ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
            .sign(ca_key, hashes.SHA256()))  # fmt: skip
    d = os.fspath(dir)
    cert_path, key_path = os.path.join(d, f"{name}.pem"), os.path.join(d, f"{name}.key")
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, key_path)
    return cert_path, key_path


class TlsFront:
    """TLS on 127.0.0.1 (a free port) in front of a plain TCP server there: each accepted
    connection's handshake runs on its own thread, then bytes are bridged both ways with the
    upstream (a fresh TCP connection per client connection) until either side ends. Starts at
    once; a context manager. ``url`` ("https://127.0.0.1:PORT"), ``port``; counts:
    ``connections`` accepted, ``handshakes`` completed, ``handshake_failures`` (and their
    reasons in ``failures``). ``context`` is the server's ssl.SSLContext (TLS 1.2 and up)."""

    def __init__(self, upstream_host: str, upstream_port: int, cert_path: str, key_path: str) -> None:
        if upstream_host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"a test front only forwards to this machine, not {upstream_host!r}")
        self.upstream = (upstream_host, upstream_port)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.context.load_cert_chain(cert_path, key_path)
        self.connections = 0
        self.handshakes = 0
        self.handshake_failures = 0
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._socks: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        self.url = f"https://127.0.0.1:{self.port}"
        t = threading.Thread(target=self._accept, name="tlsfront-accept", daemon=True)
        t.start()
        self._threads.append(t)

    def __enter__(self) -> TlsFront:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop accepting, cut every connection, join the threads (bounded)."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            socks = list(self._socks)
            threads = list(self._threads)
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        for t in threads:
            t.join(5)

    def wait_handshake_failures(self, n: int, timeout: float = 5.0) -> bool:
        """Whether ``handshake_failures`` reaches ``n`` within ``timeout`` (the server side
        learns of a refusal a moment after the client gives up)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._lock:
                if self.handshake_failures >= n:
                    return True
            time.sleep(0.01)
        with self._lock:
            return self.handshake_failures >= n

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                c, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(c,), name="tlsfront-conn", daemon=True)
            with self._lock:
                self.connections += 1
                self._socks.add(c)
                self._threads = [x for x in self._threads if x.is_alive()]
                self._threads.append(t)
            t.start()

    def _serve(self, raw: socket.socket) -> None:
        tls: ssl.SSLSocket | None = None
        up: socket.socket | None = None
        try:
            raw.settimeout(HANDSHAKE_S)
            try:
                tls = self.context.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
                tls.do_handshake()
            except (ssl.SSLError, OSError) as e:
                with self._lock:
                    self.handshake_failures += 1
                    self.failures.append(f"{type(e).__name__}: {e}")
                return
            with self._lock:
                self.handshakes += 1
                self._socks.add(tls)
            try:
                up = socket.create_connection(self.upstream, timeout=HANDSHAKE_S)
            except OSError:
                return
            with self._lock:
                self._socks.add(up)
            self._bridge(tls, up)
        finally:
            with self._lock:
                for s in (raw, tls, up):
                    self._socks.discard(s)  # type: ignore[arg-type]
            if tls is not None:
                with contextlib.suppress(ssl.SSLError, OSError, ValueError):
                    tls.setblocking(False)
                    tls.unwrap()  # sends close_notify; the peer's answer is not waited for
                with contextlib.suppress(OSError):
                    tls.close()
            with contextlib.suppress(OSError):
                raw.close()
            if up is not None:
                with contextlib.suppress(OSError):
                    up.close()

    def _bridge(self, tls: ssl.SSLSocket, up: socket.socket) -> None:
        """Both directions on this one thread (an SSL object is not for two threads at once),
        non-blocking, until the client is gone and everything it sent is delivered, or the
        upstream ended and everything it sent reached the client."""
        tls.setblocking(False)
        up.setblocking(False)
        to_up, to_tls = bytearray(), bytearray()
        tls_open, up_open, up_shut = True, True, False
        retry = 0  # an SSL write that wanted to wait is retried with the same length
        while not self._stop.is_set():
            if not tls_open and not to_up and not up_shut:
                with contextlib.suppress(OSError):
                    up.shutdown(socket.SHUT_WR)  # the client is done sending: so is the upstream's peer
                up_shut = True
            if not up_open and not to_tls:
                return
            if not tls_open and up_shut and not up_open:
                return
            rl: list[socket.socket] = []
            wl: list[socket.socket] = []
            if tls_open and len(to_up) < BUFFER:
                rl.append(tls)
            if up_open and len(to_tls) < BUFFER:
                rl.append(up)
            if to_up:
                wl.append(up)
            if to_tls:
                wl.append(tls)
            pending = tls in rl and tls.pending() > 0
            r, w, _ = select.select(rl, wl, [], 0 if pending else 0.2)
            if pending or tls in r:
                try:
                    data = tls.recv(COPY)
                    if data:
                        to_up += data
                    else:
                        tls_open = False
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    pass
                except ssl.SSLZeroReturnError:
                    tls_open = False
                except (ssl.SSLError, OSError):
                    return
            if up in r:
                try:
                    data = up.recv(COPY)
                    if data:
                        to_tls += data
                    else:
                        up_open = False
                except BlockingIOError:
                    pass
                except OSError:
                    return
            if up in w:
                try:
                    del to_up[: up.send(to_up)]
                except BlockingIOError:
                    pass
                except OSError:
                    return
            if tls in w:
                n = retry or min(len(to_tls), COPY)
                try:
                    del to_tls[: tls.send(bytes(to_tls[:n]))]
                    retry = 0
                except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
                    retry = n
                except (ssl.SSLError, OSError):
                    return
