"""Why a session that requires an exact template is refused, with the remedy for each failed property."""

from __future__ import annotations

from typing import Any

#: what to do when a required property fails, by property
_ADVICE = {
    "tool_prefix": "serve a prefix-preserving training template (vLLM --chat-template, e.g. TRL's "
                   "qwen3_training.jinja for Qwen3) or use the incremental prompt mode",
    "assistant_stable": "serve a template that renders earlier assistant turns unchanged (TRL's *_training.jinja "
                        "keep reasoning), or use the incremental prompt mode",
    "turn_start": "use the incremental prompt mode (it continues the model's own ids, so the turn's start is "
                  "never re-rendered)",
    "junction": "serve a template whose assistant turns end the same way every time",
}


def exact_template_refusal(certification: dict[str, Any] | None, prompt_mode: str = "full_history") -> str | None:
    """Why ``require_exact_template`` refuses a session in ``prompt_mode`` (None when the template
    is exact in that mode)."""
    if not certification or (certification.get("status") == "uncertified" and not certification.get("properties")):
        reason = (certification or {}).get("reason", "no certification")
        return (f"require_exact_template: the served template could not be certified ({reason}); an engine with "
                "/tokenize and /detokenize is needed")
    exact_in = certification.get("exact_in")
    if exact_in is None:  # a certificate from before modes were named: certified meant exact in both
        exact_in = ["full_history", "incremental"] if certification.get("status") == "certified" else []
    if prompt_mode in exact_in:
        return None
    failed = [f for f in certification.get("failed") or [] if prompt_mode in (f.get("modes") or [prompt_mode])]
    parts = [f"{f['property']}: {f['detail']} -- {_ADVICE.get(f['property'], 'see docs/templates.md')}" for f in failed]
    parts += [f"{u['property']}: {u['detail']}" for u in certification.get("unchecked") or []]
    where = f" (exact in {' and '.join(m.replace('_', ' ') + ' mode' for m in exact_in)} only)" if exact_in else ""
    return (f"require_exact_template: the served template is not exact in {prompt_mode.replace('_', ' ')} "
            f"mode{where}: " + "; ".join(parts or ["no property says so"]))
