"""The engine check's Turing shim in every Python process it starts (tensor parallel workers).

engine_check.py patches its own process before vLLM starts (the capability reported as 7.5, Triton
building for sm_75). With --tensor-parallel-size > 1 vLLM starts worker processes, which those
patches do not reach: engine_check then puts this folder first on PYTHONPATH and names the shim in
ENGINE_CHECK_SHIM, and Python runs this file at each worker's start. Without ENGINE_CHECK_SHIM it
does nothing (test-only: never installed with our wheel).
"""

import os
import sys

if os.environ.get("ENGINE_CHECK_SHIM") in ("native", "sm75"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import engine_check

    engine_check.shim_this_process(os.environ["ENGINE_CHECK_SHIM"], os.environ.get("ENGINE_CHECK_CAPABILITY", "7.5"))
