"""The tasks the django-tasks tests enqueue (the worker imports them by path)."""

from __future__ import annotations

import time

from django_tasks import task


@task()
def add(x: int, y: int) -> int:
    return x + y


@task()
def fail(message: str) -> None:
    raise ValueError(message)


@task()
def sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds
