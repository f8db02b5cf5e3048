"""Gaps that mutation testing of ``store/`` found (``scripts/mutants store``): each test here fails
on a realistic bug of the shape of a mutant the rest of the suite let through. Memory store,
virtual time where anything waits."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioelastic.store._args import check_int, check_key, check_prefix, check_value, prefix_end

# Keys from a few interesting code points: around the surrogate block and the top of Unicode.
EDGE_CHARS = st.sampled_from(["a", "b", "\x00", "\x7f", "\ud7ff", "\ue000", "\U0010ffff", "\uffff"])
EDGE_KEYS = st.lists(EDGE_CHARS, max_size=4).map("".join)


@given(EDGE_KEYS, EDGE_KEYS)
def test_prefix_end_bounds_exactly_the_keys_with_the_prefix(prefix: str, key: str) -> None:
    """A key starts with the prefix if and only if it sorts in [prefix, prefix_end(prefix))."""
    end = prefix_end(prefix)
    inside = prefix <= key and (end is None or key < end)
    assert inside == key.startswith(prefix)


def test_prefix_end_skips_the_surrogates_and_drops_maximal_code_points() -> None:
    assert prefix_end("a") == "b"
    assert prefix_end("\ud7ff") == "\ue000"  # surrogates are not valid UTF-8
    assert prefix_end("\ud7fe") == "\ud7ff"
    assert prefix_end("a\U0010ffff") == "b"
    assert prefix_end("\U0010ffff\U0010ffff") is None
    assert prefix_end("") is None


def test_argument_checks_name_the_argument_and_the_type() -> None:
    with pytest.raises(TypeError, match=r"^k must be a str, got int$"):
        check_key(1, "k")
    with pytest.raises(ValueError, match=r"^k must not be empty$"):
        check_key("", "k")
    with pytest.raises(TypeError, match=r"^p must be a str, got bytes$"):
        check_prefix(b"x", "p")
    assert check_prefix("", "p") == ""
    with pytest.raises(TypeError, match=r"^v must be bytes, got str; encode it first"):
        check_value("x", "v")
    with pytest.raises(TypeError, match=r"^v must be bytes, got int$"):
        check_value(1, "v")
    assert check_value(bytearray(b"ab")) == b"ab"
    assert type(check_value(memoryview(b"ab"))) is bytes
    with pytest.raises(TypeError, match=r"^n must be an int, got bool$"):
        check_int(True, "n", minimum=0)
    with pytest.raises(ValueError, match=r"^n must be >= 1, got 0$"):
        check_int(0, "n", minimum=1)
    assert check_int(1, "n", minimum=1) == 1
