"""`--plot`: decode tok/s against context length, one line per concurrency, as a PNG.

matplotlib is an optional extra (`pip install 'caovan-vllm-sm75-turbo3[plot]'`): the wheel's own
dependencies stay light.
"""

from __future__ import annotations

from typing import Any

from ..errors import CaovanError, SettingError

EXTRA_HINT = "pip install 'caovan-vllm-sm75-turbo3[plot]' (or: pip install matplotlib)"


def require_matplotlib() -> None:
    """Refuse --plot before any request when matplotlib is missing (exit 2, one line)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SettingError(f"--plot needs matplotlib, which is not installed: {EXTRA_HINT}") from None


def write_plot(runs: list[dict[str, Any]], path: str, title: str) -> None:
    """Draw the runs' median decode tok/s per stream over prompt length, per concurrency, to `path`."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        for c in sorted({r["concurrency"] for r in runs}):
            points = sorted((r["prompt_tokens"], r["decode_tok_s"]) for r in runs
                            if r["concurrency"] == c and r["decode_tok_s"] is not None)
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                        label=f"{c} stream{'s' if c > 1 else ''} at once")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length (prompt tokens)")
        ax.set_ylabel("decode tok/s per stream")
        ax.set_title(title, fontsize=9)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=110)
    except OSError as err:
        raise CaovanError(f"cannot write --plot {path!r}: {err.strerror or err}", exit_code=1) from None
    finally:
        plt.close(fig)
