"""JOBS_PERIODIC chooses which of the platform's periodic jobs are scheduled."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCHEDULED = (
    "import django; django.setup(); "
    "from jobs.scheduling.scheduler import periodic_actors; "
    "print(sorted(a.actor_name for a in periodic_actors() if a.actor_name in "
    "('watchdog', 'prune_jobs', 'daily_report')))"
)


def scheduled_with(tmp_path: Path, line: str) -> str:
    # Actors are declared once per process: each setting needs a process of its own.
    (tmp_path / "periodic_settings.py").write_text(f"from tests.settings import *\n{line}\n")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "periodic_settings",
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
    }
    done = subprocess.run(
        [sys.executable, "-c", SCHEDULED],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def test_the_platform_schedules_its_three_jobs_by_default(tmp_path: Path) -> None:
    assert scheduled_with(tmp_path, "") == "['daily_report', 'prune_jobs', 'watchdog']"


def test_a_project_can_leave_out_the_daily_report(tmp_path: Path) -> None:
    shown = scheduled_with(tmp_path, 'JOBS_PERIODIC = ["watchdog", "prune_jobs"]')
    assert shown == "['prune_jobs', 'watchdog']"
