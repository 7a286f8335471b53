"""Version numbers of vLLM, Triton, CUDA and drivers: the one home of every parsing and comparing rule.

A leaf module: imports only `packaging`, so any layer (kernels included) may use it. Every rule
ignores a local suffix ('+cu130', '+cpu', '+git...'): it names a build, not a release.
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


def major(version: str | None) -> int | None:
    """580 for a driver '580.95.05', 12 for CUDA '12.8'; None when absent or unreadable."""
    head = (version or "").split("+", 1)[0].split(".", 1)[0].strip()
    return int(head) if head.isdigit() else None


def release_key(version: str) -> tuple[int, ...]:
    """The numeric parts of a release ('0.27.0+cpu' -> (0, 27, 0)), for ordering table rows."""
    return tuple(int(p) for p in version.split("+", 1)[0].split(".") if p.isdigit())


def matches(version: str, listed: tuple[str, ...] | list[str]) -> bool:
    """Whether `version` is one of `listed`, each a full release ('3.6.0') or a minor ('3.6')."""
    base = version.split("+", 1)[0]
    return any(base == v or base.startswith(v + ".") for v in listed)


def in_range(version: str, releases: str) -> bool:
    """Whether '0.27.0' (or '0.27.0+cpu') is in '0.26.0-0.31.0', or equal to a single '0.27.0'."""
    low, _, high = releases.partition("-")
    return release_key(low) <= release_key(version) <= release_key(high or low)
