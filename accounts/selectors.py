"""Reads of the accounts app. Cached reads are invalidated by ``accounts.signals``."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model

from jobs.consistency.cache import cache_loader, cached

User = get_user_model()

PROFILE_NAMESPACE = "user-profile"


class UserNotFound(Exception):
    pass


def _profile_ttl() -> float:
    return float(getattr(settings, "USER_PROFILE_CACHE_TTL", 300))


@cache_loader(PROFILE_NAMESPACE, ttl=300)
def user_profile_load(key: str) -> dict[str, Any] | None:
    """The public profile of user ``key``; None if there is no such user.

    Public, so the address and other private fields stay out of it (the endpoint
    needs no login).
    """
    user = User.objects.filter(pk=int(key)).first()
    if user is None:
        return None
    joined = getattr(user, "date_joined", None)
    return {
        "id": user.pk,
        "username": user.get_username(),
        "first_name": getattr(user, "first_name", ""),
        "date_joined": joined.isoformat() if joined is not None else None,
    }


def user_profile(user_id: int) -> dict[str, Any]:
    """The public profile of ``user_id``, served from the cache; ``UserNotFound`` if none."""
    key = str(user_id)
    profile = cached(PROFILE_NAMESPACE, key, lambda: user_profile_load(key), ttl=_profile_ttl())
    if profile is None:
        raise UserNotFound(user_id)
    return profile
