"""Turbo's compile tests run in a child process of their own (tests/test_kernels_turbo_isolated.py).

Once a Triton kernel has run in the interpreter (TRITON_INTERPRET=1, as other test modules do),
Triton cannot compile in that process any more. So the modules that compile skip themselves
unless the isolating test started them with CAOVAN_TURBO_TEST_CHILD=1.
"""

import os

import pytest

CHILD_FLAG = "CAOVAN_TURBO_TEST_CHILD"

in_clean_child = pytest.mark.skipif(
    os.environ.get(CHILD_FLAG) != "1",
    reason="compiles with Triton: runs in a clean child process through tests/test_kernels_turbo_isolated.py")
