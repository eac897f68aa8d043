"""Store URLs as they may be shown: :func:`redact_url` hides the password a URL carries, and
:func:`scrub` hides it in a message that may echo it (a driver's error). Every URL or driver message
the stores put in a warning, an error or a log goes through one of them. Re-exported by
:mod:`stores`.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

__all__ = ["redact_url", "scrub"]

_SECRET_PARAMS = frozenset({"password", "sslpassword"})


def redact_url(url: str) -> str:
    """``url`` with the password in its userinfo and any ``password=`` query parameter replaced by
    ``***``; a URL without a password is returned unchanged."""
    if "://" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return url.split("://", 1)[0] + "://***"
    # Edit the string rather than urlunsplit it: unsplitting normalizes (sqlite:////abs would lose
    # two slashes), and a URL with nothing secret must come back unchanged.
    shown = url
    userinfo, at, hostinfo = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        redacted = f"{userinfo.split(':', 1)[0]}:***@{hostinfo}"
        shown = shown.replace(f"//{parts.netloc}", f"//{redacted}", 1)
    if parts.query:
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        if any(k.lower() in _SECRET_PARAMS for k, _ in pairs):
            query = urlencode([(k, "***" if k.lower() in _SECRET_PARAMS else v) for k, v in pairs], safe="*")
            shown = shown.replace(f"?{parts.query}", f"?{query}", 1)
    return shown


def _secrets_of(url: str) -> list[str]:
    """The password strings a URL carries, to scrub from driver messages."""
    if "://" not in url:
        return []
    try:
        parts = urlsplit(url)
        found = [parts.password] if parts.password else []
        found += [v for k, v in parse_qsl(parts.query) if k.lower() in _SECRET_PARAMS and v]
    except ValueError:
        return []
    return [unquote(s) for s in found] + found


def scrub(message: str, url: str) -> str:
    """``message`` with every password of ``url`` replaced by ``***`` (driver messages may echo
    their connection parameters)."""
    for secret in _secrets_of(url):
        message = message.replace(secret, "***")
    return message
