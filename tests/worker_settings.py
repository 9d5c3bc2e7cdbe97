"""Settings for worker subprocesses started by tests: exactly what ships, plus the
example actors of ``tests/examples`` (which production never loads)."""

from __future__ import annotations

from project.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.examples"]  # noqa: F405
