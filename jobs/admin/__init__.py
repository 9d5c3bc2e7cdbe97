"""The job ledger in the Django admin: job list and detail, dashboard, schedules.

Django's admin autodiscovery imports ``jobs.admin``; importing ``jobs`` below
registers the model admins.
"""

from jobs.admin import audit as audit
from jobs.admin import jobs as jobs
