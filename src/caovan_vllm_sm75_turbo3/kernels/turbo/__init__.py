"""Turbo: Turing (sm_75) tensor cores for allowlisted Triton kernels.

Triton >= 3.4 lowers every fp16 `tl.dot` for sm_75 to fp32 FMA. Turbo lets Triton plan an
allowlisted kernel as sm_80 with one pipeline stage, rewrites the sm_80-only instructions of its
PTX to their sm_75 forms (`rewrite`), and assembles it with ptxas for sm_75, which rejects
anything the rewrite missed (`pipeline`). `hook` installs this into Triton's compile stages and
cache key; `compile` does the same offline for the check command and the tests.
"""
