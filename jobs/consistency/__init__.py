"""The consistency toolkit a job author imports.

Locks, cache-aside, idempotency, checkpoints, dedup, rate limits and the outbox.
"""
