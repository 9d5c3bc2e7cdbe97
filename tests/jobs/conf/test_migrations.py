"""Unapplied migrations are reported, not discovered through failing writes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db.migrations.recorder import MigrationRecorder

from jobs.conf import migrations
from jobs.conf.migrations import check_migrations, pending_migrations


@pytest.fixture
def unapplied() -> Iterator[str]:
    """The platform's latest migration marked unapplied (rolled back with the test)."""
    migrations._applied.clear()
    latest = MigrationRecorder.Migration.objects.filter(app="jobs").order_by("-name").first()
    assert latest is not None
    latest.delete()
    yield f"jobs.{latest.name}"
    migrations._applied.clear()


@pytest.mark.django_db
def test_healthz_answers_503_while_a_migration_is_pending(client, unapplied: str) -> None:
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["checks"]["migrations"] == "pending: 1 unapplied"


@pytest.mark.django_db
def test_healthz_remembers_a_migrated_database(client, django_assert_max_num_queries) -> None:
    migrations._applied.clear()
    assert client.get("/healthz").json()["checks"]["migrations"] == "ok"
    # The migration graph is read once; later probes only ask the database for SELECT 1.
    with django_assert_max_num_queries(1):
        assert client.get("/healthz").status_code == 200


@pytest.mark.django_db
def test_the_database_check_names_the_pending_migration(unapplied: str) -> None:
    assert pending_migrations() == [unapplied]
    [warning] = check_migrations(databases=["default"])
    assert warning.id == "jobs.W003"
    assert unapplied in warning.msg
    assert "python manage.py migrate" in warning.msg
