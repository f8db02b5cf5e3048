"""The house's room sizes: classes over 300 lines and functions over 60 (decorators included).

``python scripts/room_sizes.py [PATH ...]`` (default: ``aioelastic``) lists them with the largest
class and function found; generated code (``_pb/``) is skipped. ``tests/test_checks.py`` uses
:func:`oversized` to keep the rooms that were cut small.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

CLASS_MAX = 300
FUNCTION_MAX = 60


def sizes(path: Path) -> Iterator[tuple[str, str, int]]:
    """``(kind, qualified name, lines)`` of every class and function in ``path``."""
    stack: list[tuple[ast.AST, str]] = [(ast.parse(path.read_text()), "")]
    while stack:
        node, prefix = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                start = min([child.lineno] + [d.lineno for d in child.decorator_list])
                end = child.end_lineno or child.lineno
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                yield kind, name, end - start + 1
                stack.append((child, name + "."))


def _files(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        found += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return [f for f in found if "_pb" not in f.parts]


def oversized(paths: list[Path]) -> list[tuple[str, str, int]]:
    """``(kind, "file:name", lines)`` of the classes and functions over the limits."""
    limits = {"class": CLASS_MAX, "function": FUNCTION_MAX}
    return [
        (kind, f"{path}:{name}", n)
        for path in _files(paths)
        for kind, name, n in sizes(path)
        if n > limits[kind]
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, help="files or folders (aioelastic)")
    paths = parser.parse_args(argv).paths or [Path("aioelastic")]
    if missing := [str(p) for p in paths if not p.exists()]:
        parser.error(f"no such file or folder: {', '.join(missing)}")
    for kind, where, n in oversized(paths):
        print(f"{kind:9s}{n:5d}  {where}")
    for kind in ("class", "function"):
        found = [(n, f"{p}:{name}") for p in _files(paths) for k, name, n in sizes(p) if k == kind]
        if found:
            n, where = max(found)
            print(f"largest {kind}: {n} lines  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
