"""The shipped settings, with static files collected into the test's own directory.

With DEBUG off the project serves static files through WhiteNoise's manifest
storage, which needs ``collectstatic`` to have run into ``STATIC_ROOT`` (the
Dockerfile does it at build time); every page that names a static file is a 500
without it. ``STATIC_ROOT`` is not read from the environment, and the test must
not write into the checkout, so this is the one setting that differs.
"""

from __future__ import annotations

import os
from pathlib import Path

from project.settings import *  # noqa: F403

STATIC_ROOT = Path(os.environ["SECURITY_STATIC_ROOT"])
