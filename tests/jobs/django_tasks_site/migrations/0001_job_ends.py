"""The trigger that publishes django-tasks-db's task ends (docs/jobs.md's migration)."""

from __future__ import annotations

from django.db import migrations

from aiopurgatory.jobs.django_tasks import schema_sql


class Migration(migrations.Migration):
    dependencies = [("django_tasks_database", "0021_conditional_partial_index_ordering")]  # noqa: RUF012
    operations = [migrations.RunSQL(schema_sql())]  # noqa: RUF012
