"""A Django developer adopts the platform the way docs/adopt.md says, from outside.

The wheel is built from this tree and installed into a fresh virtual environment
(nothing of this repository on its path); ``django-admin startproject`` makes a
new project; the settings, urls and actor are the code blocks of docs/adopt.md,
read from that file so the page and the test cannot drift. Then a real
``rundramatiq`` runs the new project's actor and the admin lists its row.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "adopt.md"

pytestmark = pytest.mark.e2e


def doc_block(marker: str) -> str:
    """The fenced code block that follows ``<!-- marker -->`` in docs/adopt.md."""
    found = re.search(rf"<!-- {marker} -->\n```python\n(.*?)```", DOC.read_text(), re.S)
    assert found, f"docs/adopt.md has no block marked {marker}"
    return found.group(1)


def run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def built_wheel(into: Path) -> Path:
    """The distribution's wheel, built from a copy of the tree's files.

    A copy, not the checkout: setuptools reuses ``build/`` across builds, so a
    module deleted from the tree would still ship from an old ``build/lib``.
    Untracked files count (a new module not committed yet); ignored ones do not.
    """
    listed = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    source = into / "source"
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(into), str(source)],
        cwd=into,
        env=env,
    )
    [wheel] = into.glob("django_consistent_jobs-*.whl")
    return wheel


def make_venv(root: Path, python: str, *requirements: str) -> Path:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    run([python, "-m", "venv", str(root / "venv")], cwd=root, env=env)
    run([str(root / "venv/bin/pip"), "install", "-q", *requirements], cwd=root, env=env)
    return root / "venv"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    """A virtual environment holding the platform's wheel and its dependencies only."""
    extra = ["psycopg[binary]>=3.1,<4"] if connection.vendor == "postgresql" else []
    return make_venv(tmp_path_factory.mktemp("adoption"), sys.executable, str(wheel), *extra)


@pytest.fixture
def project_env(venv: Path, tmp_path: Path) -> dict[str, str]:
    """The new project's environment: no trace of this repository or its settings."""
    redis = urlsplit(settings.REDIS_URL)
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DJANGO_", "JOBS_", "DATABASE_", "PROMETHEUS_", "PYTHON"))
    }
    return {
        **env,
        "PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}",
        "DJANGO_SETTINGS_MODULE": "newsite.settings",
        "REDIS_URL": urlunsplit(redis._replace(path="", query="")),
        "PYTHONUNBUFFERED": "1",
    }


@pytest.fixture
def database_settings() -> Iterator[str]:
    """Settings lines for a database of its own on the suite's engine."""
    if connection.vendor != "postgresql":
        yield ""  # startproject's SQLite file
        return
    import psycopg

    name = f"adopt_{uuid.uuid4().hex[:8]}"
    url = urlsplit(os.environ["DATABASE_URL"])
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield (
        "DATABASES = {'default': {'ENGINE': 'django.db.backends.postgresql', "
        f"'NAME': {name!r}, 'USER': {url.username!r}, 'PASSWORD': {url.password or ''!r}, "
        f"'HOST': {url.hostname!r}, 'PORT': {url.port or 5432!r}}}}}\n"
    )
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def start_project(venv: Path, where: Path, env: dict[str, str]) -> Path:
    site = where / "site"
    site.mkdir()
    run([str(venv / "bin/django-admin"), "startproject", "newsite", "."], cwd=site, env=env)
    return site


