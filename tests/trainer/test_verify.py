"""The trainer-side step-0 verifier on a small randomly initialised causal LM (no weights to fetch).

What must hold whatever the weights: chunked scoring equals one plain forward pass (at any
temperature); records whose logprobs are the model's own -- raw at temperature 1, processed at 0.7 --
verify; records whose logprobs are not (perturbed, another temperature's, the reference engine's
scripted ones) fail with the limits they break; records whose sampling the trainer cannot reproduce
(raw logprobs at 0.7, truncated sampling) are refused by name and never scored; constrained calls
are reported apart; the re-render contrast finds the misaligned tokens.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from openenv_harness.trainer.sampling import TRAINING_POLICY, RecordedSampling  # noqa: E402
from openenv_harness.trainer.verify import DeltaStats, score_chained, score_tokens, verify_records  # noqa: E402


@pytest.fixture(scope="module")
def model():
    config = transformers.Qwen2Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(0)
    m = transformers.Qwen2ForCausalLM(config).eval()
    return m


def _plain(model, prompt: list[int], completion: list[int], temperature: float = 1.0) -> list[float]:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logps = torch.log_softmax(model(input_ids=ids).logits[0].float() / temperature, dim=-1)
    return [logps[len(prompt) - 1 + i, tok].item() for i, tok in enumerate(completion)]


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_scoring_equals_one_forward_pass(model, chunk: int, temperature: float) -> None:
    prompt, completion = [5, 9, 11, 2, 40, 41, 42, 7, 8, 3], [13, 17, 19, 23, 29]
    scored = score_tokens(model, prompt, completion, chunk_tokens=chunk, temperature=temperature)
    assert scored == pytest.approx(_plain(model, prompt, completion, temperature), abs=1e-5)


def test_chained_scoring_equals_scoring_each_call_on_its_own_context(model) -> None:
    """Three calls of one exact chain, then a call that breaks it, then one at another temperature:
    every call's scores are those of its own forward pass."""
    first = ([5, 9, 11, 2], [13, 17], 1.0)
    second = ([5, 9, 11, 2, 13, 17, 40, 41], [19, 23, 29], 1.0)  # extends the first's context
    third = ([*second[0], *second[1], 7, 8], [31], 1.0)
    broken = ([5, 9, 12, 2, 13], [3, 4], 1.0)  # not an extension of the third
    warm = ([*broken[0], *broken[1], 6], [14, 15], 0.7)  # extends it, at another temperature
    calls = [first, second, third, broken, warm]
    chained = score_chained(model, calls, chunk_tokens=3)
    for (prompt, sampled, temperature), scores in zip(calls, chained):
        assert scores == pytest.approx(_plain(model, prompt, sampled, temperature), abs=1e-5)
    assert score_chained(model, []) == []


def test_a_temperature_that_divides_nothing_is_refused(model) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        score_tokens(model, [1, 2], [3], temperature=0.0)


def _record(call: int, prompt: list[int], completion: list[int], logps: list[float], *, policy: bool = True,
            mode: str = "raw_logprobs", **sampling: Any) -> dict:
    """A record as the recorder writes it, sampled under the training policy unless ``sampling`` says otherwise."""
    provenance = {"sampling_effective": {**TRAINING_POLICY, **sampling}, "sampling_unknown": [], "logprobs_mode": mode}
    return {"prompt_token_ids": prompt, "completion_token_ids": completion, "per_token_logps": logps,
            "request": {"messages": []}, "response": {},
            "metadata": {"session_id": "s", "node_id": f"s/{call}", "call_index": call, "call_kind": "agent",
                         "status": "ok", "logprobs_are_policy": policy, "provenance": provenance}}


def _session(model, temperature: float = 1.0, calls: int = 4, length: int = 12) -> list[tuple[list[int], list[int], list[float]]]:
    """``calls`` (prompt, sampled ids, the model's logprobs of them at ``temperature``), ids drawn from the model."""
    rng = random.Random(1)
    out = []
    for _ in range(calls):
        prompt = [rng.randrange(1, 97) for _ in range(6)]
        completion = [rng.randrange(1, 97) for _ in range(length)]
        out.append((prompt, completion, _plain(model, prompt, completion, temperature)))
    return out


