"""Log triage: read a vLLM server log and explain, in plain words, what failed and how to fix it.

`triage_path(path)` gives a `Triage`; `render.render_text(triage)` is its report in words. Nothing here imports
torch, triton or vllm.
"""

from .triage import Triage, triage_lines, triage_path

__all__ = ["Triage", "triage_lines", "triage_path"]
