"""File operations of ``serve --data-dir`` that must survive a crash: atomic replacement, and
keeping damaged or torn bytes aside (next to the log) before anything is cut or rewritten."""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["cut_file", "fsync_dir", "keep_aside", "replace_file", "write_aside"]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def replace_file(path: Path, name: str, data: bytes) -> None:
    """Replace ``path/name`` with ``data`` atomically (temporary file, fsync, rename, fsync)."""
    tmp = path / (name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path / name)
    fsync_dir(path)


def _aside_name(path: Path, name: str, tag: str) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for n in range(1000):
        target = path / f"{name}.{tag}-{stamp}{f'.{n}' if n else ''}"
        if not target.exists():
            return target
    raise RuntimeError(f"too many {name}.{tag}-* files in {path}")


def write_aside(path: Path, name: str, tag: str, data: bytes) -> Path:
    """Save ``data`` as ``path/name.tag-<UTC time>`` (durably); its path."""
    target = _aside_name(path, name, tag)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(path)
    return target


def keep_aside(path: Path, name: str, tag: str) -> Path:
    """Keep ``path/name`` as ``path/name.tag-<UTC time>`` too (durably); its path.

    A hard link (no space needed; the file stays where it is until it is replaced), else a copy.
    """
    target = _aside_name(path, name, tag)
    try:
        os.link(path / name, target)
    except OSError:  # a file system without hard links
        write_aside(path, name, tag, (path / name).read_bytes())
    fsync_dir(path)
    return target


def cut_file(file: Path, size: int) -> None:
    """Cut ``file`` to ``size`` bytes, durably (keep what is cut aside first)."""
    with open(file, "r+b") as f:
        f.truncate(size)
        f.flush()
        os.fsync(f.fileno())
