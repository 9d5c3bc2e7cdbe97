"""A real SMTP relay for tests: STARTTLS and AUTH required, certificates from a test CA.

    ca = CertificateAuthority.create(tmp_path / "ca")
    with SMTPRelay(ca.issue(), username="relay", password="...") as relay:
        ...  # point a client at 127.0.0.1:relay.port, trusting ca.cert
    assert relay.deliveries[0].over_tls

The relay is aiosmtpd's ``Controller`` in a thread of the test process. It records
what a client did (connections, completed TLS handshakes, logins, messages) so a
test can assert on the session as the server saw it, not as the client claims.
Certificates come from the openssl command line (``cryptography`` is not a
dependency), fresh for each test.
"""

from __future__ import annotations

import ssl
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from tests.e2e.conftest import free_port

OPENSSL = "/usr/bin/openssl"
HOST = "127.0.0.1"
# A CA that Python 3.13's strict verification (VERIFY_X509_STRICT) accepts: a
# critical basicConstraints and keyUsage on the CA, key identifiers on both.
_OPENSSL_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = {name}
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
"""
_EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-noenc")


def _openssl(*args: str | Path) -> None:
    subprocess.run([OPENSSL, *map(str, args)], check=True, capture_output=True, timeout=30)


@dataclass(frozen=True)
class ServerCertificate:
    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        return context


@dataclass(frozen=True)
class CertificateAuthority:
    """A self-signed CA in ``directory`` (``ca.pem`` is what a client trusts)."""

    directory: Path
    cert: Path
    key: Path
    config: Path

    @classmethod
    def create(cls, directory: Path, name: str = "Test relay CA") -> CertificateAuthority:
        directory.mkdir(parents=True)
        config = directory / "openssl.cnf"
        config.write_text(_OPENSSL_CONFIG.format(name=name))
        ca = cls(directory, directory / "ca.pem", directory / "ca.key", config)
        _openssl(
            "req", "-x509", *_EC_KEY, "-days", "1", "-config", config, "-extensions", "ca",
            "-keyout", ca.key, "-out", ca.cert,
        )  # fmt: skip
        return ca

    def issue(self) -> ServerCertificate:
        """A server certificate for 127.0.0.1 and localhost, signed by this CA."""
        key, csr, cert = (self.directory / f"server.{ext}" for ext in ("key", "csr", "pem"))
        _openssl("req", "-new", *_EC_KEY, "-subj", f"/CN={HOST}", "-keyout", key, "-out", csr)
        _openssl(
            "x509", "-req", "-in", csr, "-CA", self.cert, "-CAkey", self.key, "-set_serial", "2",
            "-days", "1", "-extfile", self.config, "-extensions", "server", "-out", cert,
        )  # fmt: skip
        return ServerCertificate(cert, key)


@dataclass(frozen=True)
class Login:
    username: str
    over_tls: bool
    accepted: bool


@dataclass(frozen=True)
class Delivery:
    mail_from: str
    rcpt_tos: list[str]
    content: str
    over_tls: bool
    authenticated_as: str | None


class SMTPRelay:
    """aiosmtpd on a free loopback port that takes mail only after STARTTLS and AUTH."""

    def __init__(self, certificate: ServerCertificate, *, username: str, password: str) -> None:
        self._username = username.encode()
        self._password = password.encode()
        self._lock = threading.Lock()
        self.connections = 0  # EHLOs before STARTTLS: one per client connection
        self.handshakes = 0  # STARTTLS handshakes that completed
        self.logins: list[Login] = []
        self.deliveries: list[Delivery] = []
        self.port = free_port()
        self._controller = Controller(
            self,
            hostname=HOST,
            port=self.port,
            ready_timeout=10,
            tls_context=certificate.server_context(),
            require_starttls=True,
            auth_required=True,
            auth_require_tls=True,
            authenticator=self._authenticate,
        )

    def __enter__(self) -> SMTPRelay:
        self._controller.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._controller.stop()

    def snapshot(self) -> tuple[int, int, list[Login], list[Delivery]]:
        with self._lock:
            return self.connections, self.handshakes, list(self.logins), list(self.deliveries)

    # aiosmtpd's hooks, called on the relay's event loop thread.

    async def handle_EHLO(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        hostname: str,
        responses: list[str],
    ) -> list[str]:
        session.host_name = hostname
        if session.ssl is None:
            with self._lock:
                self.connections += 1
        return responses

    def handle_STARTTLS(self, server: SMTP, session: Session, envelope: Envelope) -> bool:
        with self._lock:
            self.handshakes += 1
        return True

    def _authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        accepted = (
            isinstance(data, LoginPassword)
            and data.login == self._username
            and data.password == self._password
        )
        login = data.login.decode(errors="replace") if isinstance(data, LoginPassword) else ""
        with self._lock:
            self.logins.append(Login(login, over_tls=session.ssl is not None, accepted=accepted))
        if not accepted:
            return AuthResult(success=False, handled=False)  # aiosmtpd answers 535
        return AuthResult(success=True, auth_data=data)

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.content
        text = content.decode(errors="replace") if isinstance(content, bytes) else str(content)
        auth = session.auth_data if session.authenticated else None
        delivery = Delivery(
            mail_from=str(envelope.mail_from),
            rcpt_tos=list(envelope.rcpt_tos),
            content=text,
            over_tls=session.ssl is not None,
            authenticated_as=auth.login.decode() if isinstance(auth, LoginPassword) else None,
        )
        with self._lock:
            self.deliveries.append(delivery)
        return "250 Message accepted for delivery"
