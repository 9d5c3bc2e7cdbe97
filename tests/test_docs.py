"""Code the docs show in two places is the same code in both."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def marked_block(path: Path, marker: str) -> str:
    """The fenced code block that follows ``<!-- marker -->`` in ``path``."""
    found = re.search(rf"<!-- {marker} -->\n```python\n(.*?)```", path.read_text(), re.S)
    assert found, f"{path.relative_to(ROOT)} has no block marked {marker}"
    return found.group(1)


def test_the_readme_shows_the_settings_the_adoption_test_runs() -> None:
    # tests/e2e/test_adoption.py runs docs/adopt.md's block in a new project; a
    # README reader who copies the README's must get the same (no jobs.W004).
    readme = marked_block(ROOT / "README.md", "adoption-settings")
    assert readme == marked_block(ROOT / "docs/adopt.md", "adoption-settings")
