"""The settings reference table of ``docs/reference/settings.md``, made from the defaults.

``python -m jobs.conf.reference`` prints it; a test checks the page holds exactly
this table, so a new setting cannot go undocumented.
"""

from __future__ import annotations

from jobs.conf.defaults import DEFAULTS, Knob


def _default(knob: Knob) -> str:
    if callable(knob.default):
        return "computed"
    return f"`{knob.default!r}`"


def reference_table() -> str:
    rows = ["| Setting | Default | What it does |", "| --- | --- | --- |"]
    for name, knob in DEFAULTS.items():
        doc = knob.doc.replace("``", "`").replace("|", "\\|")
        rows.append(f"| `{name}` | {_default(knob)} | {doc} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(reference_table(), end="")
