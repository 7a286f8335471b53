"""The environment key: which software stack and GPU architectures a JIT cache was built for.

Compiled kernels are only valid for the exact stack that produced them, so every distinct
(plugin, Python, torch, torch CUDA, Triton, vLLM, FlashInfer, GPU arch) combination gets its
own cache directory, named by this key. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from .. import __version__
from ..runtime.facts import Facts

# Order of the components in the readable part of the name, with their short prefixes.
_READABLE = (("plugin", "p"), ("python", "py"), ("torch", "torch"), ("torch_cuda", "cu"),
             ("triton", "triton"), ("vllm", "vllm"), ("flashinfer", "fi"), ("arch", ""))
_UNSAFE = re.compile(r"[^A-Za-z0-9._+]")
_PART_MAX = 24  # per component in the readable part; the digest keeps truncated names distinct
DIGEST_LEN = 10
# Exactly the names env_key() produces: the cleaner removes only directories named like this, so a
# cache root pointed at a folder of other things (a conda "envs/", say) never loses anything.
NAME_RE = re.compile("^" + "-".join(re.escape(prefix) + r"[A-Za-z0-9._+]{1,%d}" % _PART_MAX
                                    for _, prefix in _READABLE) + r"-[0-9a-f]{%d}$" % DIGEST_LEN)


@dataclass(frozen=True)
class EnvKey:
    """One environment's key. `name` is the directory name under the cache root's `envs/`."""

    components: dict[str, str]
    readable: str
    digest: str

    @property
    def name(self) -> str:
        """`readable-digest`: filesystem-safe characters only, at most 232 characters (NAME_MAX is 255)."""
        return f"{self.readable}-{self.digest}"


def _arch(facts: Facts) -> str:
    """'sm75', 'sm75+sm86' (sorted, distinct), 'nogpu'; a GPU whose capability is unknown is 'smunknown'."""
    if not facts.gpus:
        return "nogpu"
    sms = {g.sm for g in facts.gpus}
    parts = [f"sm{s}" for s in sorted(s for s in sms if s is not None)]
    if None in sms:
        parts.append("smunknown")
    return "+".join(parts)


def _safe_part(value: str) -> str:
    return _UNSAFE.sub("_", value)[:_PART_MAX] or "none"


def components_of(facts: Facts) -> dict[str, str]:
    """The key's components from runtime facts; a missing version is "none".

    The plugin version falls back to this running plugin when the facts do not name one
    (a hand-written facts file), because this plugin is what fills the cache.
    """
    v = facts.versions
    raw = {"plugin": v.plugin or __version__, "python": v.python, "torch": v.torch,
           "torch_cuda": v.torch_cuda, "triton": v.triton, "vllm": v.vllm,
           "flashinfer": v.flashinfer, "arch": _arch(facts)}
    return {k: (str(val) if val not in (None, "") else "none") for k, val in raw.items()}


def key_from_components(components: dict[str, str]) -> EnvKey:
    """Build the key from its components (the digest covers the exact, untruncated values)."""
    comps = dict(sorted(components.items()))
    digest = hashlib.sha256(json.dumps(comps, sort_keys=True).encode()).hexdigest()[:DIGEST_LEN]
    readable = "-".join(prefix + _safe_part(comps.get(name, "none")) for name, prefix in _READABLE)
    return EnvKey(components=comps, readable=readable, digest=digest)


def env_key(facts: Facts) -> EnvKey:
    """The environment key for `facts`: changes when any component changes, and only then."""
    return key_from_components(components_of(facts))
