"""Settings of the django-tasks tests' project: PostgreSQL from ``AIOPURGATORY_JOBS_POSTGRES``."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

_DSN = urlsplit(
    os.environ.get("AIOPURGATORY_JOBS_POSTGRES", "postgresql://postgres@127.0.0.1:1/none")
)

SECRET_KEY = "tests-only"
USE_TZ = True
INSTALLED_APPS = ["django_tasks", "django_tasks_db", "tests.jobs.django_tasks_site"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": _DSN.hostname,
        "PORT": _DSN.port,
        "USER": _DSN.username,
        "NAME": _DSN.path.lstrip("/"),
    }
}
TASKS = {
    "default": {
        "BACKEND": "django_tasks_db.DatabaseBackend",
        "QUEUES": ["default", "kill", "nobody"],
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING_CONFIG = None
