"""No reaching into aiohttp's internals outside ``store/http/_protocol.py``.

aiohttp's public API is the ``aiohttp`` and ``aiohttp.web`` namespaces. What has no public
equivalent (the read deadline, JSON answers to unparsable requests) lives in ``_protocol.py``,
and ``pyproject.toml`` pins aiohttp's minor version for it. Anywhere else in the package this
fails on: an import from another aiohttp module, a subclass of an aiohttp class, and an
attribute read or written by a private name that an aiohttp class defines.
"""

from __future__ import annotations

import ast
import collections
import importlib
import inspect
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "aioelastic"
#: the one module allowed to rely on aiohttp internals
ALLOWED = "store/http/_protocol.py"
PUBLIC_MODULES = {"aiohttp", "aiohttp.web"}
#: modules whose classes' private names are looked for (the classes the server and the clients
#: use, and what they derive from)
_SCANNED = (
    "aiohttp.client",
    "aiohttp.client_ws",
    "aiohttp.connector",
    "aiohttp.streams",
    "aiohttp.web_app",
    "aiohttp.web_protocol",
    "aiohttp.web_request",
    "aiohttp.web_response",
    "aiohttp.web_runner",
    "aiohttp.web_server",
    "aiohttp.web_ws",
)


def _aiohttp_private_names() -> set[str]:
    names: set[str] = set()
    for module in map(importlib.import_module, _SCANNED):
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, tuple):  # namedtuples: _replace, _asdict are their public API
                continue
            for klass in cls.__mro__:
                if not klass.__module__.startswith("aiohttp"):
                    continue
                slots = getattr(klass, "__slots__", ())
                for name in (*vars(klass), *((slots,) if isinstance(slots, str) else slots)):
                    if re.fullmatch(r"_[a-z]\w*", name):
                        names.add(name)
    # a namedtuple's own API (``_replace``, ``_asdict``): public, whatever class defines it
    return names - set(dir(collections.namedtuple("T", "a")))


PRIVATE = _aiohttp_private_names()


def _aiohttp_names(tree: ast.AST) -> set[str]:
    """Local names bound to aiohttp or anything imported from it."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "aiohttp":
                    bound.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aiohttp"):
            bound.update(alias.asname or alias.name for alias in node.names)
    return bound


def _root(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _on_self(node: ast.Attribute) -> bool:
    """``self._x``: an object's own attribute (a subclass of aiohttp's is found as such)."""
    return isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")


def internal_uses(source: str) -> list[str]:
    """The uses of aiohttp internals in ``source``, one line each."""
    tree = ast.parse(source)
    aiohttp_names = _aiohttp_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("aiohttp.") and alias.name not in PUBLIC_MODULES:
                    found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            module = node.module or ""
            if module.startswith("aiohttp.") and module not in PUBLIC_MODULES:
                found.append(f"{node.lineno}: from {module} import ...")
        elif isinstance(node, ast.ClassDef):
            for base in node.bases:
                if _root(base) in aiohttp_names:
                    found.append(f"{node.lineno}: class {node.name}({ast.unparse(base)})")
        elif isinstance(node, ast.Attribute) and node.attr in PRIVATE and not _on_self(node):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_detector_finds_each_kind_of_use() -> None:
    """The test below cannot pass for want of looking: each kind of use is found."""
    source = (
        "from aiohttp import web\n"
        "from aiohttp.web_protocol import RequestHandler\n"
        "import aiohttp.streams\n"
        "class Handler(web.RequestHandler):\n"
        "    pass\n"
        "async def f(runner: web.AppRunner, request: web.Request) -> None:\n"
        "    await runner._make_server()\n"
        "    request.protocol._request_count\n"
        "    runner.server.request_handler\n"  # public
    )
    assert sorted(int(line.split(":")[0]) for line in internal_uses(source)) == [2, 3, 4, 7, 8]
    assert {"_make_server", "_request_count", "_kwargs", "_messages"} <= PRIVATE


@pytest.mark.parametrize(
    "path",
    sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")),
)
def test_no_aiohttp_internals_outside_the_protocol_module(path: str) -> None:
    uses = internal_uses((PACKAGE / path).read_text())
    if path == ALLOWED:
        assert uses, f"{ALLOWED} uses no aiohttp internal: unpin aiohttp's upper bound"
    else:
        assert not uses, f"aiohttp internals in {path} (keep them in {ALLOWED}): {uses}"


def test_aiohttp_is_pinned_to_the_minor_version_protocol_py_was_written_for() -> None:
    """While ``_protocol.py`` relies on internals, a new aiohttp minor version is taken only
    after its tests ran on it."""
    pyproject = (PACKAGE.parent / "pyproject.toml").read_text()
    assert re.search(r'"aiohttp>=3\.14,<3\.15"', pyproject)
    import aiohttp

    assert aiohttp.__version__.startswith("3.14.")
