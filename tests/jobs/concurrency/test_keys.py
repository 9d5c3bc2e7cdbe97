"""An actor's concurrency declaration is checked when it is declared."""

from __future__ import annotations

from typing import Any

import dramatiq
import pytest

from jobs.concurrency import keys


def test_a_key_names_the_jobs_arguments_by_name() -> None:
    @dramatiq.actor(
        queue_name="keys-test", actor_name="keys_pack", concurrency_key="order:{order_id}:{kind}"
    )
    def pack(order_id: int, kind: str = "box") -> None: ...

    message = pack.message(42)
    assert keys.key_of(message) == ("order:42:box", 1)
    assert keys.key_of(pack.message(kind="bag", order_id=7)) == ("order:7:bag", 1)
    # Arguments that do not fit the function: the template is the key, so such
    # jobs are still limited (and fail in their call, with Python's TypeError).
    assert keys.key_of(pack.message()) == ("order:{order_id}:{kind}", 1)  # type: ignore[call-arg]


def test_a_key_that_cannot_be_built_limits_under_the_template() -> None:
    @dramatiq.actor(
        queue_name="keys-test", actor_name="keys_items", concurrency_key="o:{order[id]}"
    )
    def ship(order: dict[str, int]) -> None: ...

    assert keys.key_of(ship.message({"id": 7})) == ("o:7", 1)
    # Fail closed: a dict without the item is limited with every other such job.
    assert keys.key_of(ship.message({"ID": 7})) == ("o:{order[id]}", 1)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"concurrency_key": "order:{order}"}, "names 'order', which is not an argument"),
        ({"concurrency_key": "order:{order_id", "concurrency_limit": 2}, "not a format string"),
        ({"concurrency_key": ""}, "non-empty format string"),
        ({"concurrency_key": "order:{order_id}", "concurrency_limit": 0}, "1 or more, not 0"),
        ({"concurrency_key": "order:{order_id}", "concurrency_limit": True}, "not True"),
        ({"concurrency_limit": 3}, "needs a concurrency_key"),
        # JSON arguments have items, not attributes ({order.keys} would be a
        # bound method's repr: a new key for every job).
        ({"concurrency_key": "order:{order_id.real}"}, "reads an attribute"),
        ({"concurrency_key": "o:{order_id:{order_id}}"}, "nests a field"),
    ],
)
def test_a_declaration_that_does_not_fit_fails_at_import(
    options: dict[str, Any], says: str
) -> None:
    with pytest.raises(keys.ConcurrencyKeyError, match=says.replace("(", r"\(")):

        @dramatiq.actor(queue_name="keys-test", actor_name="bad_declaration", **options)
        def ship(order_id: int) -> None: ...


def test_a_long_key_is_shortened_to_a_prefix_and_a_hash() -> None:
    long = "tenant:" + "x" * 500
    short = keys.shortened(long)
    assert len(short) == keys.MAX_KEY_LENGTH
    assert short.startswith("tenant:xxx")
    assert short != keys.shortened(long + "y")


def test_actors_sharing_a_key_must_share_its_limit() -> None:
    @dramatiq.actor(
        queue_name="keys-test",
        actor_name="keys_low",
        concurrency_key="shared:{k}",
        concurrency_limit=1,
    )
    def low(k: int) -> None: ...

    with pytest.raises(
        keys.ConcurrencyKeyError, match="also the key of actor 'keys_low', with concurrency_limit=1"
    ):

        @dramatiq.actor(
            queue_name="keys-test",
            actor_name="keys_high",
            concurrency_key="shared:{k}",
            concurrency_limit=3,
        )
        def high(k: int) -> None: ...

    @dramatiq.actor(
        queue_name="keys-test",
        actor_name="keys_same",
        concurrency_key="shared:{k}",
        concurrency_limit=1,
    )
    def same(k: int) -> None: ...

    assert keys.key_of(same.message(1)) == keys.key_of(low.message(1)) == ("shared:1", 1)
