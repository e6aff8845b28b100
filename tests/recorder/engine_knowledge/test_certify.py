"""Template certification through the engine's own /tokenize and /detokenize.

The reference engine's template keeps chains exact (certified); an engine without /tokenize is
``uncertified`` and ``require_exact_template`` refuses it; the certification is probed again when
the engine may have changed (operator request, a fingerprint mismatch, the time-to-live).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from openenv_harness.recorder import RecorderAPIError, RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.recorder.upstream import HTTPEngine
from openenv_harness.testing.engine import EngineConfig, EngineServer

ADMIN = "certify-admin-token-0123456789abcdef"


def test_the_reference_template_is_certified_and_sessions_carry_it(tmp_path: Path) -> None:
    with EngineServer() as engine:
        config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN)
        with RecorderServer(config) as server, RecorderClient(server.url, ADMIN) as admin:
            cert = admin.health()["engine"]["template_certification"]
            created = admin.create_session(require_exact_template=True)
            metrics = httpx.get(f"{server.url}/metrics", headers={"authorization": f"Bearer {ADMIN}"}).text
    assert cert["status"] == "certified" and cert["failed"] == []
    assert cert["exact_in"] == ["full_history", "incremental"]
    assert cert["properties"]["tool_prefix"] is True and cert["properties"]["junction"] is True
    assert cert["properties"]["turn_start"] is True
    assert created["template_certification"] == cert
    assert "oeh_template_certified 1.0" in metrics
    assert 'oeh_template_property{property="tool_prefix"} 1.0' in metrics


def _no_tokenize(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/v1/models":
        return httpx.Response(200, json={"object": "list", "data": [{"id": "m", "max_model_len": 4096}]})
    return httpx.Response(404, json={"error": {"message": "Not Found"}})


def test_an_engine_without_tokenize_is_uncertified_visibly(tmp_path: Path) -> None:
    config = RecorderConfig(store_path=str(tmp_path / "r.db"), admin_token=ADMIN)
    engine = HTTPEngine("http://engine", transport=httpx.MockTransport(_no_tokenize))
    with RecorderServer(config, upstreams={"default": engine}) as server, RecorderClient(server.url, ADMIN) as admin:
        cert = admin.health()["engine"]["template_certification"]
        plain = admin.create_session()
        with pytest.raises(RecorderAPIError) as refused:
            admin.create_session(require_exact_template=True)
    assert cert["status"] == "uncertified" and "/tokenize" in cert["reason"]
    assert plain["template_certification"]["status"] == "uncertified"
    assert refused.value.status == 409 and "could not be certified" in str(refused.value)


class ChangingEngine:
    """A test double of vLLM's /tokenize whose rendering changes when told (a restart with another
    template behind the same URL); counts the probes it answers."""

    def __init__(self) -> None:
        self.offset = 0
        self.tokenize_calls = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        import orjson

        if request.url.path == "/tokenize":
            self.tokenize_calls += 1
            body = orjson.loads(request.content)
            ids = [self.offset + len(str(m)) % 97 for m in body["messages"]] + [7] * body["add_generation_prompt"]
            return httpx.Response(200, json={"count": len(ids), "max_model_len": 4096, "tokens": ids,
                                             "token_strs": None})
        if request.url.path == "/detokenize":
            return httpx.Response(200, json={"prompt": "text"})
        if request.url.path == "/version":
            return httpx.Response(200, json={"version": f"0.32.{self.offset}"})
        return _no_tokenize(request)


def test_the_template_is_probed_again_when_the_engine_may_have_changed(tmp_path: Path) -> None:
    double = ChangingEngine()
    config = RecorderConfig(store_path=str(tmp_path / "r.db"), admin_token=ADMIN, template_reprobe_s=3600)
    engine = HTTPEngine("http://engine", transport=httpx.MockTransport(double))
    with RecorderServer(config, upstreams={"default": engine}) as server, RecorderClient(server.url, ADMIN) as admin:
        first = admin.health()["engine"]
        admin.create_session()
        assert double.tokenize_calls and admin.health()["engine"]["probed_at"] == first["probed_at"]  # fresh: reused
        double.offset = 1  # the engine restarts with another template
        # a trainer's fingerprint is compared with what is served now: re-probed before refusing
        with pytest.raises(RecorderAPIError):
            admin.create_session(trainer_template_fingerprint=first["template_fingerprint"])
        second = admin.health()["engine"]
        assert second["template_fingerprint"] != first["template_fingerprint"]
        assert second["version"] == "0.32.1" and second["probe_reason"] == "the served template changed"
        calls = double.tokenize_calls
        third = httpx.post(f"{server.url}/admin/engine/reprobe", headers={"authorization": f"Bearer {ADMIN}"}).json()
        assert double.tokenize_calls > calls and third["probe_reason"] == "asked by an operator"


def test_the_time_to_live_forces_a_new_probe(tmp_path: Path) -> None:
    double = ChangingEngine()
    config = RecorderConfig(store_path=str(tmp_path / "r.db"), admin_token=ADMIN, template_reprobe_s=0.001)
    engine = HTTPEngine("http://engine", transport=httpx.MockTransport(double))
    with RecorderServer(config, upstreams={"default": engine}) as server, RecorderClient(server.url, ADMIN) as admin:
        before = double.tokenize_calls
        admin.create_session()
        info = admin.health()["engine"]
    assert double.tokenize_calls > before and info["probe_reason"].startswith("older than")


def _certify_direct(config: EngineConfig) -> Any:
    """Certify a reference engine as the recorder does, straight through its HTTP routes."""
    from openenv_harness.recorder.engine_knowledge.certify import certify_template

    async def run(url: str) -> Any:
        upstream = HTTPEngine(url, timeout_s=60)
        await upstream.start()
        try:
            return await certify_template(upstream)
        finally:
            await upstream.aclose()

    with EngineServer(config) as engine:
        return asyncio.run(run(engine.url))


def test_certification_renders_as_the_chat_route_does_when_the_engine_serves_render() -> None:
    """vLLM 0.32's chat route (and its render route) renames a replayed ``reasoning_content`` to
    ``reasoning`` before templating; its ``/tokenize`` drops it. Certified through /tokenize, a template
    that renders reasoning would be reported as dropping what the chat route in fact renders (and
    OpenCode's replay blamed for drift it does not cause). Through the render route the report says
    what the chat route does, and which route it probed."""
    via_render = _certify_direct(EngineConfig())
    rendered = next(p for p in via_render.properties if p.name == "assistant_stable").facts["rendered"]
    assert via_render.probed_via == "render" and via_render.summary()["probed_via"] == "render"
    assert rendered == {"reasoning": True, "reasoning_content": True}
    # an engine without the scale-out routes (vLLM without --enable-scale-out): /tokenize, said so
    via_tokenize = _certify_direct(EngineConfig(scale_out=False))
    rendered = next(p for p in via_tokenize.properties if p.name == "assistant_stable").facts["rendered"]
    assert via_tokenize.probed_via == "tokenize"
    assert rendered == {"reasoning": True, "reasoning_content": False}
    assert via_tokenize.status == via_render.status == "certified"
    # an engine whose chat route drops reasoning_content too (no rename): the render route reports that
    no_rename = _certify_direct(EngineConfig(reasoning_content="drop"))
    rendered = next(p for p in no_rename.properties if p.name == "assistant_stable").facts["rendered"]
    assert no_rename.probed_via == "render" and rendered == {"reasoning": True, "reasoning_content": False}


def test_a_refusal_names_the_mode_and_what_the_template_is_exact_in() -> None:
    from openenv_harness.recorder.admin.exact_template import exact_template_refusal

    think = {"status": "failed", "exact_in": ["incremental"], "properties": {"turn_start": False, "junction": True},
             "failed": [{"property": "turn_start", "detail": "the generation prompt is not a token prefix",
                         "modes": ["full_history"]}]}
    assert exact_template_refusal(think, "incremental") is None
    refusal = exact_template_refusal(think, "full_history")
    assert refusal is not None and "not exact in full history mode (exact in incremental mode only)" in refusal
    assert "turn_start" in refusal and "use the incremental prompt mode" in refusal
    # a certificate stored before modes were named: certified meant exact in both, failed in neither
    assert exact_template_refusal({"status": "certified", "failed": [], "properties": {}}, "incremental") is None
    old_failed = {"status": "failed", "properties": {"junction": False},
                  "failed": [{"property": "junction", "detail": "no common ending"}]}
    assert "junction" in (exact_template_refusal(old_failed, "incremental") or "")
    assert "could not be certified" in (exact_template_refusal(None) or "")


def test_a_probe_the_template_refuses_leaves_only_its_property_unchecked(tmp_path: Path) -> None:
    """A template that refuses tool calls as the engine passes them (arguments as objects): the tool
    properties are unchecked with the engine's words, the rest is certified, and the certificate is
    ``uncertified`` for full history only where nothing failed."""
    template = tmp_path / "no_tool_calls.jinja"
    template.write_text(
        "{% for m in messages %}{% if m.tool_calls %}{{ raise_exception('tool calls are not supported') }}{% endif %}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    with EngineServer(EngineConfig(chat_template=template)) as engine:
        async def go() -> Any:
            from openenv_harness.recorder.engine_knowledge.certify import certify_template

            upstream = HTTPEngine(engine.url)
            await upstream.start()
            try:
                return await certify_template(upstream)
            finally:
                await upstream.aclose()

        cert = asyncio.run(go())
    props = {p.name: p for p in cert.properties}
    assert props["tool_prefix"].passed is None and "tool calls are not supported" in props["tool_prefix"].detail
    assert props["turn_start"].passed is True and props["junction"].passed is True
    assert props["content_parts"].passed is True
    assert cert.status == "uncertified" and "tool_prefix" in (cert.reason or "")
    assert cert.exact_in == ["incremental"]
    assert cert.summary()["unchecked"][0]["property"] == "tool_prefix"
