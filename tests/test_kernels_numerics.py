"""The one relative-error rule (kernels/numerics.py) that every kernel check uses."""

from __future__ import annotations

import math
import os

import pytest

pytestmark = pytest.mark.torch

torch = pytest.importorskip("torch")

from caovan_vllm_sm75_turbo3.kernels.numerics import rel_error  # noqa: E402


def _fresh(*shape: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def test_a_known_perturbation_gives_its_ratio():
    ref = _fresh(7, 33)
    delta = _fresh(7, 33)
    delta *= 1e-3 * ref.norm() / delta.norm()  # ‖delta‖ = 1e-3 ‖ref‖ exactly
    assert rel_error(ref + delta, ref) == pytest.approx(1e-3, rel=1e-9)
    assert rel_error(ref.clone(), ref) == 0.0


def test_fp16_output_is_compared_in_float64():
    ref = _fresh(64, 16)
    out = ref.half()
    expected = float((out.double() - ref).norm() / ref.norm())
    assert 0 < rel_error(out, ref) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_or_inf_anywhere_in_the_output_is_inf(bad):
    ref = _fresh(5, 9)
    out = ref.clone()
    out[3, 4] = bad
    err = rel_error(out.half(), ref)
    assert err == math.inf
    assert not err <= 1e-2


def test_a_zero_reference_gives_the_absolute_difference():
    ref = torch.zeros(4, 4, dtype=torch.float64)
    out = torch.zeros(4, 4)
    out[0, 0], out[1, 1] = 3.0, 4.0
    assert rel_error(out, ref) == pytest.approx(5.0)
    assert rel_error(torch.zeros(4, 4), ref) == 0.0
