"""Drop a user's cached profile after any change to the user commits."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from accounts.selectors import PROFILE_NAMESPACE
from jobs.consistency.cache import invalidate_on_commit

User = get_user_model()


@receiver(post_save, sender=User, dispatch_uid="accounts.profile_cache.save")
@receiver(post_delete, sender=User, dispatch_uid="accounts.profile_cache.delete")
def drop_cached_profile(sender: type[Any], instance: Any, **kwargs: Any) -> None:
    # Also on create: a "no such user" answer for this id may be cached.
    invalidate_on_commit(PROFILE_NAMESPACE, str(instance.pk))
