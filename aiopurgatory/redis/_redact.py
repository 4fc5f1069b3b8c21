"""Keeping passwords out of every text the library produces.

A Redis URL may carry a password (``redis://:secret@host``,
``redis://user:secret@host``), and so may the keyword arguments of a client
passed in. redis-py's own exceptions name hosts and ports and normally no
password, but a URL can end up in a message (a parse error, a wrapped OSError),
so every text that leaves the library (a log field, a repr, an exception
message, ``statistics().last_error``) goes through :meth:`Redactor.redact`
first, which removes the known password in its plain and percent-encoded forms
and the password part of anything that looks like a URL.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, quote_plus, unquote, urlsplit

__all__ = ["MASK", "Redactor", "describe_client", "describe_url", "url_password"]

MASK = "***"

# scheme://user:password@  or  scheme://:password@  (the password part up to the
# last @ before the host: passwords may contain ':' and, percent-encoded or not, '@').
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*:)[^\s/]*(?=@)")


class Redactor:
    """Removes the given secrets (and any URL's password) from texts."""

    __slots__ = ("_secrets",)

    def __init__(self, *secrets: str | bytes | None) -> None:
        forms: set[str] = set()
        for secret in secrets:
            if secret is None:
                continue
            text = secret.decode("utf-8", "replace") if isinstance(secret, bytes) else secret
            if not text:
                continue
            forms.update({text, quote(text, safe=""), quote_plus(text), unquote(text)})
        # Longest first, so that a form containing another is removed whole.
        self._secrets = sorted((form for form in forms if form), key=len, reverse=True)

    def redact(self, text: str) -> str:
        """``text`` without any known secret nor any URL's password."""
        text = _URL_PASSWORD.sub(lambda match: match["head"] + MASK, text)
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text

    def error(self, exc: BaseException) -> str:
        """``"<ExceptionType>: <message>"`` for ``exc``, redacted."""
        message = str(exc)
        name = type(exc).__name__
        return self.redact(f"{name}: {message}" if message else name)


def describe_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``, for reprs and logs."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<unparsable Redis URL>"
    if password is None:
        return url
    netloc = parts.netloc
    userinfo, _, hostport = netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return parts._replace(netloc=f"{user}:{MASK}@{hostport}").geturl()


def url_password(url: str) -> str | None:
    """The password in ``url`` (percent-decoded), or None: for a :class:`Redactor`."""
    try:
        password = urlsplit(url).password
    except ValueError:
        return None
    return None if password is None else unquote(password)


def describe_client(kwargs: Mapping[str, Any]) -> str:
    """A URL-like description of a client's connection keyword arguments, no password."""
    if "path" in kwargs:
        where = f"unix://{kwargs['path']}"
    else:
        where = f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
    user = kwargs.get("username") or ""
    auth = f"{user}:{MASK}@" if kwargs.get("password") else (f"{user}@" if user else "")
    return f"redis://{auth}{where}/{kwargs.get('db', 0)}"
