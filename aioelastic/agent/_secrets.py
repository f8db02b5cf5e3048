"""The store credentials of an agent: where ``aioelastic run`` takes them, what workers get.

Secrets never come from the command line (``ps`` shows it to every user): the http token from
``--token-file`` or ``$AIOELASTIC_TOKEN``, the etcd password from ``--password-file`` or
``$AIOELASTIC_ETCD_PASSWORD`` (a password still given in an ``etcd://user:pw@`` endpoint is
accepted with a warning). The agent opens its store with them; its workers, which may need the
store too (:func:`~aioelastic.agent.worker.open_worker_store`), get the *path* of a file that
holds the secret (``AIOELASTIC_TOKEN_FILE``, ``AIOELASTIC_ETCD_PASSWORD_FILE``), never the secret:
not in their argv, not in ``AIOELASTIC_STORE_URL``, not in their environment (the two variables
that hold a secret are removed from it). A secret that came from the environment or a URL is
written to a private temporary file (mode 0600) for that, removed when the run ends.
``--no-worker-store-secrets`` gives the workers nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import MutableMapping
from dataclasses import dataclass, field

from .._secrets import (
    ETCD_PASSWORD_ENV,
    ETCD_PASSWORD_FILE_ENV,
    SECRET_ENVS,
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    read_secret_file,
    split_password,
)
from ..errors import StoreAuthError

__all__ = ["RunSecrets", "auth_failure", "worker_secret_env"]

log = logging.getLogger("aioelastic.agent")

#: rendezvous config key -> the workers' variable naming the file.
_FILE_ENVS = {"token_file": TOKEN_FILE_ENV, "password_file": ETCD_PASSWORD_FILE_ENV}


def auth_failure(exc: BaseException) -> StoreAuthError | None:
    """The :class:`~aioelastic.errors.StoreAuthError` behind ``exc`` (its causes), if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, StoreAuthError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def worker_secret_env(
    env: MutableMapping[str, str], config: dict[str, object], *, give_files: bool
) -> None:
    """Make ``env`` (a worker's, copied from the agent's) carry no secret: drop the variables that
    hold one; name the secret files of the rendezvous ``config`` when ``give_files``."""
    for name in SECRET_ENVS:
        env.pop(name, None)
    for key, name in _FILE_ENVS.items():
        path = config.get(key)
        if give_files and isinstance(path, str):
            env[name] = os.path.abspath(path)
        else:
            env.pop(name, None)


@dataclass
class RunSecrets:
    """The store secrets of one ``aioelastic run`` as files (``close()`` removes temporary ones).

    :meth:`resolve` takes the store URL the rendezvous will open and returns it without any
    password, with the rendezvous config keys (``token_file``/``password_file``) to add.
    """

    token_file: str | None = None
    password_file: str | None = None
    _temporary: list[str] = field(default_factory=list)

    def resolve(self, url: str) -> tuple[str, dict[str, str]]:
        scheme = url.partition("://")[0]
        if scheme in ("http", "https"):
            if self.password_file is not None:
                raise ValueError("--password-file is for etcd stores (http: --token-file)")
            path = self._file(self.token_file, TOKEN_ENV, TOKEN_FILE_ENV, "--token-file")
            return url, ({"token_file": path} if path else {})
        if scheme in ("etcd", "etcds"):
            if self.token_file is not None:
                raise ValueError("--token-file is for http(s) stores (etcd: --password-file)")
            url, in_url = split_password(url)
            if in_url is not None:
                log.warning(
                    "the etcd password in --rdzv-endpoint is visible to every user (ps); give "
                    "it with --password-file or $%s instead",
                    ETCD_PASSWORD_ENV,
                )
                if self.password_file is None:
                    return url, {"password_file": self._temporary_file(in_url)}
            path = self._file(
                self.password_file, ETCD_PASSWORD_ENV, ETCD_PASSWORD_FILE_ENV, "--password-file"
            )
            return url, ({"password_file": path} if path else {})
        if self.token_file is not None or self.password_file is not None:
            raise ValueError(f"--token-file/--password-file do not apply to {scheme}:// stores")
        return url, {}

    def _file(self, given: str | None, env: str, file_env: str, flag: str) -> str | None:
        if given is not None:
            read_secret_file(given, flag)  # fail now, clearly, rather than at the first join
            return os.path.abspath(given)
        secret = os.environ.get(env)
        if secret:
            return self._temporary_file(secret)
        return os.environ.get(file_env) or None

    def _temporary_file(self, secret: str) -> str:
        fd, path = tempfile.mkstemp(prefix="aioelastic-secret-")  # mode 0600
        self._temporary.append(path)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(secret)
        return path

    def close(self) -> None:
        for path in self._temporary:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self._temporary.clear()
