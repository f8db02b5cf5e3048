"""Store credentials: read from files or the environment, kept out of argv, URLs and messages.

A secret on a command line is readable by every user of the machine (``ps``, /proc/PID/cmdline)
for the life of the process, and one in a URL travels wherever the URL does (logs, error text,
the workers' environment). So secrets come from files or environment variables, URLs are
redacted before they are shown, and the workers of an agent get the *path* of a file holding a
secret, never the secret (docs/agent.md, "Credentials").
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = [
    "ETCD_PASSWORD_ENV",
    "ETCD_PASSWORD_FILE_ENV",
    "SECRET_ENVS",
    "TOKEN_ENV",
    "TOKEN_FILE_ENV",
    "RedactingFilter",
    "read_secret_file",
    "redact_url",
    "split_password",
]

#: The bearer token of an ``aioelastic serve`` (http/https stores).
TOKEN_ENV = "AIOELASTIC_TOKEN"
#: A file holding that token (read when neither ``token`` nor ``$AIOELASTIC_TOKEN`` is given).
TOKEN_FILE_ENV = "AIOELASTIC_TOKEN_FILE"
#: The password of the etcd user named in an ``etcd://user@host`` URL (or ``username=``).
ETCD_PASSWORD_ENV = "AIOELASTIC_ETCD_PASSWORD"
#: A file holding that password.
ETCD_PASSWORD_FILE_ENV = "AIOELASTIC_ETCD_PASSWORD_FILE"
#: Variables that hold a secret itself: an agent never passes them on to its workers.
SECRET_ENVS = (TOKEN_ENV, ETCD_PASSWORD_ENV)

_REDACTED = "***"
#: What ends a URL's user info on the left (the user info lies between it and the ``@``).
_USERINFO_START = ("/", "@", " ", "\t", "\n", "'", '"')
_SECRET_QUERY_KEYS = frozenset({"password", "token"})


def read_secret_file(path: str | os.PathLike[str], what: str = "secret") -> str:
    """The secret in ``path``, surrounding whitespace removed; ``ValueError`` naming the file
    (never its content) if it cannot be read or is empty."""
    try:
        secret = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ValueError(f"{what} file {os.fspath(path)!r} cannot be read: {reason}") from None
    if not secret:
        raise ValueError(f"{what} file {os.fspath(path)!r} is empty")
    return secret


def redact_url(url: object) -> str:
    """``url`` with any password (``user:pw@``, also in a bare ``user:pw@host``) and secret query
    parameters (``password=``, ``token=``) replaced by ``***``, for messages, logs and events."""
    text = _redact_userinfo(str(url))
    if not any(f"{k}=" in text for k in _SECRET_QUERY_KEYS):
        return text
    try:
        parts = urlsplit(text)
    except ValueError:
        return _REDACTED
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    if not any(k in _SECRET_QUERY_KEYS for k, _ in pairs):
        return text
    query = urlencode(
        [(k, _REDACTED if k in _SECRET_QUERY_KEYS else v) for k, v in pairs], safe="*/"
    )
    return urlunsplit(parts._replace(query=query))


class RedactingFilter(logging.Filter):
    """A logging filter that redacts passwords in URLs of every record it sees (the command-line
    tools put it on their handlers)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_url(message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        return True


def _redact_userinfo(text: str) -> str:
    """``user:password@`` -> ``user:***@`` anywhere in ``text`` (the user may be empty). Linear
    in ``len(text)``: every event's string fields go through it."""
    if "@" not in text or ":" not in text:
        return text
    out: list[str] = []
    last = 0
    at = text.find("@")
    while at != -1:
        start = max([text.rfind(c, last, at) for c in _USERINFO_START] + [last - 1]) + 1
        colon = text.find(":", start, at)
        if colon != -1:
            out += (text[last : colon + 1], _REDACTED, "@")
            last = at + 1
        at = text.find("@", at + 1)
    out.append(text[last:])
    return "".join(out)


def split_password(url: str) -> tuple[str, str | None]:
    """``(url without its user-info password, the password or None)``; the user name stays."""
    from urllib.parse import unquote

    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    if not at or not colon:
        return url, None
    netloc = f"{user}@{hosts}" if user else hosts
    return urlunsplit(parts._replace(netloc=netloc)), unquote(password)
