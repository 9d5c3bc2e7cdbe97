"""The payload check's short way of binding arguments agrees with ``Signature.bind``."""

from __future__ import annotations

import inspect
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.middleware.payloads import fast_binder

P = inspect.Parameter
KINDS = [
    P.POSITIONAL_ONLY,
    P.POSITIONAL_OR_KEYWORD,
    P.VAR_POSITIONAL,
    P.KEYWORD_ONLY,
    P.VAR_KEYWORD,
]
NAMES = ["a", "b", "c", "d", "e"]


@st.composite
def signatures(draw: st.DrawFn) -> inspect.Signature:
    """Any signature Python accepts, of up to five parameters."""
    count = draw(st.integers(0, 5))
    kinds = sorted(draw(st.lists(st.sampled_from(KINDS), min_size=count, max_size=count)))
    parameters = []
    for name, kind in zip(NAMES, kinds, strict=False):
        default: Any = P.empty
        if kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD) and draw(st.booleans()):
            default = 0
        parameters.append(P(name, kind, default=default))
    try:
        return inspect.Signature(parameters)
    except ValueError:  # a default before a non-default, two *args, ...
        return inspect.Signature(
            [
                p.replace(default=P.empty)
                for p in parameters
                if p.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD)
            ]
        )


arguments = st.tuples(
    st.lists(st.integers(), max_size=6).map(tuple),
    st.dictionaries(st.sampled_from([*NAMES, "z"]), st.integers(), max_size=4),
)


@settings(max_examples=2_000, deadline=None)
@given(signature=signatures(), call=arguments)
def test_it_binds_what_bind_binds_and_leaves_the_rest_to_bind(
    signature: inspect.Signature, call: tuple[tuple[Any, ...], dict[str, Any]]
) -> None:
    # Given any signature and any arguments
    args, kwargs = call
    try:
        expected: list[tuple[str, Any]] | None = list(
            signature.bind(*args, **kwargs).arguments.items()
        )
    except TypeError:
        expected = None
    # When the short way binds them
    found = fast_binder(signature)(args, kwargs)
    # Then it gives bind's arguments in bind's order, or None for bind to answer
    if found is not None:
        assert list(found.items()) == expected
    plain = all(
        p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY) for p in signature.parameters.values()
    )
    if plain:  # and it takes the short way for every call that fits a plain signature
        assert (found is None) == (expected is None)
    else:
        assert found is None