def test_the_models_own_logprobs_verify_at_ratio_one_and_a_shift_shows(model) -> None:
    prompt, completion = [1, 2, 3, 4], [5, 6, 7]
    own = _plain(model, prompt, completion)
    shifted = [lp - 0.5 for lp in own]
    report = verify_records([_record(0, prompt, completion, own), _record(1, prompt, completion, shifted, policy=False)],
                            model, threshold=0.1)
    exact, constrained = report.calls
    assert exact.stats.delta_max < 1e-5 and exact.stats.share_within == 1.0 and not exact.outliers
    assert abs(exact.stats.ratio_min - 1) < 1e-5 and abs(exact.stats.ratio_max - 1) < 1e-5
    assert constrained.constrained and len(constrained.outliers) == 3
    assert constrained.stats.ratio_min == pytest.approx(math.exp(0.5), rel=1e-4)
    # the proof is over policy calls only; the constrained one is reported apart (and would fail the limits)
    assert report.policy.tokens == 3 and report.policy.delta_max < 1e-5
    assert report.constrained.tokens == 3 and report.constrained.mean_log_ratio == pytest.approx(0.5, abs=1e-4)
    assert report.verdict.verified and report.verdict.status == "verified"


def test_raw_logprobs_at_temperature_one_verify(model) -> None:
    records = [_record(i, p, c, lp) for i, (p, c, lp) in enumerate(_session(model))]
    report = verify_records(records, model)
    verdict = report.verdict
    assert verdict.status == "verified" and verdict.failures == [] and not report.refused
    assert report.policy.tokens == 48 and report.policy.delta_max < 1e-4
    assert report.policy.kl_k3 is not None and 0 <= report.policy.kl_k3 < 1e-8
    assert verdict.line.startswith("verified: 48 policy token(s) within the limits")


def test_processed_logprobs_at_0_7_verify_when_scored_at_0_7_and_only_then(model) -> None:
    session = _session(model, temperature=0.7)
    report = verify_records([_record(i, p, c, lp, mode="processed_logprobs", temperature=0.7)
                             for i, (p, c, lp) in enumerate(session)], model)
    assert report.verdict.verified and report.policy.delta_max < 1e-4
    assert all(call.temperature_divisor == pytest.approx(0.7) for call in report.calls)
    # the same logprobs claimed as temperature 1: the trainer's T = 1 distribution is not the one recorded
    wrong = verify_records([_record(i, p, c, lp) for i, (p, c, lp) in enumerate(session)], model)
    assert wrong.verdict.status == "failed" and wrong.verdict.failures


def test_perturbed_logprobs_fail_with_the_limits_they_break(model) -> None:
    rng = random.Random(2)
    records = [_record(i, p, c, [lp + rng.gauss(0, 0.3) for lp in lps]) for i, (p, c, lps) in enumerate(_session(model))]
    report = verify_records(records, model)
    verdict = report.verdict
    assert verdict.status == "failed" and not verdict.verified
    broken = {f.limit for f in verdict.failures}
    assert {"delta_mean", "share_within"} <= broken
    mean = next(f for f in verdict.failures if f.limit == "delta_mean")
    assert mean.value == pytest.approx(report.policy.delta_mean) and mean.bound == report.limits.delta_mean
    assert verdict.line.startswith("step-0 check failed over 48 policy token(s): mean |δ| ")
    assert f"> {report.limits.delta_mean:g}" in verdict.line and "\n" not in verdict.line
    # one bad token among many correct ones still breaks the per-token limit
    clean = [_record(i, p, c, list(lps)) for i, (p, c, lps) in enumerate(_session(model))]
    clean[2]["per_token_logps"][5] -= 2.0
    one_off = verify_records(clean, model).verdict
    assert one_off.status == "failed" and {f.limit for f in one_off.failures} >= {"delta_max"}


def test_raw_logprobs_at_0_7_are_refused_with_the_reason_and_never_scored(model) -> None:
    session = _session(model, temperature=0.7)
    records = [_record(i, p, c, lp, temperature=0.7) for i, (p, c, lp) in enumerate(session)]
    report = verify_records(records, model)
    verdict = report.verdict
    assert verdict.status == "cannot verify" and report.calls == [] and report.policy.tokens == 0
    assert [r.node_id for r in report.refused] == ["s/0", "s/1", "s/2", "s/3"]
    assert verdict.line.startswith("cannot verify: 4 record(s) cannot be scored as they were sampled -- s/0: ")
    assert "raw (before temperature): at temperature 0.7" in verdict.line


def test_truncated_sampling_is_refused_even_when_the_other_calls_verify(model) -> None:
    session = _session(model)
    records = [_record(i, p, c, lp) for i, (p, c, lp) in enumerate(session)]
    records[1]["metadata"]["provenance"]["sampling_effective"]["top_p"] = 0.8
    report = verify_records(records, model)
    assert report.verdict.status == "cannot verify"
    assert [c.call_index for c in report.calls] == [0, 2, 3]  # the others were scored, and are at ratio 1
    assert report.policy.delta_max < 1e-4
    [refused] = report.refused
    assert refused.node_id == "s/1" and "truncated sampling (top_p=0.8)" in refused.reasons[0]


