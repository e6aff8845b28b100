"""The step-0 proof: the trainer's own logprobs of the recorded ids against the engine's.

A trainer scoring our records scores exactly what the policy sampled -- or it does not, and then
the importance ratios it computes are silently wrong. With the policy unchanged (step 0) every
ratio exp(logp_trainer - logp_rollout) must sit at 1 up to numerical noise. ``verify_records``
scores every mask-1 token of a session's records with a Hugging Face causal LM, in one
teacher-forced pass per sample, reports per call and per rollout how far it is from 1, and gives a
verdict against absolute limits (``limits.py``): a mismatch fails, it is never only reported.

``contrast_rerender`` does what a message-level trainer does instead -- re-render the session's
messages with the model's chat template, tokenize, find the assistant spans, score them -- to show
on the same rollout what that path costs: changed lengths, misaligned tokens, ratios far from 1.

What decides what is compared, and is reported rather than hidden:
- The recorded sampling (``sampling.py``): a call's logprobs are the distribution it was sampled
  from only under a sampling the trainer reproduces -- temperature > 0, the whole vocabulary, no
  penalty, and at a temperature other than 1 the engine's processed logprobs. Such calls are scored
  with the logits divided by ``temperature_divisor``; the others are refused by name (the verdict
  is "cannot verify"), never scored as if they were.
- Calls under a decoding constraint (``metadata.logprobs_are_policy: false``) carry logprobs taken
  after the engine's grammar mask; they are scored and reported apart, never mixed into the proof.
- the engine's dtype vs the trainer's (bf16 against fp32 where they differ): the limits sit above the
  measured bf16/fp32 floor (``dtype`` says which one scored).

Trainer-side only (the ``trainer`` extra: torch + transformers); the recorder never imports it.
Memory-bounded: the prompt goes through the model in chunks with a KV cache, and logits are
computed only where a sampled token is scored (a 7k-token prompt would otherwise need 4 GB of
logits for a 152k vocabulary).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from openenv_harness.trainer.limits import DEFAULT_LIMITS, DeltaStats, LimitFailure, Limits
from openenv_harness.trainer.sampling import RecordedSampling, node_of, refusal_message

#: |ratio - 1| within this counts as "at 1" in ``share_within``
DEFAULT_EPSILON = DEFAULT_LIMITS.epsilon
#: tokens whose |delta| exceeds this are listed with their text
DEFAULT_THRESHOLD = 0.1


@dataclass
class TokenDelta:
    position: int  # index among the call's sampled tokens
    token_id: int
    text: str
    logp_rollout: float
    logp_trainer: float

    @property
    def delta(self) -> float:
        return abs(self.logp_trainer - self.logp_rollout)


@dataclass
class CallVerification:
    node_id: str
    call_index: int
    constrained: bool
    stats: DeltaStats
    outliers: list[TokenDelta] = field(default_factory=list)
    #: what the trainer divided its logits by (the recorded temperature for processed logprobs, else 1)
    temperature_divisor: float = 1.0


@dataclass
class RefusedCall:
    """A call whose sampling the trainer cannot reproduce: named, not scored."""

    node_id: str
    call_index: int
    constrained: bool
    reasons: list[str]


Status = Literal["verified", "failed", "cannot verify", "nothing verified"]


@dataclass
class Verdict:
    """The check's outcome: ``verified`` only when every policy call was scored and the pooled
    statistics meet every limit."""

    status: Status
    #: the limits the policy calls' statistics broke (status "failed")
    failures: list[LimitFailure] = field(default_factory=list)
    line: str = ""

    @property
    def verified(self) -> bool:
        return self.status == "verified"


@dataclass
class RolloutVerification:
    session_id: str
    calls: list[CallVerification]
    #: over calls whose logprobs are the policy's (the proof)
    policy: DeltaStats
    #: over calls under a decoding constraint (reported apart)
    constrained: DeltaStats
    dtype: str
    epsilon: float
    refused: list[RefusedCall] = field(default_factory=list)
    limits: Limits = DEFAULT_LIMITS

    @property
    def verdict(self) -> Verdict:
        """Refused policy calls first (nothing else can be claimed), then an empty proof, then the limits."""
        refused = [r for r in self.refused if not r.constrained]
        if refused:
            return Verdict("cannot verify", line="cannot verify: " + refusal_message(
                [(r.node_id, r.reasons) for r in refused]))
        if self.policy.tokens == 0:
            return Verdict("nothing verified", line=(
                f"nothing verified: no sampled token of {self.session_id or 'the session'} carries the policy's "
                f"logprobs ({self.constrained.tokens} constrained token(s), logprobs taken after a decoding "
                "constraint; record calls without tool_choice 'required' or structured outputs to verify them)"))
        failures = self.limits.failures(self.policy)
        if failures:
            return Verdict("failed", failures, (
                f"step-0 check failed over {self.policy.tokens} policy token(s): "
                + "; ".join(f.text for f in failures) + f" (limits: {self.limits.summary()})"))
        return Verdict("verified", line=(
            f"verified: {self.policy.tokens} policy token(s) within the limits ({self.limits.summary()})"))

    def as_dict(self) -> dict[str, Any]:
        verdict = self.verdict
        return {**asdict(self), "verdict": {"status": verdict.status, "line": verdict.line,
                                            "failures": [{**asdict(f), "text": f.text} for f in verdict.failures]}}


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - the trainer extra is what provides it
        raise ImportError("verification needs torch and transformers (pip install 'openenv-harness[trainer]')") from exc
    return torch


def score_tokens(model: Any, prompt_ids: Sequence[int], completion_ids: Sequence[int], *,
                 chunk_tokens: int = 1024, temperature: float = 1.0) -> list[float]:
    """The model's log-probability of each completion id given everything before it, of the
    distribution softmax(logits / ``temperature``) (1: the model's own, what raw logprobs are).

    One teacher-forced pass: the context goes through in chunks with a KV cache; logits are taken
    only at the positions that predict a completion token.
    """
    torch = _torch()
    if not temperature > 0:
        raise ValueError(f"a temperature divides the logits: it must be positive, not {temperature}")
    if not completion_ids:
        return []
    ids = list(prompt_ids) + list(completion_ids)
    first = len(prompt_ids)  # position of the first scored token
    if first < 1:
        raise ValueError("a scored completion needs at least one prompt token before it")
    device = next(model.parameters()).device
    # transformers 5.2x names the cache argument ``cache``; earlier releases ``past_key_values``
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    out: list[float] = []
    past = None
    with torch.no_grad():
        start = 0
        while start < len(ids) - 1:
            end = min(len(ids) - 1, start + chunk_tokens)
            piece = torch.tensor([ids[start:end]], device=device)
            keep_from = max(start, first - 1)  # positions whose next token is scored
            result = model(input_ids=piece, use_cache=True, **{cache_arg: past},
                           logits_to_keep=max(0, end - keep_from) if keep_from < end else 1)
            past = getattr(result, "cache", None) or result.past_key_values
            if keep_from < end:
                logits = result.logits[0, -(end - keep_from):].float() / temperature
                logps = torch.log_softmax(logits, dim=-1)
                targets = torch.tensor(ids[keep_from + 1:end + 1], device=device)
                out.extend(logps.gather(1, targets[:, None])[:, 0].tolist())
            start = end
    return out


def score_chained(model: Any, calls: Sequence[tuple[Sequence[int], Sequence[int], float]], *,
                  chunk_tokens: int = 1024) -> list[list[float]]:
    """``score_tokens`` for many calls at once, in order: ``calls`` are (prompt ids, sampled ids,
    temperature divisor). A call whose context (prompt + sampled ids) the next call's prompt starts
    with -- an exact chain, as incremental mode records -- is scored inside that later call's single
    forward pass: a causal model's logits at a position depend only on what precedes it, so the
    numbers are those of scoring each call on its own context, at the cost of the longest one."""
    runs: list[tuple[list[int], list[tuple[int, int, int]], float]] = []  # (ids, (call, start, end), divisor)
    for index, (prompt, sampled, divisor) in enumerate(calls):
        ids = [*prompt, *sampled]
        last = runs[-1] if runs else None
        if (last is not None and last[2] == divisor and len(last[0]) <= len(prompt)
                and list(prompt[:len(last[0])]) == last[0]):
            runs[-1] = (ids, [*last[1], (index, len(prompt), len(ids))], divisor)
        else:
            runs.append((ids, [(index, len(prompt), len(ids))], divisor))
    out: list[list[float]] = [[] for _ in calls]
    for ids, parts, divisor in runs:
        first = parts[0][1]
        scores = score_tokens(model, ids[:first], ids[first:], chunk_tokens=chunk_tokens, temperature=divisor)
        for index, start, end in parts:
            out[index] = scores[start - first:end - first]
    return out


def _agent_records(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in records if r["metadata"].get("call_kind") == "agent" and r["metadata"].get("status") == "ok"
            and r.get("completion_token_ids")]


def verify_records(records: Iterable[Mapping[str, Any]], model: Any, tokenizer: Any = None, *,
                   limits: Limits = DEFAULT_LIMITS, threshold: float = DEFAULT_THRESHOLD,
                   chunk_tokens: int = 1024) -> RolloutVerification:
    """Score every sampled token of a session's trainable agent calls and compare with the records.

    Each call is scored on its own recorded context (prompt ids + sampled ids): exactly the sample
    a trainer builds from it, under the call's recorded sampling (logits divided by its
    ``temperature_divisor``). A call whose sampling the trainer cannot reproduce is refused and
    named instead (``RolloutVerification.refused``). ``tokenizer`` (optional) only decodes outlier
    tokens for the report. The verdict applies ``limits`` to the policy calls' pooled statistics.
    """
    calls: list[CallVerification] = []
    refused: list[RefusedCall] = []
    policy_r: list[float] = []
    policy_t: list[float] = []
    cons_r: list[float] = []
    cons_t: list[float] = []
    session_id = ""
    for record in _agent_records(records):
        md = record["metadata"]
        session_id = md.get("session_id", session_id)
        constrained = md.get("logprobs_are_policy") is False
        sampling = RecordedSampling.of(record)
        reasons = sampling.problems()
        rollout = [float(lp) for lp in record.get("per_token_logps") or []]
        if len(rollout) != len(record["completion_token_ids"]):
            reasons.append(f"{len(rollout)} logprobs for {len(record['completion_token_ids'])} sampled ids")
        if reasons:
            refused.append(RefusedCall(node_of(record), md.get("call_index", -1), constrained, reasons))
            continue
        trainer = score_tokens(model, record["prompt_token_ids"], record["completion_token_ids"],
                               chunk_tokens=chunk_tokens, temperature=sampling.temperature_divisor)
        outliers = [
            TokenDelta(i, tok, tokenizer.decode([tok]) if tokenizer is not None else "", r, t)
            for i, (tok, r, t) in enumerate(zip(record["completion_token_ids"], rollout, trainer))
            if abs(t - r) > threshold
        ]
        calls.append(CallVerification(md.get("node_id", ""), md.get("call_index", -1), constrained,
                                      DeltaStats.of(rollout, trainer, limits.epsilon), outliers,
                                      sampling.temperature_divisor))
        (cons_r if constrained else policy_r).extend(rollout)
        (cons_t if constrained else policy_t).extend(trainer)
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    return RolloutVerification(session_id, calls, DeltaStats.of(policy_r, policy_t, limits.epsilon),
                               DeltaStats.of(cons_r, cons_t, limits.epsilon), dtype, limits.epsilon, refused, limits)


@dataclass
class ContrastTurn:
    call_index: int
    sampled_tokens: int
    rerendered_tokens: int
    misaligned: int  # positions where the re-rendered id is not the sampled id
    stats: DeltaStats  # ratios of the re-rendered tokens' logprobs against the recorded ones, position by position


@dataclass
class ContrastReport:
    turns: list[ContrastTurn]
    total: DeltaStats

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _message_level(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as a message-level trainer hands them to the template: text parts joined into a
    string (templates expect strings), tool arguments parsed (as vLLM does)."""
    from openenv_harness.trainer.template import engine_view

    out = engine_view(messages)
    for message in out:
        content = message.get("content")
        if isinstance(content, list):
            message["content"] = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return out


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, generation: bool) -> list[int]:
    from openenv_harness.trainer.template import _as_ids

    return _as_ids(tokenizer.apply_chat_template(_message_level(messages), tools=tools or None, tokenize=True,
                                                 add_generation_prompt=generation))


