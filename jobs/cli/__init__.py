"""``manage.py jobs``: the operator's console in a terminal, one module per concern.

``selection`` turns ids or the admin list's filters into a queryset, ``console``
prints (text or one JSON document), asks, reports progress and writes the audit
line; ``status``, ``failed``, ``actions`` (retry, cancel) and ``control`` (pause,
resume) each answer one subcommand. The command itself
(``jobs.management.commands.jobs``) only parses and dispatches.
"""

from __future__ import annotations

# Exit statuses, documented in docs/reference/commands.md. A script tells "did
# nothing" (1) from "called wrongly" (2) from "could not ask" (3).
EXIT_OK = 0
EXIT_PARTIAL = 1  # nothing matched, the operator declined, or some jobs were left alone
EXIT_USAGE = 2  # bad arguments, an empty filter without --all, no --yes without a terminal
EXIT_UNAVAILABLE = 3  # Redis or the database could not be reached
