"""Where ``bin/dev``'s private services listen, for commands run in other shells.

``bin/dev`` starts Redis on a free port and writes ``var/dev.env`` (``REDIS_URL``
and its own pid); a ``manage.py createsuperuser`` or ``shell`` started in another
terminal reads it when ``REDIS_URL`` is unset, so it talks to the same Redis.
The file counts only while that ``bin/dev`` runs. The tests never read it: they
set ``REDIS_URL`` and a ``VAR_DIR`` of their own before the settings load.
"""

from __future__ import annotations

import os
from pathlib import Path

FILE_NAME = "dev.env"


def load_dev_services(var_dir: Path) -> None:
    """Put ``var_dir/dev.env``'s variables into ``os.environ`` where they are unset."""
    path = var_dir / FILE_NAME
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return
    values = dict(line.split("=", 1) for line in lines if "=" in line)
    if not _alive(values.pop("DEV_PID", "")):
        return
    for name, value in values.items():
        if not os.environ.get(name):
            os.environ[name] = value


def _alive(pid: str) -> bool:
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
