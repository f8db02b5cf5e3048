"""Unusual keys, shared by the conformance suite and the hypothesis strategies (no
dependency on either pytest or hypothesis)."""

from __future__ import annotations

__all__ = ["UNUSUAL_KEYS"]

#: Keys the protocol allows that a transport may mangle: line breaks (an HTTP router's ``.*``
#: stops at a newline), NUL and control characters, URL syntax (``?#%/``, dot segments, a
#: percent-escape spelled out), spaces, non-ASCII and astral characters.
UNUSUAL_KEYS: tuple[str, ...] = (
    "a\nb",
    "\n",
    "b\r\n",
    "nul\x00tab\t",
    " ?#&=+;",
    "%2F%0A%",
    "..",
    "./..//.",
    "\u2028\x85\x7f",
    "ü/κλειδί/🔑",
    "\U0010ffff",
)