def contrast_rerender(records: Iterable[Mapping[str, Any]], model: Any, tokenizer: Any, *,
                      epsilon: float = DEFAULT_EPSILON, chunk_tokens: int = 1024) -> ContrastReport:
    """What a message-level trainer would score for the same rollout.

    It takes the last agent call's messages plus its reply, renders the whole conversation with the
    model's chat template, finds each assistant turn's span (render of the turns before it with a
    generation prompt, to the render including it), scores the span's tokens in that re-rendered
    context and compares them position by position with the recorded sampled ids and logprobs.
    """
    agent = _agent_records(records)
    if not agent:
        return ContrastReport([], DeltaStats(kl_k3=None))
    last = agent[-1]
    request = last["request"]
    reply = (last["response"].get("choices") or [{}])[0].get("message") or {}
    conversation = [*request["messages"], {k: v for k, v in reply.items() if v is not None}]
    tools = request.get("tools")
    assistant_at = [i for i, m in enumerate(conversation) if m.get("role") == "assistant"]
    full = _render(tokenizer, conversation, tools, False)
    turns: list[ContrastTurn] = []
    all_r: list[float] = []
    all_t: list[float] = []
    # the conversation's last assistant turns are the last agent calls' replies, in order
    k = min(len(assistant_at), len(agent))
    for record, index in zip(agent[len(agent) - k:], assistant_at[len(assistant_at) - k:]):
        start = len(_render(tokenizer, conversation[:index], tools, True))
        end = len(_render(tokenizer, conversation[:index + 1], tools, False))
        span = full[start:end]
        sampled = list(record["completion_token_ids"])
        scored = score_tokens(model, full[:start], span, chunk_tokens=chunk_tokens,
                              temperature=RecordedSampling.of(record).temperature_divisor)
        n = min(len(span), len(sampled))
        misaligned = sum(1 for a, b in zip(span[:n], sampled[:n]) if a != b) + abs(len(span) - len(sampled))
        rollout = list(record["per_token_logps"])[:n]
        stats = DeltaStats.of(rollout, scored[:n], epsilon, sampled=False)
        turns.append(ContrastTurn(record["metadata"].get("call_index", -1), len(sampled), len(span), misaligned, stats))
        all_r.extend(rollout)
        all_t.extend(scored[:n])
    return ContrastReport(turns, DeltaStats.of(all_r, all_t, epsilon, sampled=False))


def scoring_dtype(dtype: str = "auto") -> str:
    """``auto``: the dtype the project's engine computes in on this CPU (``engine.launcher.serving_dtype``):
    bfloat16 where the CPU multiplies bf16 in hardware (AVX-512 BF16 or AMX), else float32 -- without
    those, torch emulates bf16 matmuls far slower than fp32, and vLLM is started in float32 there too."""
    if dtype != "auto":
        return dtype
    from openenv_harness.engine.launcher import serving_dtype

    return "bfloat16" if serving_dtype() is None else "float32"


def load_model(model_dir: str, *, dtype: str = "auto") -> tuple[Any, Any]:
    """The causal LM and tokenizer from a local folder (the folder the engine serves), on the CPU, in
    ``dtype`` (``scoring_dtype``: ``auto`` picks what this CPU scores fast)."""
    torch = _torch()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, scoring_dtype(dtype)))
    model.eval()  # type: ignore[no-untyped-call]
    return model, tokenizer