def test_a_record_whose_logprobs_do_not_match_its_ids_is_refused_not_scored(model) -> None:
    session = _session(model, calls=2)
    records = [_record(i, p, c, lp) for i, (p, c, lp) in enumerate(session)]
    records[1]["per_token_logps"] = records[1]["per_token_logps"][:-1]
    report = verify_records(records, model)
    assert report.verdict.status == "cannot verify" and [c.call_index for c in report.calls] == [0]
    assert report.refused[0].reasons == ["11 logprobs for 12 sampled ids"]


def test_a_refused_constrained_call_does_not_block_the_proof_and_no_policy_token_verifies_nothing(model) -> None:
    session = _session(model, calls=2)
    policy = _record(0, *session[0])
    constrained = _record(1, *session[1], policy=False, temperature=0.7)
    report = verify_records([policy, constrained], model)
    assert report.verdict.verified and [r.node_id for r in report.refused] == ["s/1"]
    alone = verify_records([_record(1, *session[1], policy=False)], model)
    assert alone.verdict.status == "nothing verified" and not alone.verdict.verified
    assert "12 constrained token(s)" in alone.verdict.line


def test_the_reference_engines_scripted_logprobs_fail(make_stack, hf_tokenizer) -> None:
    """Real records from the reference engine through the recorder (its logprobs are scripted, not any
    model's) scored by a real transformers model: the verdict fails on the limits."""
    import httpx

    tok = hf_tokenizer()
    config = transformers.Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    torch.manual_seed(0)
    scorer = transformers.Qwen2ForCausalLM(config).eval()
    from openenv_harness.testing.engine import Script, Turn

    stack = make_stack()
    session = stack.admin.create_session()
    stack.engine.set_script(session["session_id"], Script(turns=[Turn(content="def add(a, b):\n    return a + b")]))
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    reply = httpx.post(f"{session['base_url']}/chat/completions", headers={"authorization": f"Bearer {session['secret']}"},
                       json={"model": "m", "messages": [{"role": "user", "content": "fix add"}], "tools": tools},
                       timeout=60)
    assert reply.status_code == 200, reply.text
    records = stack.admin.records(session["session_id"])
    assert [r["metadata"]["call_kind"] for r in records] == ["agent"]
    assert RecordedSampling.of(records[0]).problems() == []  # reproducible: the failure is the logprobs' own
    report = verify_records(records, scorer, tok)
    verdict = report.verdict
    assert verdict.status == "failed" and report.policy.tokens == len(records[0]["completion_token_ids"]) > 0
    assert "delta_mean" in {f.limit for f in verdict.failures}


def test_delta_stats_of_nothing_is_empty() -> None:
    assert DeltaStats.of([], [], 0.05).tokens == 0


def test_the_rerender_contrast_finds_tokens_that_were_not_sampled(hf_tokenizer) -> None:
    """A turn sampled in a non-canonical segmentation: re-rendering the messages re-tokenizes it, so
    the message-level path scores other tokens than the sampled ones; the records' own path does not."""
    from openenv_harness.testing.engine import reference_tokenizer
    from openenv_harness.trainer.verify import contrast_rerender

    tok = hf_tokenizer()
    ref = reference_tokenizer()
    config = transformers.Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).eval()
    messages = [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}]
    prompt = tok.apply_chat_template([{"role": "user", "content": "Say hello."}], tokenize=True,
                                     add_generation_prompt=True)
    prompt = list(prompt["input_ids"] if isinstance(prompt, dict) or hasattr(prompt, "keys") else prompt)
    text = "hello world"
    canonical = tok.encode(text, add_special_tokens=False)
    # the same text, one character per token: what a sampler may produce, decoded identically
    sampled = [tid for ch in text for tid in tok.encode(ch, add_special_tokens=False)] + [ref.im_end_id]
    assert sampled[:-1] != canonical and tok.decode(sampled[:-1]) == text
    record = {"prompt_token_ids": prompt, "completion_token_ids": sampled,
              "per_token_logps": score_tokens(model, prompt, sampled),
              "request": {"messages": messages}, "response": {"choices": [
                  {"message": {"role": "assistant", "content": text}}]},
              "metadata": {"session_id": "s", "node_id": "s/0", "call_index": 0, "call_kind": "agent",
                           "status": "ok", "logprobs_are_policy": True,
                           "provenance": {"sampling_effective": dict(TRAINING_POLICY), "logprobs_mode": "raw_logprobs"}}}
    ours = verify_records([record], model)
    versus = contrast_rerender([record], model, tok)
    assert ours.policy.delta_max < 1e-5  # the records' own path scores exactly what was sampled
    [turn] = versus.turns
    assert turn.sampled_tokens == len(sampled) and turn.rerendered_tokens != turn.sampled_tokens
    assert turn.misaligned > 0
