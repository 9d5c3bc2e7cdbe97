"""Commands in another shell find the private Redis of a running bin/dev."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from project.devservices import load_dev_services

ROOT = Path(__file__).resolve().parents[1]


def write(var_dir: Path, pid: int, extra: str = "") -> None:
    (var_dir / "dev.env").write_text(f"REDIS_URL=redis://127.0.0.1:7777/0\nDEV_PID={pid}\n{extra}")


@pytest.fixture
def bin_dev(tmp_path: Path) -> Iterator[int]:
    """A process whose command line is a bin/dev, as the real one's is."""
    script = tmp_path / "bin" / "dev"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\nsleep 60\n")
    script.chmod(0o755)
    process = subprocess.Popen(["/bin/sh", str(script)])
    cmdline = Path(f"/proc/{process.pid}/cmdline")
    deadline = time.monotonic() + 10
    while b"bin/dev" not in cmdline.read_bytes():  # until the fork has exec'd
        assert time.monotonic() < deadline
        time.sleep(0.01)
    yield process.pid
    process.kill()
    process.wait()


def test_a_shell_beside_a_running_bin_dev_gets_its_redis(tmp_path, monkeypatch, bin_dev) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    write(tmp_path, bin_dev)
    load_dev_services(tmp_path)
    assert os.environ["REDIS_URL"] == "redis://127.0.0.1:7777/0"


def test_a_reused_pid_is_not_a_bin_dev(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    write(tmp_path, 1)  # alive, but not bin/dev
    load_dev_services(tmp_path)
    assert "REDIS_URL" not in os.environ


def test_only_redis_url_is_taken_and_bad_lines_are_skipped(tmp_path, monkeypatch, bin_dev) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    write(tmp_path, bin_dev, extra="=x\nDATABASE_URL=postgres://evil/db\nJUNK\x00=1\n")
    load_dev_services(tmp_path)
    assert os.environ["REDIS_URL"] == "redis://127.0.0.1:7777/0"
    assert "DATABASE_URL" not in os.environ


def test_a_file_left_by_a_killed_bin_dev_is_ignored(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    write(tmp_path, gone.pid)
    load_dev_services(tmp_path)
    assert "REDIS_URL" not in os.environ


def test_a_variable_set_by_the_person_wins(tmp_path, monkeypatch, bin_dev) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://elsewhere:6379/0")
    write(tmp_path, bin_dev)
    load_dev_services(tmp_path)
    assert os.environ["REDIS_URL"] == "redis://elsewhere:6379/0"


@pytest.mark.parametrize("settings_module", ["tests.settings", "tests.worker_settings"])
def test_the_tests_never_read_the_developers_file(settings_module: str, bin_dev: int) -> None:
    # Given a developer's bin/dev running (its file in the checkout's var/)
    var = ROOT / "var"
    var.mkdir(exist_ok=True)
    existing = (var / "dev.env").read_text() if (var / "dev.env").exists() else None
    write(var, bin_dev)
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "VAR_DIR")}
        env["DJANGO_SETTINGS_MODULE"] = settings_module
        # When the test settings load with no REDIS_URL of their own
        shown = subprocess.run(
            [sys.executable, "-c", "from django.conf import settings; print(settings.REDIS_URL)"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        # Then they chose their own Redis, not the developer's
        assert "7777" not in shown
    finally:
        if existing is None:
            (var / "dev.env").unlink()
        else:
            (var / "dev.env").write_text(existing)
