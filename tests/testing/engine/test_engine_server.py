"""The engine as a server: background thread, separate process, and the small vLLM routes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from openenv_harness.testing.engine import ENGINE_VERSION, EngineServer, reference_template, reference_tokenizer


def test_models_version_health_and_info(engine: EngineServer) -> None:
    models = httpx.get(engine.url + "/v1/models").json()
    assert models["object"] == "list"
    card = models["data"][0]
    assert (card["id"], card["object"], card["owned_by"], card["max_model_len"]) == (
        "reference-model", "model", "vllm", 32768)
    assert card["permission"][0]["object"] == "model_permission"
    assert httpx.get(engine.url + "/version").json() == {"version": ENGINE_VERSION}
    assert httpx.get(engine.url + "/health").status_code == 200
    info = engine.info()
    assert info["template_sha256"] == reference_template().sha256
    assert info["tokenizer_sha256"] == reference_tokenizer().fingerprint()
    assert info["eos_token_id"] == reference_tokenizer().im_end_id


def test_detokenize_skips_unknown_ids_and_rejects_negative_ones(engine: EngineServer) -> None:
    tok = reference_tokenizer()
    ids = tok.encode("hello world")
    known = httpx.post(engine.url + "/detokenize", json={"tokens": [*ids, 10**7]})
    assert known.status_code == 200 and known.json() == {"prompt": "hello world"}  # what vLLM 0.32 does
    bad = httpx.post(engine.url + "/detokenize", json={"tokens": [1, -3]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    both = httpx.post(engine.url + "/tokenize", json={"prompt": "x", "messages": []})
    assert both.status_code == 400


def test_reset_clears_scripts_faults_and_log(engine: EngineServer, wire) -> None:
    engine.set_script("*", {"turns": [{"content": "scripted"}]})
    engine.add_fault("*", {"status": 500, "count": 5})
    wire.post_chat(engine, wire.chat_body([wire.USER]))
    engine.reset()
    assert engine.requests() == []
    reply = wire.post_chat(engine, wire.chat_body([wire.USER]))
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "Done."


def test_stop_frees_the_port_and_servers_are_independent() -> None:
    with EngineServer() as first, EngineServer() as second:
        assert first.port != second.port
        first.set_script("*", {"turns": [{"content": "first"}]})
        body = {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function",
                                                                           "function": {"name": "x"}}]}
        replies = [httpx.post(s.url + "/v1/chat/completions", json=body).json() for s in (first, second)]
        assert [r["choices"][0]["message"]["content"] for r in replies] == ["first", "Done."]
        url = first.url
    try:
        httpx.get(url + "/health", timeout=1)
    except httpx.TransportError:
        pass
    else:
        raise AssertionError("the stopped server still answers")


def test_runs_as_a_separate_process(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"content": "from a file"}]}))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "openenv_harness.testing.engine", "--port", "0", "--served-model-name", "m",
         "--script", str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = process.stdout.readline()
        assert line.startswith("READY http://127.0.0.1:"), (line, process.stderr.read() if process.poll() else "")
        url = line.split()[1]
        assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == "m"
        reply = httpx.post(url + "/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "x"}}]}).json()
        assert reply["choices"][0]["message"]["content"] == "from a file"
    finally:
        process.terminate()
        process.wait(10)


def test_tokenize_lists_vocabulary_strings(engine: EngineServer) -> None:
    reply = httpx.post(engine.url + "/tokenize", json={"prompt": "hello world", "return_token_strs": True}).json()
    tok = reference_tokenizer()
    assert reply["tokens"] == tok.encode("hello world")
    assert reply["token_strs"] == [tok.tokenizer.id_to_token(i) for i in reply["tokens"]]
    assert any(s.startswith("Ġ") for s in reply["token_strs"]), "vLLM lists the raw entries, not decoded text"


def test_a_separate_process_serves_a_trl_template(tmp_path: Path, wire) -> None:
    template = wire.trl_template("qwen3.jinja")
    process = subprocess.Popen(
        [sys.executable, "-m", "openenv_harness.testing.engine", "--port", "0", "--chat-template", str(template)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = process.stdout.readline()
        assert line.startswith("READY http://127.0.0.1:"), (line, process.stderr.read() if process.poll() else "")
        url = line.split()[1]
        assert httpx.get(url + "/_ref/info").json()["chat_template"] == "qwen3.jinja"
        ids = httpx.post(url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}],
                                                  "chat_template_kwargs": {"enable_thinking": False}}).json()["tokens"]
        text = httpx.post(url + "/detokenize", json={"tokens": ids}).json()["prompt"]
        assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    finally:
        process.terminate()
        process.wait(10)
