"""The warmup ladder and prompt fitting: pure logic, no server."""

import random

import pytest

from caovan_vllm_sm75_turbo3.errors import SettingError
from caovan_vllm_sm75_turbo3.warmup.ladder import (CONTEXT_MARGIN, LadderConfig, build_ladder, check_timeout_patterns,
                                                   concurrency_levels, parse_timeout, prefill_lengths, timeout_for,
                                                   warm_pass)
from caovan_vllm_sm75_turbo3.server_api.prompts import MAX_FIT_ROUNDS, chat_messages, filler, fit_prompt

from helpers.fake_vllm_server import render_chat, tokenize


@pytest.mark.parametrize("budget", [512, 2048, 3000, 8192, 16384])
def test_prefill_lengths_go_up_to_and_past_the_batch_budget(budget):
    lengths = prefill_lengths(LadderConfig(max_num_batched_tokens=budget))
    assert lengths == sorted(set(lengths)) and lengths[0] == 128
    assert budget in lengths
    assert max(lengths) > budget  # chunked prefill: one prompt longer than a scheduler step
    below = [n for n in lengths if n < budget]
    assert below == [128 * 2 ** i for i in range(len(below))]  # every power-of-two bucket below it


def test_prefill_lengths_are_capped_by_the_context():
    cfg = LadderConfig(max_num_batched_tokens=8192, max_model_len=3000)
    lengths = prefill_lengths(cfg)
    assert max(lengths) <= 3000 - CONTEXT_MARGIN
    for step in build_ladder(cfg):
        if step.prompt_tokens is not None:
            assert step.prompt_tokens + step.max_tokens <= 3000, step
        assert step.max_tokens < 3000


@pytest.mark.parametrize("seqs,expected", [(1, [1]), (2, [1, 2]), (6, [1, 2, 4, 6]), (8, [1, 2, 4, 8])])
def test_concurrency_levels(seqs, expected):
    assert concurrency_levels(seqs) == expected


def test_ladder_order_names_and_warm_pass():
    cfg = LadderConfig(max_num_batched_tokens=1024, max_num_seqs=4, decode_tokens=300)
    steps = build_ladder(cfg)
    names = [s.name for s in steps]
    assert len(names) == len(set(names))
    assert names[:2] == ["chat-tiny", "completion-tiny"]
    assert names.index("prefill-1536") < names.index("decode-300") < names.index("stream")
    assert names.index("prefix-cache") < names.index("concurrency-1")
    assert [s.concurrency for s in steps if s.kind == "concurrency"] == [1, 2, 4]
    assert {s.name for s in steps if s.optional} == {"tool-call", "reasoning"}
    warm = warm_pass(steps)
    assert warm and all(s.quick for s in warm)
    assert {"chat-tiny", "decode-300", "stream"} <= {s.name for s in warm}
    assert all((s.prompt_tokens or 0) <= 128 and s.concurrency == 1 for s in warm)


def test_timeouts_default_pattern_and_last_match_wins():
    cfg = LadderConfig(max_num_batched_tokens=512, step_timeout_s=77,
                       timeouts=(("prefill-*", 5.0), ("prefill-768", 9.0)))
    by_name = {s.name: s.timeout_s for s in build_ladder(cfg)}
    assert by_name["chat-tiny"] == 77 and by_name["prefill-128"] == 5.0 and by_name["prefill-768"] == 9.0
    assert timeout_for("stream", cfg) == 77


@pytest.mark.parametrize("spec", ["chat-tiny", "chat-tiny=0", "=5", "chat-tiny=soon", "x=-1"])
def test_bad_timeout_specs_are_refused(spec):
    with pytest.raises(SettingError) as err:
        parse_timeout(spec)
    assert "--timeout" in str(err.value) and "STEP=SECONDS" in str(err.value)


def test_timeout_pattern_that_names_no_step_is_refused():
    assert parse_timeout(" prefill-* = 12.5 ") == ("prefill-*", 12.5)
    check_timeout_patterns(LadderConfig(timeouts=(("prefill-*", 12.5),)))
    with pytest.raises(SettingError) as err:
        check_timeout_patterns(LadderConfig(timeouts=(("prefil-*", 3.0),)))
    assert "'prefil-*' matches no step" in str(err.value) and "chat-tiny" in str(err.value)


def _toy_count(calls):
    def count(text):
        calls.append(text)
        return len(tokenize(render_chat(chat_messages(text), None)))
    return count


def test_fit_prompt_hits_random_targets_exactly_with_few_tokenize_calls():
    rng = random.Random()
    for _ in range(25):
        target = rng.randint(40, 20000)
        calls = []
        fitted = fit_prompt(f"n{rng.randrange(10**6)}", target, _toy_count(calls))
        assert fitted.exact
        assert fitted.tokens == target == len(tokenize(render_chat(chat_messages(fitted.text), None)))
        assert len(calls) <= MAX_FIT_ROUNDS + 2


def test_fit_prompt_without_tokenize_is_an_estimate():
    fitted = fit_prompt("abc", 1000, None)
    assert not fitted.exact and fitted.tokens == 1000
    assert fitted.text.startswith("[abc]")


def test_prompts_of_different_steps_do_not_share_a_cached_prefix():
    # With prefix caching, a shared beginning would skip the prefill the step is meant to compile.
    a = tokenize(render_chat(chat_messages(filler("1234abcd-prefill-512", 300)), None))
    b = tokenize(render_chat(chat_messages(filler("1234abcd-prefill-1024", 600)), None))
    first_diff = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert first_diff < 16  # inside the first prefix-cache block
