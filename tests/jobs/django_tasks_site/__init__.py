"""The Django project of the django-tasks tests: settings, tasks, and the trigger's migration.

Its real worker is django-tasks-db's ``db_worker``
(``python -m django db_worker --settings tests.jobs.django_tasks_site.settings``),
with no aiopurgatory code: the task ends are published by the trigger that the
migration installs on django-tasks-db's table.
"""
