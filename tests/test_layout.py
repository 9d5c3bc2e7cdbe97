"""The architecture the folders promise: imports run one way, and production
loads no example actors."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    """Every absolute module a file imports, at the top or inside functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def imports_of(package: str) -> dict[str, set[str]]:
    return {
        str(path.relative_to(ROOT)): imported_modules(path)
        for path in (ROOT / package.replace(".", "/")).rglob("*.py")
        if "migrations" not in path.parts
    }


def offenders(package: str, forbidden: str) -> list[str]:
    return sorted(
        f"{file} imports {module}"
        for file, modules in imports_of(package).items()
        for module in modules
        if module == forbidden or module.startswith(f"{forbidden}.")
    )


def test_the_platform_never_imports_the_product() -> None:
    assert offenders("jobs", "accounts") == []


def test_the_toolkit_ledger_and_broker_never_import_the_admin() -> None:
    for package in ("jobs.consistency", "jobs.ledger", "jobs.broker", "jobs.scheduling"):
        assert offenders(package, "jobs.admin") == [], package


def test_the_counters_module_depends_on_no_other_package() -> None:
    # Every package increments metrics; metrics importing them back would be a cycle.
    modules = imported_modules(ROOT / "jobs/observability/metrics.py")
    assert {m for m in modules if m.startswith("jobs.")} == set()


def test_production_settings_load_no_example_actors() -> None:
    # The admin's actor filter lists the broker's actors: production must not
    # show the tests' demo actors there.
    code = (
        "import json, django, dramatiq; django.setup();"
        "from django_dramatiq.apps import DjangoDramatiqConfig;"
        "import jobs.tasks, accounts.tasks;"
        "print(json.dumps(sorted(dramatiq.get_broker().actors)))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings"}
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    actors = json.loads(result.stdout.strip().splitlines()[-1])
    assert "send_welcome_email" in actors
    assert "demo_pipeline" not in actors
