"""The log messages we know, as data, in the order they are tried: how to spot each one, whether it is
harmless or fatal, what usually causes it on Turing (SM75) cards, and the exact fix.

The entries live by kind in known_start.py and known_engine.py; the type in signature.py.
"""

from __future__ import annotations

from .known_engine import ENGINE
from .known_start import START
from .signature import Signature

SIGNATURES: tuple[Signature, ...] = (*START, *ENGINE)

BY_ID: dict[str, Signature] = {s.id: s for s in SIGNATURES}


def markdown_table() -> str:
    """The table of known messages in docs/logtriage.md, generated from SIGNATURES so that the two cannot drift."""
    rows = ["| id | judged | spotted by | what it means |", "|---|---|---|---|"]
    for s in SIGNATURES:
        spots = s.shown or ", ".join(f"`{n}`" for n in s.needles)
        rows.append(f"| `{s.id}` | {s.rule.value} | {spots.replace('|', '&#124;')} | {s.title} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
