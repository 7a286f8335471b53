"""What every command shares: turning CaovanError into one line and an exit code."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from ..errors import CaovanError


def run_cli(prog: str, main: Callable[[Sequence[str]], int], argv: Sequence[str] | None = None) -> int:
    """Run `main(argv)`; a CaovanError becomes `prog: error: message` on stderr and its exit code."""
    try:
        return main(list(sys.argv[1:] if argv is None else argv))
    except CaovanError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
