"""How far a kernel's output is from its reference: the one relative-error rule every check uses.

torch is imported when a function is called, so importing this module stays cheap (the
benchmarks import it on machines where only the kernels' dependencies exist).
"""

from __future__ import annotations

import math
from typing import Any


def rel_error(out: Any, ref: Any) -> float:
    """‖out − ref‖ / ‖ref‖ of two tensors, in float64 on `ref`'s device.

    Any NaN or inf in `out` (an unwritten NaN-poisoned element, an overflow) gives `inf`, so a
    broken output never passes a `err <= budget` check (NaN would compare False there, but
    `max()` and ratios of NaNs are easy to get wrong). A zero reference gives the absolute norm
    of the difference instead of a division by zero.
    """
    import torch

    o = out.detach().to(device=ref.device, dtype=torch.float64)
    if not bool(torch.isfinite(o).all()):
        return math.inf
    r = ref.detach().to(torch.float64)
    diff = float(torch.linalg.vector_norm(o - r))
    scale = float(torch.linalg.vector_norm(r))
    return diff / scale if scale > 0 else diff
