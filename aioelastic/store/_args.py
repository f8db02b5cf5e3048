"""Argument checks of the store protocol, run once for every backend (and key-range arithmetic)."""

from __future__ import annotations

__all__ = ["check_int", "check_key", "check_prefix", "check_value", "prefix_end"]


def check_key(key: object, name: str = "key") -> str:
    if not isinstance(key, str):
        raise TypeError(f"{name} must be a str, got {type(key).__name__}")
    if not key:
        raise ValueError(f"{name} must not be empty")
    return key


def check_prefix(prefix: object, name: str = "prefix") -> str:
    if not isinstance(prefix, str):
        raise TypeError(f"{name} must be a str, got {type(prefix).__name__}")
    return prefix


def check_value(value: object, name: str = "value") -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    hint = "; encode it first (e.g. value.encode())" if isinstance(value, str) else ""
    raise TypeError(f"{name} must be bytes, got {type(value).__name__}{hint}")


def check_int(value: object, name: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def prefix_end(prefix: str) -> str | None:
    """The smallest key greater than every key that starts with ``prefix`` (None: no bound).

    Works on code points, which order like etcd's UTF-8 bytes.
    """
    chars = list(prefix)
    while chars:
        last = ord(chars[-1])
        if last < 0x10FFFF:
            nxt = last + 1
            if 0xD800 <= nxt <= 0xDFFF:  # surrogates are not valid in UTF-8; skip the block
                nxt = 0xE000
            chars[-1] = chr(nxt)
            return "".join(chars)
        chars.pop()
    return None
