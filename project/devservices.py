"""Where ``bin/dev``'s private services listen, for commands run in other shells.

``bin/dev`` starts Redis on a free port and writes ``var/dev.env`` (``REDIS_URL``
and its own pid); a ``manage.py createsuperuser`` or ``shell`` started in another
terminal reads it when ``REDIS_URL`` is unset, so it talks to the same Redis.
The file counts only while that ``bin/dev`` runs (its pid alive and still a
``bin/dev``), and only ``REDIS_URL`` is taken from it. The tests never read it:
only ``project.settings`` itself does (not the settings that import it), and the
tests set a ``VAR_DIR`` of their own.
"""

from __future__ import annotations

import os
from pathlib import Path

FILE_NAME = "dev.env"
TAKEN = ("REDIS_URL",)


def load_dev_services(var_dir: Path) -> None:
    """Put ``var_dir/dev.env``'s ``REDIS_URL`` into ``os.environ`` if it is unset."""
    try:
        lines = (var_dir / FILE_NAME).read_text(errors="replace").splitlines()
    except OSError:
        return
    values: dict[str, str] = {}
    for line in lines:
        name, equals, value = line.partition("=")
        if equals and name in (*TAKEN, "DEV_PID") and "\x00" not in value:
            values[name] = value.strip()
    if not _is_bin_dev(values.get("DEV_PID", "")):
        return
    for name in TAKEN:
        if values.get(name) and not os.environ.get(name):
            os.environ[name] = values[name]


def _is_bin_dev(pid: str) -> bool:
    """Whether ``pid`` is a running ``bin/dev`` (a reused pid is someone else)."""
    if not pid.isdigit():
        return False
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\x00")
    except OSError:
        return False
    return any(part.endswith(b"bin/dev") for part in command)
