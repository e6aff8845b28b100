"""One pass over the scale-out routes, for conformance checks between engines.

Why in the package: the same sequence (render -> generate -> derender -> an id-prompt completion)
runs against the reference engine and against a real vLLM, and the shapes of the answers are
compared (``tests/real_engine/test_real_scale_out.py``); the sequence is also how the recorder's
incremental mode uses these routes.
"""

from __future__ import annotations

from typing import Any

import httpx

from openenv_harness.recorder.prompt_modes.id_sampling import completion_body
from openenv_harness.recorder.prompt_modes.sample_parse import DERENDER_PROMPT_TAIL, derender_chat_request

PROBE_TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


#: dicts keyed by data (a completion's ``top_logprobs`` maps token text to logprob), not by field names
_DATA_KEYED = {"top_logprobs"}


def shape(value: Any, parent: str | None = None) -> Any:
    """Key structure of a JSON value: dicts keep their keys (with nested shapes), lists their first item's."""
    if isinstance(value, dict):
        if parent in _DATA_KEYED and all(isinstance(v, float) for v in value.values()):
            return "token->logprob"
        return {k: shape(v, k) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [shape(value[0], parent)] if value else []
    return None


def run_probe(client: httpx.Client, model: str, max_tokens: int = 4) -> dict[str, Any]:
    """The four answers, as JSON, with their HTTP statuses checked."""
    # a continued conversation, as the recorder's incremental mode derenders: a tool call made, its result
    history = [{"role": "user", "content": "List the files."},
               {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
                   "name": "bash", "arguments": '{"command": "ls"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "README.md\nsetup.py\n"}]
    chat = {"model": model, "messages": history, "tools": PROBE_TOOLS,
            "max_tokens": max_tokens, "logprobs": True, "top_logprobs": 0}
    rendered = client.post("/v1/chat/completions/render", json=chat)
    rendered.raise_for_status()
    r = rendered.json()
    generated = client.post("/inference/v1/generate", json={"model": model, "token_ids": r["token_ids"],
                                                             "sampling_params": r["sampling_params"]})
    generated.raise_for_status()
    g = generated.json()
    # as the recorder's incremental mode asks (the prompt's tail and its length, the request without the
    # history it does not read), and with the whole prompt and the whole request
    derendered = client.post("/v1/chat/completions/derender",
                             json={"generate_response": g, "prompt_token_ids": r["token_ids"][-DERENDER_PROMPT_TAIL:],
                                   "prompt_tokens": len(r["token_ids"]), "chat_request": derender_chat_request(chat)})
    derendered.raise_for_status()
    whole = client.post("/v1/chat/completions/derender",
                        json={"generate_response": g, "prompt_token_ids": r["token_ids"], "chat_request": chat})
    whole.raise_for_status()
    # the sampled ids echoed where the chat request asks for them; a sample of no ids refused
    echoed = client.post("/v1/chat/completions/derender",
                         json={"generate_response": g, "prompt_token_ids": r["token_ids"][-DERENDER_PROMPT_TAIL:],
                               "chat_request": {**derender_chat_request(chat), "return_token_ids": True}})
    echoed.raise_for_status()
    empty_choice = {**g["choices"][0], "token_ids": [], "logprobs": None, "finish_reason": "abort"}
    empty = client.post("/v1/chat/completions/derender",
                        json={"generate_response": {**g, "choices": [empty_choice]},
                              "prompt_token_ids": r["token_ids"][-DERENDER_PROMPT_TAIL:],
                              "chat_request": derender_chat_request(chat)})
    # the body the recorder's id sampling sends (ids back, tokens spelled token_id:N), 2 tokens long
    completed = client.post("/v1/completions",
                            json=completion_body(r["token_ids"], {**r["sampling_params"], "max_tokens": 2}, model))
    completed.raise_for_status()
    bad = client.post("/inference/v1/generate", json={"token_ids": []})
    return {"render": r, "generate": g, "derender": derendered.json(), "derender_whole": whole.json(),
            "derender_echoed": echoed.json(), "empty_derender_status": empty.status_code,
            "empty_derender": empty.json(),
            "completion": completed.json(),
            "bad_generate_status": bad.status_code, "bad_generate": bad.json()}
