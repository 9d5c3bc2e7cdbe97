"""The shipped alert rules pass their promtool unit tests, and a broken rule fails them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

RULES = Path(__file__).resolve().parents[1] / "deploy" / "prometheus"


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    executable = shutil.which("promtool")
    assert executable, "promtool is needed: apt-get install prometheus (bin/test does it as root)"
    return subprocess.run([executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_alert_rules_pass_their_unit_tests() -> None:
    checked = promtool("check", "rules", "alerts.yml", cwd=RULES)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "alerts_test.yml", cwd=RULES)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


@pytest.mark.parametrize(
    ("original", "broken"),
    [
        ("> 0.10\n", "> 0.50\n"),  # failure-rate threshold raised: flaky's 30% no longer alerts
        ("jobs_running_over_time_limit > 0", "jobs_running_over_time_limit > 5"),
        ("for: 2m", "for: 10m"),  # worker absent for longer before paging
        # an undrained ledger intake tolerated up to 100,000 entries
        ("jobs_ledger_intake_waiting > 10000", "jobs_ledger_intake_waiting > 100000"),
    ],
)
def test_a_broken_rule_fails_its_unit_test(tmp_path: Path, original: str, broken: str) -> None:
    rules = (RULES / "alerts.yml").read_text()
    assert original in rules
    (tmp_path / "alerts.yml").write_text(rules.replace(original, broken, 1))
    shutil.copy(RULES / "alerts_test.yml", tmp_path / "alerts_test.yml")

    result = promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)

    assert result.returncode != 0
    assert "FAILED" in result.stdout + result.stderr
