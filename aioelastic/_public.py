"""One helper for the public packages: their names show the public path, not a private module.

``Store.__module__`` was ``"aioelastic.store._base"``; reprs, tracebacks, ``help()`` and the
docs showed a path users must not import from. Each public package calls :func:`publish` on its
namespace, as httpx and trio do for theirs.
"""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = ["publish"]


def publish(namespace: dict[str, Any]) -> None:
    """Set ``__module__`` of every class and function in the package's ``__all__`` that lives in
    one of its private modules (``pkg._mod``) to the package's own name."""
    package: str = namespace["__name__"]
    for name in namespace["__all__"]:
        value = namespace[name]
        module = getattr(value, "__module__", None)
        if not isinstance(module, str) or not module.startswith(package + "._"):
            continue
        if isinstance(value, type) or callable(value):
            with contextlib.suppress(AttributeError, TypeError):  # a C type: nothing to fix
                value.__module__ = package
