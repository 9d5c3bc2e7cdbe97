"""The project as production runs it: gunicorn with the shipped config, Redis with a password.

``ProductionSite.start`` collects static files, starts a private ``redis-server
--requirepass`` and ``gunicorn project.wsgi`` (``gunicorn.conf.py`` from the
checkout, 2 workers) with DEBUG off, a strong secret key, ADMINS set and error
emails written to files. Every secret it hands the server is random hex, so a
leak shows up verbatim in any encoding a log or an email may use.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from project.redis_server import server_args
from tests.security.wire import send

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 2
# The suite's own knobs, which the production-like server must not inherit.
_NOT_INHERITED = (
    "DJANGO_",
    "JOBS_",
    "REDIS_",
    "DATABASE_",
    "EMAIL_",
    "METRICS_",
    "LOG_",
    "SIGNUP_",
    "LOGIN_",
    "GUNICORN_",
    "PROMETHEUS_",
    "TEST_",
    "VAR_DIR",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PasswordRedis:
    """A private redis-server that refuses every client without the password."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.password = secrets.token_hex(16)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    def start(self) -> PasswordRedis:
        self.directory.mkdir(parents=True, exist_ok=True)
        command = server_args(self.port, self.directory, appendonly=False)
        with open(self.directory / "redis.log", "ab") as log:
            self.process = subprocess.Popen(
                [*command, "--requirepass", self.password], stdout=log, stderr=subprocess.STDOUT
            )
        self._wait_until_ready()
        return self

    def _wait_until_ready(self, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(f"AUTH {self.password}\r\nPING\r\n".encode())
                    replies = b""
                    while b"\r\n" not in replies.partition(b"\r\n")[2]:
                        chunk = sock.recv(64)
                        if not chunk:
                            break
                        replies += chunk
                    if b"+PONG" in replies:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"redis-server on port {self.port} did not start")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@dataclass
class ProductionSite:
    directory: Path
    database_url: str
    redis: PasswordRedis = field(init=False)
    port: int = field(default_factory=free_port)
    secret_key: str = field(default_factory=lambda: secrets.token_hex(32))
    metrics_token: str = field(default_factory=lambda: secrets.token_hex(20))
    process: subprocess.Popen[bytes] | None = None

    @property
    def mail_dir(self) -> Path:
        return self.directory / "mail"

    @property
    def stdout_path(self) -> Path:
        return self.directory / "gunicorn.stdout"

    @property
    def stderr_path(self) -> Path:
        return self.directory / "gunicorn.stderr"

    def environment(self) -> dict[str, str]:
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(_NOT_INHERITED)}
        return {
            **inherited,
            "DJANGO_SETTINGS_MODULE": "tests.security.web_settings",
            "SECURITY_STATIC_ROOT": str(self.directory / "static"),
            "DJANGO_DEBUG": "0",
            "DJANGO_SECRET_KEY": self.secret_key,
            "DJANGO_SECURE_SSL_REDIRECT": "0",
            "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "DJANGO_ADMINS": "Ops <ops@example.com>",
            "EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend",
            "EMAIL_FILE_PATH": str(self.mail_dir),
            "LOG_FORMAT": "json",
            "METRICS_TOKEN": self.metrics_token,
            "REDIS_URL": self.redis.url,
            "DATABASE_URL": self.database_url,
            "VAR_DIR": str(self.directory / "var"),
            "PROMETHEUS_MULTIPROC_DIR": str(self.directory / "prometheus"),
            "GUNICORN_BIND": f"127.0.0.1:{self.port}",
            "GUNICORN_WORKERS": str(WORKERS),
            "PYTHONUNBUFFERED": "1",
        }

    def start(self) -> ProductionSite:
        self.mail_dir.mkdir(parents=True, exist_ok=True)
        self.redis = PasswordRedis(self.directory / "redis").start()
        env = self.environment()
        subprocess.run(
            [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
            cwd=ROOT,
            env=env,
            check=True,
        )
        gunicorn = Path(sys.executable).with_name("gunicorn")
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen(
                [str(gunicorn), "project.wsgi"],
                cwd=ROOT,  # picks up gunicorn.conf.py, as in production
                env=env,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        self._wait_until_up()
        return self

    def _wait_until_up(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        request = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n\r\n".encode()
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"gunicorn exited:\n{self.stderr_path.read_text()}")
            if send(self.port, request, timeout=5).status is not None:
                return
            time.sleep(0.1)
        raise AssertionError(f"gunicorn did not answer:\n{self.stderr_path.read_text()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.redis.kill()
