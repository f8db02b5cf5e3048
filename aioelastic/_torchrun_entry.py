"""The ``torchrun.handlers`` entry point, importable without torch and before it.

torch's rendezvous registry loads every entry point of the group when
``torch.distributed.elastic.rendezvous`` is first imported, and calls it at once. If that import
is the one :mod:`aioelastic.torchrun` makes, the module is still half-initialised; so the entry
point lives here, and the creator it returns imports :mod:`aioelastic.torchrun` only when torch
asks for a handler. The import order of torch and aioelastic then does not matter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["handler_creator"]


def _create(params: Any) -> Any:
    from .torchrun import create_torch_handler

    return create_torch_handler(params)


def handler_creator() -> Callable[[Any], Any]:
    """The ``torchrun.handlers`` entry point: returns the handler creator."""
    return _create
