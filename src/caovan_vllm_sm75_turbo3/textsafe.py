"""Text from outside printed as data: one escaping function and one redaction function, used by every
printer (the banner and plan, the doctor, the log triage, warmup and bench, every error line).

`shown` makes any string one printable line: control characters (newlines, ANSI/OSC escapes),
bidirectional and other invisible format characters, and lone surrogates become visible escapes,
so outside text can neither fake a line of ours nor move the cursor or retitle the terminal, nor
crash the encoder. `redact` replaces secrets: Hugging Face tokens, `user:password@` in URLs,
bearer keys, the values of `--api-key`/`--hf-token` and of `*TOKEN*`/`*KEY*` variables.
A leaf module: the standard library only.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from typing import Any

HIDDEN = "***"
_MIN_SECRET = 4  # shorter "secrets" would blank out ordinary words
# Characters that are not shown as themselves: controls (C0, DEL, C1), formats (bidi overrides,
# zero-width joiners, ...), surrogates, unassigned, private use, line and paragraph separators.
_NOT_SHOWN = {"Cc", "Cf", "Cs", "Cn", "Co", "Zl", "Zp"}
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_SUSPECT = re.compile(r"[^\x20-\x7e]")   # only these need a look: plain ASCII is shown as it is

# scheme://user:password@ -> scheme://user:***@ (the password may itself hold '@': up to the last one)
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^/?#\s:@]*):[^/?#\s]*@")
_HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{8,}")
_BEARER = re.compile(r"(?i)(?P<head>\bbearer\s+)[A-Za-z0-9._~+/=-]{8,}")
SECRET_FLAGS = ("--api-key", "--hf-token")
# A flag's value is taken for a secret when it has a digit (prose after a flag name, "--api-key
# contains ...", has none); vLLM's "non-default args" dict ('api_key': ['...']) always is.
_SECRET_FLAG = re.compile(r"(?P<head>--(?:api-key|hf-token|token)(?:=|\s+|'\s+'|\"\s+\"))(?P<q>['\"]?)"
                          r"(?=[^\s'\"]*\d)[^\s'\"]+")
_SECRET_KEY = re.compile(r"(?P<head>['\"](?:api_key|hf_token|token)['\"]\s*:\s*\[?\s*['\"])[^'\"]+")
_SECRET_VAR = re.compile(r"(?P<head>\b[A-Z0-9_]*(?:TOKEN|API_KEY|SECRET|PASSWORD)[A-Z0-9_]*\s*[=:]\s*)"
                         r"(?P<q>['\"]?)[^\s'\",;]+")


def _escape_char(ch: str) -> str:
    if ch in _ESCAPES:
        return _ESCAPES[ch]
    if unicodedata.category(ch) not in _NOT_SHOWN:
        return ch
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def shown(text: object, limit: int | None = None) -> str:
    """`text` as one printable line (see the module doc); cut to `limit` characters with a note."""
    s = text if isinstance(text, str) else str(text)
    if limit is not None and len(s) > limit:
        s = s[:limit] + f"... ({len(s) - limit:,} more characters)"
    if not _SUSPECT.search(s):
        return s
    return "".join(_escape_char(ch) for ch in s)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with secrets replaced by `***`: URL passwords, HF tokens, bearer keys, the values of
    secret flags and variables, and each of `secrets` (4 characters or more)."""
    text = _URL_PASSWORD.sub(rf"\g<head>:{HIDDEN}@", text)
    text = _HF_TOKEN.sub(f"hf_{HIDDEN}", text)
    text = _BEARER.sub(rf"\g<head>{HIDDEN}", text)
    text = _SECRET_FLAG.sub(rf"\g<head>\g<q>{HIDDEN}", text)
    text = _SECRET_KEY.sub(rf"\g<head>{HIDDEN}", text)
    text = _SECRET_VAR.sub(rf"\g<head>\g<q>{HIDDEN}", text)
    for secret in secrets:
        if len(secret) >= _MIN_SECRET:
            text = text.replace(secret, HIDDEN)
    return text


def redact_argv(argv: Iterable[str]) -> list[str]:
    """An argument list with the values of SECRET_FLAGS (`--api-key K`, `--api-key=K`) hidden."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(HIDDEN)
            hide_next = False
            continue
        name, eq, _ = arg.partition("=")
        if name in SECRET_FLAGS:
            out.append(f"{name}={HIDDEN}" if eq else arg)
            hide_next = not eq
        else:
            out.append(arg)
    return out


def redact_tree(value: Any) -> Any:
    """A JSON-like value with every string in it redacted (for `--json` outputs of outside text)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_tree(v) for v in value]
    return value


def safe(text: object, limit: int | None = None, secrets: Iterable[str] = ()) -> str:
    """Redacted, then shown: what every printer applies to text that came from outside."""
    return shown(redact(text if isinstance(text, str) else str(text), secrets), limit)
