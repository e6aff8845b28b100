"""The trainer-side step-0 verifier on a small randomly initialised causal LM (no weights to fetch).

What must hold whatever the weights: chunked scoring equals one plain forward pass; a record whose
logprobs are the model's own verifies at ratio 1; a record with shifted logprobs shows the shift;
constrained calls are reported apart; the re-render contrast finds the misaligned tokens.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from openenv_harness.trainer.verify import DeltaStats, score_tokens, verify_records  # noqa: E402


@pytest.fixture(scope="module")
def model():
    config = transformers.Qwen2Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(0)
    m = transformers.Qwen2ForCausalLM(config).eval()
    return m


def _plain(model, prompt: list[int], completion: list[int]) -> list[float]:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logps = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    return [logps[len(prompt) - 1 + i, tok].item() for i, tok in enumerate(completion)]


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
def test_chunked_scoring_equals_one_forward_pass(model, chunk: int) -> None:
    prompt, completion = [5, 9, 11, 2, 40, 41, 42, 7, 8, 3], [13, 17, 19, 23, 29]
    scored = score_tokens(model, prompt, completion, chunk_tokens=chunk)
    assert scored == pytest.approx(_plain(model, prompt, completion), abs=1e-5)


def _record(call: int, prompt: list[int], completion: list[int], logps: list[float], *, policy: bool = True) -> dict:
    return {"prompt_token_ids": prompt, "completion_token_ids": completion, "per_token_logps": logps,
            "request": {"messages": []}, "response": {},
            "metadata": {"session_id": "s", "node_id": f"s/{call}", "call_index": call, "call_kind": "agent",
                         "status": "ok", "logprobs_are_policy": policy}}


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
    # the proof is over policy calls only; the constrained one is reported apart
    assert report.policy.tokens == 3 and report.policy.delta_max < 1e-5
    assert report.constrained.tokens == 3 and report.constrained.kl == pytest.approx(-0.5, abs=1e-4)


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
                           "status": "ok", "logprobs_are_policy": True}}
    ours = verify_records([record], model)
    versus = contrast_rerender([record], model, tok)
    assert ours.policy.delta_max < 1e-5  # the records' own path scores exactly what was sampled
    [turn] = versus.turns
    assert turn.sampled_tokens == len(sampled) and turn.rerendered_tokens != turn.sampled_tokens
    assert turn.misaligned > 0
