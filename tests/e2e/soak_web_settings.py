"""Settings for the soak test's web process: what ships, with a fast password hasher.

The soak tests crash safety under 500 signups; Django's PBKDF2 (about 180 ms a
hash) would spend over a minute of both cores on hashing alone and push the
test past its budget. Nothing else differs from the shipped settings (the
signup rate limit stays on: the test signs up from distinct loopback addresses).
"""

from __future__ import annotations

from tests.worker_settings import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
