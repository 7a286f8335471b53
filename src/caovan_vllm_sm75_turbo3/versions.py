"""Release numbers (major.minor) of vLLM, Triton and our tables: the one parsing rule every layer uses.

A leaf module: imports only `packaging`, so any layer may use it.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version


def parse(version: str | None) -> Version | None:
    """A version, or None when absent or unparseable (local suffixes such as '+cu130' kept)."""
    if not version:
        return None
    try:
        return Version(version)
    except InvalidVersion:
        return None


def minor_key(version: str) -> tuple[int, int]:
    """(major, minor) of '0.21', '0.21.0', '0.21.0rc1' or '0.21.0+cu130' (all give (0, 21)).

    Raises ValueError when `version` is not a version with at least a major and a minor part.
    """
    v = parse(version)
    if v is None or len(v.release) < 2:
        raise ValueError(f"{version!r} is not a release like '0.21' or '0.21.0'")
    return v.release[0], v.release[1]


def minor(version: str | None) -> str | None:
    """'0.21' for '0.21.0+cu130' (or '0.21', '0.21.0rc1'); None when absent or unparseable."""
    try:
        return "{}.{}".format(*minor_key(version or ""))
    except ValueError:
        return None
