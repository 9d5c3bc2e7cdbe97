from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]


# Dramatiq's own command on a module of actors (see tests.e2e.stock_worker_app)
STOCK_DRAMATIQ = ("-m", "dramatiq", "tests.e2e.stock_worker_app")


class WorkerProcess:
    """``python manage.py rundramatiq`` (or another ``command``) as a real subprocess."""

    def __init__(
        self,
        env: dict[str, str],
        log_path: Path,
        *,
        processes: int = 1,
        threads: int = 2,
        queues: tuple[str, ...] = (),
        command: tuple[str, ...] = ("manage.py", "rundramatiq"),
        shutdown_timeout_ms: int = 5000,
    ) -> None:
        self.log_path = log_path
        log = open(log_path, "ab")  # noqa: SIM115 - handed to the child
        self.process = subprocess.Popen(
            [
                sys.executable,
                *command,
                "--processes",
                str(processes),
                "--threads",
                str(threads),
                "--worker-shutdown-timeout",
                str(shutdown_timeout_ms),
                *(["--queues", *queues] if queues else []),
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log():
                return
            if self.process.poll() is not None:
                raise AssertionError(f"worker exited {self.process.returncode}:\n{self.log()}")
            time.sleep(0.1)
        raise AssertionError(f"{text!r} not in worker log after {timeout} s:\n{self.log()}")

    def terminate(self, timeout: float = 30) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def group_pids(self) -> list[int]:
        """The pids of this worker's process group (the command and its workers)."""
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == self.process.pid:  # field 5: the process group
                pids.append(int(stat.parent.name))
        return pids


@pytest.fixture
def worker_env(tmp_path: Path, test_database_url: str) -> dict[str, str]:
    """Environment for a subprocess that shares this test's database and Redis."""
    mail_dir = tmp_path / "mail"
    mail_dir.mkdir()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.worker_settings",  # shipped settings + example actors
        "DATABASE_URL": test_database_url,
        "REDIS_URL": settings.REDIS_URL,
        "EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend",
        "EMAIL_FILE_PATH": str(mail_dir),
        "PYTHONUNBUFFERED": "1",
    }
    return env


@pytest.fixture
def start_worker(
    worker_env: dict[str, str], tmp_path: Path
) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(env: dict[str, str] | None = None, **options: Any) -> WorkerProcess:
        log = tmp_path / f"worker-{len(started)}.log"
        worker = WorkerProcess({**worker_env, **(env or {})}, log, **options)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill()


CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = ROOT / "test-artifacts"


@pytest.fixture(scope="session")
def chromium_browser() -> Iterator[Any]:
    """Headless Debian Chromium driven by Playwright (no browser download)."""
    # Playwright's sync API runs an event loop in this thread; Django then refuses
    # ORM calls from it unless told the test knows what it does.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    assert executable, "browser tests need Debian's chromium: apt-get install chromium"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, headless=True, args=CHROMIUM_FLAGS
        )
        yield browser
        browser.close()
    del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]


@pytest.fixture
def page(chromium_browser: Any) -> Iterator[Any]:
    context = chromium_browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def wide_page(chromium_browser: Any) -> Iterator[Any]:
    """An operator's screen: 1366 px wide, 15 s for each wait."""
    context = chromium_browser.new_context(viewport={"width": 1366, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    context.close()


def screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class WebProcess:
    """gunicorn serving the project on a free loopback port."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        log = open(log_path, "ab")  # noqa: SIM115 - handed to the child
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "project.wsgi", "--workers", "1"],
            cwd=ROOT,
            env={**env, "GUNICORN_BIND": f"127.0.0.1:{self.port}"},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.wait_until_up()

    def wait_until_up(self, timeout: float = 20) -> None:
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.url}/accounts/signup/", timeout=2)
                return
            except (urllib.error.URLError, ConnectionError, OSError):
                if self.process.poll() is not None:
                    raise AssertionError(self.log_path.read_text()) from None
                time.sleep(0.1)
        raise AssertionError(f"gunicorn did not start:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


@pytest.fixture
def start_web(worker_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., WebProcess]]:
    started: list[WebProcess] = []

    def start(**env: str) -> WebProcess:
        web = WebProcess({**worker_env, **env}, tmp_path / f"web-{len(started)}.log")
        started.append(web)
        return web

    yield start
    for web in started:
        web.stop()


class SchedulerProcess:
    """``python manage.py runscheduler`` as a real subprocess."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        log = open(log_path, "ab")  # noqa: SIM115 - handed to the child
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "runscheduler"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture
def start_scheduler(
    worker_env: dict[str, str], tmp_path: Path
) -> Iterator[Callable[..., SchedulerProcess]]:
    started: list[SchedulerProcess] = []

    def start(**env: str) -> SchedulerProcess:
        scheduler = SchedulerProcess({**worker_env, **env}, tmp_path / f"sched-{len(started)}.log")
        started.append(scheduler)
        return scheduler

    yield start
    for scheduler in started:
        scheduler.stop()
