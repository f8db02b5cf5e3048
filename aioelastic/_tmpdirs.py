"""Private temporary directories named with their owner's pid, and the cleanup of those whose
owner died without removing them (SIGKILL).

A directory is ``<prefix><pid>-<random>`` in the temporary directory. :func:`clean_stale_dirs`
removes the ones owned by this user whose pid no longer runs and that ``in_use`` (a check of the
directory's own: a socket that answers, a file lock held) does not claim: a pid alone could
mislead where several pid namespaces share the temporary directory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable

__all__ = ["clean_stale_dirs", "make_dir"]

log = logging.getLogger("aioelastic")


def make_dir(prefix: str) -> str:
    """A new private directory ``<prefix><this pid>-<random>``."""
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def clean_stale_dirs(
    prefix: str, in_use: Callable[[str], bool], directory: str | None = None
) -> list[str]:
    """Remove the ``prefix`` directories of dead owners in ``directory`` (default: the temp
    dir); returns their paths."""
    root = directory if directory is not None else tempfile.gettempdir()
    pattern = re.compile(re.escape(prefix) + r"(\d+)-[^/]+\Z")
    removed: list[str] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        match = pattern.match(entry.name)
        if match is None or int(match.group(1)) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
                continue
            if _pid_alive(int(match.group(1))) or in_use(entry.path):
                continue
            shutil.rmtree(entry.path)
            removed.append(entry.path)
    if removed:
        log.info("removed %d temporary directory(ies) of dead %s*", len(removed), prefix)
    return removed
