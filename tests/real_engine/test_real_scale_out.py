"""The reference engine's scale-out routes answer in the real vLLM 0.32's shapes (--enable-scale-out)."""

from __future__ import annotations

import httpx
import pytest

from openenv_harness.engine import VLLMServer
from openenv_harness.recorder.prompt_modes.id_sampling import as_generate_response
from openenv_harness.recorder.prompt_modes.sample_parse import DERENDER_PROMPT_TAIL
from openenv_harness.testing.engine import EngineServer
from openenv_harness.testing.engine.scale_out_probe import run_probe, shape

pytestmark = [pytest.mark.real_engine]


def test_render_generate_derender_and_id_prompts_have_vllms_shapes(vllm: VLLMServer) -> None:
    with httpx.Client(base_url=vllm.url, timeout=300) as client:
        real = run_probe(client, vllm.settings.served_name)
    with EngineServer() as engine, httpx.Client(base_url=engine.url, timeout=60) as client:
        ours = run_probe(client, "reference-model")
    for route in ("render", "generate", "derender", "completion"):
        assert shape(ours[route]) == shape(real[route]), route
    assert ours["bad_generate_status"] == real["bad_generate_status"] == 400
    assert set(ours["bad_generate"]["error"]) == set(real["bad_generate"]["error"])
    # derender reads only the prompt's tail and, of the chat request's history, only its tool-call turns
    # (what the recorder sends): the same reply as with the whole prompt and the whole request, the
    # prompt's length taken for usage -- on both engines
    for engine in (real, ours):
        assert len(engine["render"]["token_ids"]) > DERENDER_PROMPT_TAIL, "the tail must be a real cut"
        tail, whole = engine["derender"]["choices"][0], engine["derender_whole"]["choices"][0]
        assert _sans_call_ids(tail["message"]) == _sans_call_ids(whole["message"])
        assert tail["finish_reason"] == whole["finish_reason"]
        assert engine["derender"]["usage"]["prompt_tokens"] == len(engine["render"]["token_ids"])
    # the sampled ids come back from derender only where asked for; a sample of no ids (an abort
    # before the first token) is refused, so the recorder must not ask (recorder/prompt_modes/sample_parse.py)
    for engine in (real, ours):
        assert engine["derender"]["choices"][0]["token_ids"] is None
        assert engine["derender_echoed"]["choices"][0]["token_ids"] == engine["generate"]["choices"][0]["token_ids"]
    assert ours["empty_derender_status"] == real["empty_derender_status"] == 400
    assert ours["empty_derender"] == real["empty_derender"]
    # what the recorder relies on: the render's ids are what generate sampled from
    assert real["generate"]["usage"]["prompt_tokens"] == len(real["render"]["token_ids"])
    assert real["completion"]["choices"][0]["prompt_token_ids"] == real["render"]["token_ids"]
    # what the recorder's id sampling reads from an id-prompt completion, on both engines alike
    for engine in (real, ours):
        choice = engine["completion"]["choices"][0]
        assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
        generated = as_generate_response(engine["completion"])
        assert generated is not None and generated["choices"][0]["token_ids"] == choice["token_ids"]
        assert [e["logprob"] for e in generated["choices"][0]["logprobs"]["content"]] == \
            choice["logprobs"]["token_logprobs"]


def _sans_call_ids(message: dict) -> dict:
    """A derendered message without its tool calls' ids (fresh random ones on every answer)."""
    calls = [{k: v for k, v in c.items() if k != "id"} for c in message.get("tool_calls") or []]
    return {**message, "tool_calls": calls}
