"""Request-level guards of the platform's web side (Django middleware, not Dramatiq's)."""