def test_a_new_project_runs_a_job_with_the_documented_settings(
    venv: Path, project_env: dict[str, str], database_settings: str, tmp_path: Path
) -> None:
    # Given a new project with exactly the lines docs/adopt.md shows
    python = str(venv / "bin/python")
    site = start_project(venv, tmp_path, project_env)
    run([python, "manage.py", "startapp", "shop"], cwd=site, env=project_env)
    settings_file = site / "newsite/settings.py"
    settings_file.write_text(
        settings_file.read_text() + "\n" + doc_block("adoption-settings") + database_settings
    )
    urls_file = site / "newsite/urls.py"
    urls_file.write_text(urls_file.read_text() + "\n" + doc_block("adoption-urls"))
    (site / "shop/tasks.py").write_text(doc_block("adoption-tasks"))
    assert "no issues" in run([python, "manage.py", "check"], cwd=site, env=project_env)

    # When a worker starts before migrate, it refuses in one line naming the command
    early = subprocess.run(
        [python, "manage.py", "rundramatiq", "--processes", "1", "--threads", "2"],
        cwd=site,
        env=project_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    said = early.stdout + early.stderr
    assert early.returncode != 0
    assert "unapplied migration(s)" in said
    assert "python manage.py migrate" in said
    assert "Traceback" not in said
    pending = run(
        [python, "manage.py", "check", "--database", "default"], cwd=site, env=project_env
    )
    assert "jobs.W003" in pending

    # When migrated, with a real worker running, the project's actor is sent
    run([python, "manage.py", "migrate", "-v", "0"], cwd=site, env=project_env)
    worker = subprocess.Popen(
        [python, "manage.py", "rundramatiq", "--processes", "1", "--threads", "2"],
        cwd=site,
        env=project_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        run(
            [
                python,
                "manage.py",
                "shell",
                "-c",
                "from shop.tasks import send_receipt; send_receipt.send(42); send_receipt.send(-1)",
            ],
            cwd=site,
            env=project_env,
        )
        states = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            states = run(
                [python, "manage.py", "shell", "-c", LEDGER_STATES], cwd=site, env=project_env
            )
            if "send_receipt succeeded 1" in states and "send_receipt failed 1" in states:
                break
            time.sleep(0.5)
        # Then the ledger shows one success, one permanent failure not retried
        assert "send_receipt succeeded 1" in states
        assert "send_receipt failed 1" in states
        # And the admin's pages render in the new project
        pages = run([python, "manage.py", "shell", "-c", ADMIN_PAGES], cwd=site, env=project_env)
        assert "/admin/jobs/job/ 200 True" in pages
        assert "/admin/jobs/job/dashboard/ 200" in pages
        assert "/admin/jobs/job/schedules/ 200" in pages
        assert "/healthz 200" in pages
    finally:
        os.killpg(worker.pid, 15)
        worker.wait(timeout=30)


def test_a_project_with_nothing_configured_gets_check_errors_not_tracebacks(
    venv: Path, project_env: dict[str, str], tmp_path: Path
) -> None:
    # Given a new project that only lists the apps
    python = str(venv / "bin/python")
    site = start_project(venv, tmp_path, project_env)
    settings_file = site / "newsite/settings.py"
    settings_file.write_text(
        settings_file.read_text() + '\nINSTALLED_APPS += ["jobs", "django_dramatiq"]\n'
        "JOBS_MAX_RETRIES = '5'\n"
    )
    # When it is checked
    checked = subprocess.run(
        [python, "manage.py", "check"],
        cwd=site,
        env=project_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    said = checked.stdout + checked.stderr
    # Then every missing or wrong setting is named, with no traceback
    assert checked.returncode == 1
    assert "Traceback" not in said
    assert "(jobs.E002) DRAMATIQ_BROKER is not set" in said
    assert "(jobs.E004) CACHES['default']" in said
    assert "(jobs.E005) JOBS_MAX_RETRIES must be int" in said


LEDGER_STATES = """
from jobs.models import Job
for job in Job.objects.all():
    print(job.actor_name, job.state, job.attempts)
"""

ADMIN_PAGES = """
from django.test.utils import setup_test_environment
setup_test_environment()
from django.contrib.auth.models import User
from django.test import Client
client = Client()
client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
response = client.get("/admin/jobs/job/")
print("/admin/jobs/job/", response.status_code, b"send_receipt" in response.content)
for url in ("/admin/jobs/job/dashboard/", "/admin/jobs/job/schedules/", "/healthz"):
    print(url, client.get(url).status_code)
"""


def test_a_worker_whose_redis_is_unreachable_says_so_once_naming_the_settings(
    venv: Path, project_env: dict[str, str], tmp_path: Path
) -> None:
    # Given the documented project, migrated, with REDIS_URL at a port nobody listens on
    python = str(venv / "bin/python")
    site = start_project(venv, tmp_path, project_env)
    settings_file = site / "newsite/settings.py"
    settings_file.write_text(
        settings_file.read_text() + "\n" + doc_block("adoption-settings").replace(', "shop"', "")
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    env = {**project_env, "REDIS_URL": f"redis://:hunter2@127.0.0.1:{closed}"}
    run([python, "manage.py", "migrate", "-v", "0"], cwd=site, env=env)
    # When a worker runs for 12 s
    worker = subprocess.Popen(
        [python, "manage.py", "rundramatiq", "--processes", "1", "--threads", "4"],
        cwd=site,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    time.sleep(12)
    os.killpg(worker.pid, 15)
    said, _ = worker.communicate(timeout=30)
    # Then a few lines say where Redis should be and which settings point there,
    # with no traceback and no password (without the filter: about 1,000 lines)
    assert f"Redis at 127.0.0.1:{closed} (DRAMATIQ_BROKER and CACHES['default'])" in said
    assert "Traceback" not in said
    assert "hunter2" not in said
    assert len(said.splitlines()) < 30, said


def _python_3_12_or_newer() -> str | None:
    versions = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = sorted(versions.glob("3.1[2-9]*/bin/python3")) if versions.is_dir() else []
    return str(found[0]) if found else shutil.which("python3.12")


def test_django_5_2_on_a_newer_python_has_the_tasks_backport(
    wheel: Path, project_env: dict[str, str], tmp_path: Path
) -> None:
    # Django 5.2 (the LTS) runs on Python 3.12+, where no marker on the Python
    # version can tell that the django.tasks backport is needed.
    if connection.vendor != "sqlite" or sys.version_info[:2] != (3, 11):
        pytest.skip("runs once per CI: in the SQLite row on the oldest Python")
    python = _python_3_12_or_newer()
    if python is None:
        pytest.skip("no Python 3.12+ interpreter on this machine (pyenv or PATH)")
    venv = make_venv(tmp_path, python, str(wheel), "Django>=5.2,<6")
    env = {**project_env, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    site = start_project(venv, tmp_path, env)
    settings_file = site / "newsite/settings.py"
    settings_file.write_text(
        settings_file.read_text() + "\n" + doc_block("adoption-settings").replace(', "shop"', "")
    )
    said = run([str(venv / "bin/python"), "manage.py", "check"], cwd=site, env=env)
    assert "no issues" in said
    version = run(
        [str(venv / "bin/python"), "-c", "import django; print(django.VERSION[:2])"],
        cwd=site,
        env=env,
    )
    assert version.strip() == "(5, 2)"
