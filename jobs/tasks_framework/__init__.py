"""Django's Tasks framework (``django.tasks``) on the Dramatiq platform.

``DramatiqBackend`` (``backend.py``) enqueues ``@task`` functions as Dramatiq
messages; ``runner.py`` is the actor that runs them in the workers, through the
same middleware as every actor; ``results.py`` reads their results from the job
ledger; ``compat.py`` picks ``django.tasks`` (Django 6) or the ``django_tasks``
backport (Django 5.2).
"""
