from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    """One account per email, case-insensitively, enforced by the database.

    The form checks first for a friendly message; this index settles the race of
    two concurrent signups with the same address (the form check passes for both).
    """

    dependencies = [("auth", "0012_alter_user_first_name_max_length")]

    operations = [
        migrations.RunSQL(
            sql="CREATE UNIQUE INDEX accounts_user_email_ci ON auth_user (LOWER(email)) WHERE email <> ''",
            reverse_sql="DROP INDEX accounts_user_email_ci",
        ),
    ]
