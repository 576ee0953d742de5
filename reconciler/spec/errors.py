"""The exception tree. Library exceptions are translated into these at the
edge that calls the library, so callers handle one family.

    ReconcilerError          a failure a person can act on; exit code 1
    ├── UsageError           the command line is wrong; exit code 2
    ├── StoreError           the Git repository cannot be read or written
    │   ├── RefMoved         compare-and-swap lost: re-read, never force
    │   └── HostKeyError     an SSH server's host key is not the pinned one
    ├── KeyFileError         a key file is missing, unreadable or too open
    └── AgentError           an agent answered something we cannot use

Every error carries ``hint``: what the person can do next. Problems found in
documents are values (``model.Problem``), not exceptions: one bad file must
never hide the others.
"""

from __future__ import annotations

import re

# ``scheme://user:secret@host``: the secret part of a URL's userinfo; over
# HTTP a lone user name may be the token itself (``https://TOKEN@host``).
_URL_SECRET = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/@\s:]*):[^/@\s]*@")
_HTTP_USER = re.compile(r"(?i)\b(https?://)[^/@\s]+@")


def redact_url(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced by ``***``
    (``https://user:TOKEN@host`` -> ``https://***@host``)."""
    if "@" not in text:  # both patterns need one; most log lines have none
        return text
    return _HTTP_USER.sub(r"\1***@", _URL_SECRET.sub(r"\1:***@", text))


class ReconcilerError(Exception):
    exit_code = 1

    def __init__(self, message: str, hint: str = "") -> None:
        # A --repo URL may carry a token, and library messages repeat it:
        # no error the daemon prints or logs may show it.
        message, hint = redact_url(message), redact_url(hint)
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class UsageError(ReconcilerError):
    exit_code = 2


class StoreError(ReconcilerError):
    pass


class RefMoved(StoreError):
    """The branch no longer points where the pass read it."""


class HostKeyError(StoreError):
    """An SSH server offered a host key that ``known_hosts`` does not vouch
    for; nothing was read from it or sent to it."""


class KeyFileError(ReconcilerError):
    pass


class AgentError(ReconcilerError):
    pass
