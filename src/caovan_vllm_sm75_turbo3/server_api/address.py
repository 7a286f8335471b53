"""Where a server is and how we authenticate to it: the address check and the API key's source and
check. Secrets are hidden by textsafe.redact, the one redaction function (re-exported here)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from urllib.parse import SplitResult, urlsplit

import httpx

from ..errors import SettingError
from ..textsafe import redact

# The server's own key variable first: OPENAI_API_KEY may belong to another service.
API_KEY_VARS = ("VLLM_API_KEY", "OPENAI_API_KEY")
_HEADER_SAFE_KEY = re.compile(r"[\x21-\x7e]+")


def check_api_key(key: str, source: str) -> None:
    """Refuse a key that cannot travel in an HTTP header; the message names `source`, never the key."""
    if not _HEADER_SAFE_KEY.fullmatch(key):
        raise SettingError(f"the API key from {source} contains characters not allowed in an HTTP header "
                           "(accepted: printable ASCII without spaces)")


def api_key_from(flag: str | None, env: Mapping[str, str]) -> tuple[str | None, str]:
    """The API key and where it came from (`flag --api-key`, `env VLLM_API_KEY`, or `none`), checked."""
    key, source = None, "none"
    if flag:
        key, source = flag, "flag --api-key"
    else:
        var = next((v for v in API_KEY_VARS if env.get(v)), None)
        if var:
            key, source = env[var], f"env {var}"
    if key is not None:
        check_api_key(key, source)
    return key, source


def normalize_api_base(url: str) -> str:
    """`http://host:port` from what users type (`.../v1`, a trailing slash); refuse anything not http(s),
    a bad port, an over-long host name, spaces or control characters. Messages never show a password."""
    url = url.strip()
    parts = split_api_base(url, lambda why: SettingError(f"--api-base {redact(url)!r} is not accepted: {why}"))
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return f"{parts.scheme}://{parts.netloc}{path}"


def split_api_base(url: str, refuse: Callable[[str], SettingError]) -> SplitResult:
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise refuse("it contains a space or a control character")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as err:  # "Port out of range", "Port could not be cast", "Invalid IPv6 URL"
        raise refuse("the port must be a whole number from 1 to 65535" if "port" in str(err).lower()
                     else f"{err}; use http://HOST:PORT") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise refuse("use http://HOST:PORT, for example http://127.0.0.1:8000.")
    if port == 0 or (port is None and parts.netloc.endswith(":")):  # `host:` with nothing after the colon
        raise refuse("the port must be a whole number from 1 to 65535")
    host = parts.hostname
    if len(host) > 253:
        raise refuse("the host name is longer than 253 characters")
    if ":" not in host and any(len(label) > 63 for label in host.split(".")):
        raise refuse("a label of the host name is longer than 63 characters")
    if ":" not in host:
        try:   # what the resolver will do with it: an empty label ("a..b") fails there, not here
            host.rstrip(".").encode("idna")
        except UnicodeError as err:
            raise refuse(f"the host name is not a valid name ({err})") from None
    try:
        httpx.URL(url)
    except (httpx.InvalidURL, UnicodeError) as err:
        raise refuse(redact(str(err))) from None
    return parts


def is_loopback(api_base: str) -> bool:
    """True for localhost / 127.0.0.0/8 / ::1."""
    host = urlsplit(api_base).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
