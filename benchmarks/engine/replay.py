"""Replayed drafts: speculative decoding whose acceptance is known before each step (test only).

vLLM's MTP drafter runs as usual (its CUDA graphs, its metadata, async scheduling), then the
drafts it made are replaced, for requests whose plain-greedy tokens we know (a run of the same
engine without speculation), by those tokens with seeded wrong guesses: at each step the first
`a` drafts are the reference's next tokens and the one after is wrong, so an exact engine accepts
exactly `a`. `a` is drawn per step from 0..N (seeded by the prompt and the position), or fixed for
a decode sweep. Graph replays so meet acceptance that changes from step to step, which is what
garbled hybrid GDN models under FULL CUDA graphs in the field.

The hook also counts, for every step after a proposal, how many drafts the engine accepted (the
valid sampled tokens less one), with the real drafter's drafts too: tokens per step without
relying on vLLM's metrics.

Pure Python but for `install` (the unit tests run the logic on the CPU). Read from vLLM 0.21.0
and 0.24.0: `GPUModelRunner.propose_draft_token_ids(scheduler_output, sampled_token_ids, ...)`
returns the drafts ([num_reqs, N] on the GPU for MTP); `sampled_token_ids` holds -1 where a token
was rejected; `discard_request_mask.np` marks rows still in a chunked prefill; the runner's
`requests[req_id].prompt_token_ids` is the prompt.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Sequence


@dataclass
class Step:
    """One proposal for one request and, once the next step ran, what the engine accepted."""
    request: str
    position: int            # tokens generated before the drafts
    planned: int | None      # drafts an exact engine accepts (None: not replayed)
    accepted: int | None = None


@dataclass
class ReplayPlan:
    """Which drafts to propose. `accept` None: seeded 0..draft_tokens each step; an int: that many."""
    draft_tokens: int
    vocab: int
    seed: int = 0
    accept: int | None = None
    replay: bool = True      # False: the drafter's own drafts pass through (only counted)
    references: dict[tuple[int, ...], list[int]] = field(default_factory=dict)

    def add(self, prompt: Sequence[int], tokens: Sequence[int]) -> None:
        """Know the plain-greedy `tokens` that follow `prompt`."""
        self.references[tuple(prompt)] = list(tokens)

    def accepted_at(self, prompt_len: int, position: int) -> int:
        """Drafts to get right at `position` (tokens generated so far) of a prompt this long."""
        if self.accept is not None:
            return min(self.accept, self.draft_tokens)
        return random.Random(f"{self.seed}:{prompt_len}:{position}").randint(0, self.draft_tokens)

    def wrong(self, token: int, prompt_len: int, position: int) -> int:
        """A token other than `token`, seeded."""
        r = random.Random(f"wrong:{self.seed}:{prompt_len}:{position}").randrange(self.vocab - 1)
        return (token + 1 + r) % self.vocab

    def drafts(self, prompt: Sequence[int], generated: Sequence[int]) -> tuple[list[int], int] | None:
        """The drafts after `generated`, and how many an exact engine accepts; None where the
        prompt has no reference. A run that has left its reference gets wrong drafts only."""
        ref = self.references.get(tuple(prompt))
        if ref is None:
            return None
        g, n = len(generated), self.draft_tokens
        on_track = list(generated) == ref[:g]
        a = self.accepted_at(len(prompt), g) if on_track else 0
        true = ref[g:g + n] if on_track else []
        a = min(a, len(true))
        out = list(true[:a])
        for j in range(a, n):
            basis = true[j] if j < len(true) else (out[-1] if out else (generated[-1] if generated else 0))
            out.append(self.wrong(basis, len(prompt), g + j))
        return out, a


@dataclass
class Row:
    """What one row of the batch shows the hook after sampling."""
    request: str
    prompt: Sequence[int]
    sampled: Sequence[int]   # this step's sampled tokens, -1 where rejected
    discarded: bool          # still in a chunked prefill: its sampled token is not kept


@dataclass
class ReplayHook:
    """Tracks each request's tokens from the sampled rows and replaces drafts by the plan."""
    plan: ReplayPlan
    generated: dict[str, list[int]] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    _open: dict[str, Step] = field(default_factory=dict)

    def reset(self) -> None:
        """Forget what was counted (a new phase of the check)."""
        self.generated.clear()
        self.steps.clear()
        self._open.clear()

    def after_sampling(self, rows: Sequence[Row]) -> list[list[int] | None]:
        """The drafts to propose for each row: a list to use, or None to keep the drafter's."""
        out: list[list[int] | None] = []
        for row in rows:
            if row.discarded:
                out.append(None)
                continue
            new = [t for t in row.sampled if t >= 0]
            hist = self.generated.setdefault(row.request, [])
            pending = self._open.pop(row.request, None)
            if pending is not None and new:
                pending.accepted = len(new) - 1
            hist.extend(new)
            made = self.plan.drafts(row.prompt, hist) if self.plan.replay else None
            step = Step(row.request, len(hist), made[1] if made else None)
            self.steps.append(step)
            self._open[row.request] = step
            out.append(made[0] if made else None)
        return out

    def summary(self) -> dict[str, Any]:
        """Steps verified, tokens per step, and where acceptance was not as planned."""
        done = [s for s in self.steps if s.accepted is not None]
        accepted = sum(s.accepted for s in done)   # type: ignore[misc]
        planned = [s for s in done if s.planned is not None]
        off = [s for s in planned if s.accepted != s.planned]
        return {"verified_steps": len(done), "accepted_tokens": accepted,
                "tokens_per_step": (len(done) + accepted) / len(done) if done else None,
                "acceptance": accepted / (len(done) * self.plan.draft_tokens) if done else None,
                "accepted_histogram": [sum(1 for s in done if s.accepted == k)
                                       for k in range(self.plan.draft_tokens + 1)],
                "replayed_steps": len(planned),
                "not_as_planned": len(off),
                "first_not_as_planned": [vars(s) for s in off[:5]]}


def rows_of(runner: Any, sampled: Any) -> list[Row]:
    """The batch's rows as the hook reads them, from vLLM's GPU model runner."""
    values = sampled.tolist() if hasattr(sampled, "tolist") else [list(r) for r in sampled]
    discard = runner.discard_request_mask.np
    rows = []
    for i, req_id in enumerate(runner.input_batch.req_ids):
        state = runner.requests[req_id]
        rows.append(Row(req_id, state.prompt_token_ids or [], values[i] if i < len(values) else [],
                        bool(discard[i])))
    return rows


def install(hook: ReplayHook) -> None:
    """Wrap vLLM's GPUModelRunner.propose_draft_token_ids so that `hook` sees every step and its
    drafts replace the drafter's where it has some. Call before the engine starts, in its process."""
    import torch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner.propose_draft_token_ids

    def propose_draft_token_ids(self: Any, scheduler_output: Any, sampled_token_ids: Any, *rest: Any,
                                **kw: Any) -> Any:
        drafts = original(self, scheduler_output, sampled_token_ids, *rest, **kw)
        chosen = hook.after_sampling(rows_of(self, sampled_token_ids))
        if all(c is None for c in chosen):
            return drafts
        if isinstance(drafts, torch.Tensor):
            rows = drafts.tolist()
            for i, c in enumerate(chosen):
                if c is not None and i < len(rows):
                    rows[i] = c[:len(rows[i])]
            return torch.tensor(rows, dtype=drafts.dtype, device=drafts.device)
        return [c if c is not None else d for c, d in zip(chosen, drafts)]

    GPUModelRunner.propose_draft_token_ids = propose_draft_token_ids
