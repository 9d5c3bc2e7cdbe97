from __future__ import annotations

from django.apps import AppConfig


class ExamplesConfig(AppConfig):
    name = "tests.examples"
    label = "examples"
    verbose_name = "Example actors (tests only)"
