"""Part of the record step: how an agent call's prompt relates to its chain's (``recorder/chain/fidelity.py``),
and, where it departs, why (``recorder/chain/drift_cause.py``)."""

from __future__ import annotations

from array import array
from typing import Any

from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.chain.drift_cause import break_cause, drift_cause, turn_view
from openenv_harness.recorder.chain.fidelity import Transition
from openenv_harness.recorder.session.restore import read_tip_prompts
from openenv_harness.recorder.validate import Evidence


async def observe_chain(flow: Flow, md: dict[str, Any], ev: Evidence) -> None:
    """An agent call with its ids: its transition (``metadata.fidelity``) and, where it departs, why."""
    if flow.call_kind != "agent" or ev.prompt_ids is None or ev.completion_ids is None:
        return
    transition = await observe_fidelity(flow, md["node_id"], ev.prompt_ids, ev.completion_ids)
    md["fidelity"] = transition.as_dict()
    if transition.fidelity != "root":
        flow.ctx.metrics.transitions.labels(transition.fidelity).inc()
    observe_cause(flow, md, transition, ev)


async def observe_fidelity(flow: Flow, node_id: str, prompt: array[int], completion: array[int]) -> Transition:
    """The session's tracker (under the recorder's budget) classifies the call; a break against tips
    it sketched while the session was idle first reads those tips' prompts back (``chain/fidelity.py``)."""
    session = flow.session
    chain = session.chain
    prompts: dict[str, bytes] = {}
    for _ in range(3):  # a concurrent call of the session may sketch or replace tips meanwhile
        need = {n: s for n, s in chain.prompts_needed(prompt).items() if n not in prompts}
        if not need:
            break
        prompts.update(await read_tip_prompts(flow.ctx.store, session.id, need))
    return chain.observe(node_id, prompt, completion, prompts)


def observe_cause(flow: Flow, md: dict[str, Any], transition: Any, ev: Evidence) -> None:
    """Name why a drifting or breaking call departs from its parent, and keep this call's view."""
    chain = flow.session.chain
    messages = flow.body.get("messages") or []
    assert ev.prompt_ids is not None and ev.completion_ids is not None  # an agent call with its ids (``record``)
    if transition.fidelity in ("replay_drift", "break"):
        parent = chain.view(transition.parent)
        prompt = ev.prompt_ids.tobytes()
        certification = flow.ctx.engine_watch.certification
        if parent is None:
            cause = "unknown"
        elif transition.fidelity == "replay_drift":
            cause = "resample" if transition.drift_tokens == 0 else drift_cause(
                parent, messages, prompt, certification, transition.divergence_at, chain.summaries)
        else:
            cause = break_cause(parent, messages, same_prompt=False, summaries=chain.summaries,
                                certification=certification)
        md["fidelity"]["cause"] = cause
        flow.ctx.metrics.transition_causes.labels(transition.fidelity, cause).inc()
    choices = flow.reply.json.get("choices") if flow.reply is not None and flow.reply.json else None
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    chain.keep_view(md["node_id"], turn_view(messages, message if isinstance(message, dict) else None,
                                             ev.completion_ids.tobytes()))
