"""The benchmark's scripts work end to end: real processes, real HTTP over loopback, checked replies.

No timing assertions: these prove the lean engine speaks the wire format the recorder needs, the load
generator rejects bad replies, and the runner's quick path measures every target and renders a page.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest

import floor_proxy
import loadgen
import procs
from lean_engine import EOS, ROLE_ASSISTANT

ROOT = Path(__file__).resolve().parents[2]


def _chat(url: str, messages: list[dict], **extra: object) -> httpx.Response:
    body = {"model": "fake-model", "messages": messages, "logprobs": True, "top_logprobs": 0,
            "return_token_ids": True, **extra}
    return httpx.post(f"{url}/v1/chat/completions", content=orjson.dumps(body), timeout=30)


def test_lean_engine_chain_prompts_extend_the_previous_turn(tmp_path: Path) -> None:
    with procs.engine_proc("chain", 1024, tmp_path) as engine:
        first = [{"role": "system", "content": "s" * 400}, {"role": "user", "content": [{"type": "text", "text": "go"}]}]
        r1 = _chat(engine.url, first).json()
        prompt1, choice = r1["prompt_token_ids"], r1["choices"][0]
        assert prompt1[-1] == ROLE_ASSISTANT
        assert len(choice["token_ids"]) == 50 and choice["token_ids"][-1] == EOS
        assert [e["token"] for e in choice["logprobs"]["content"]] == [f"token_id:{t}" for t in choice["token_ids"]]
        assert all(e["logprob"] < 0 for e in choice["logprobs"]["content"])
        assert r1["usage"]["prompt_tokens"] == len(prompt1)
        call = choice["message"]["tool_calls"][0]
        echo = {"role": "assistant", "content": None, "tool_calls": [call]}
        second = first + [echo, {"role": "tool", "tool_call_id": call["id"], "content": "output " * 100}]
        prompt2 = _chat(engine.url, second).json()["prompt_token_ids"]
        assert prompt2[: len(prompt1) + 50] == prompt1 + choice["token_ids"]
        assert len(prompt2) > len(prompt1) + 50


def test_lean_engine_fixed_mode_and_bad_input(tmp_path: Path) -> None:
    with procs.engine_proc("fixed", 300, tmp_path) as engine:
        short = _chat(engine.url, [{"role": "user", "content": "hi"}]).json()
        long = _chat(engine.url, [{"role": "user", "content": "x" * 8000}]).json()
        assert len(short["prompt_token_ids"]) == 300 == len(long["prompt_token_ids"])
        assert httpx.post(f"{engine.url}/v1/chat/completions", content=b"{nope", timeout=10).status_code == 400
        assert httpx.post(f"{engine.url}/v1/chat/completions", json={"messages": []}, timeout=10).status_code == 400
        streamed = _chat(engine.url, [{"role": "user", "content": "hi"}], stream=True)
        got = loadgen.parse_sse(streamed.content)
        assert got["prompt_token_ids"] and got["message"]["tool_calls"][0]["function"]["name"] == "bash"


def test_loadgen_rejects_replies_a_broken_proxy_could_send() -> None:
    good = {"choices": [{"message": {"tool_calls": [{"id": "c1", "function": {"name": "bash", "arguments": "{}"}}]},
                         "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2},
            "prompt_token_ids": [1, 2, 3]}
    echo, prompt = loadgen.check_reply("recorder", orjson.dumps(good), stream=False)
    assert prompt == 3 and echo["tool_calls"][0]["id"] == "c1"
    with pytest.raises(loadgen.ReplyError, match="token_ids"):
        loadgen.check_reply("direct", orjson.dumps(good), stream=False)  # no choices[0].token_ids
    no_tool = {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]}
    with pytest.raises(loadgen.ReplyError, match="tool call"):
        loadgen.check_reply("recorder", orjson.dumps(no_tool), stream=False)
    with pytest.raises(loadgen.ReplyError, match="DONE"):
        loadgen.parse_sse(b'data: {"choices": []}\n\n')


def _run_quick(tmp_path: Path, targets: str, settings: str, long: str) -> tuple[list[dict], str, str]:
    out, page = tmp_path / "results.jsonl", tmp_path / "page.md"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--settings", settings, "--long", long,
         "--targets", targets, "--duration", "0.5", "--out", str(out), "--docs", str(page)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in out.read_text().splitlines()], done.stdout, page.read_text()


@pytest.mark.slow
def test_quick_path_measures_direct_and_recorder(tmp_path: Path) -> None:
    results, stdout, page = _run_quick(tmp_path, "direct,recorder", "chain:1024:2", "chain:1024:1:4")
    assert [(r["label"], r["target"]) for r in results] == [
        ("chain P=1k N=2", "direct"), ("chain P=1k N=2", "recorder"), ("chain P=1k N=2", "floor"),
        ("chain P=1k N=1 T=4", "direct"), ("chain P=1k N=1 T=4", "recorder"),
    ]  # the baseline proxy joins the matrix, not the long session
    for r in results:
        assert r["load"]["calls"] > 0 and r["load"]["errors"] == 0, r["load"]
        assert r["server"]["rss_end"] > 0 and r["server"]["cpu_ms_per_call"] >= 0
    recorder_cell = results[1]
    assert recorder_cell["store"]["records"] >= recorder_cell["load"]["calls"]  # pre-warm calls are stored too
    long = results[4]
    assert long["load"]["calls"] == 4 and len(long["load"]["per_call"]) == 4
    assert long["rss_settled"] > 0 and "settled" in page  # held memory, read after the trimmer ran
    assert long["readback"]["records"] == 4 and long["readback"]["fidelity"] == {"root": 1, "exact": 3}
    stored = long["store"]["session"]
    assert stored["total"] == stored["row_bytes"] + stored["blob_bytes"] > 0
    assert "| chain P=1k N=2 |" in stdout
    assert "## Targets" in page and "stored ≤ 3×" in page


@pytest.mark.slow
def test_quick_path_drives_openenv_capture(tmp_path: Path) -> None:
    results, _, page = _run_quick(tmp_path, "capture", "fixed:1024:2", "")
    assert len(results) == 1 and results[0]["target"] == "capture"
    assert results[0]["load"]["calls"] > 0 and results[0]["load"]["errors"] == 0
    assert "| fixed P=1k N=2 |" in page


@pytest.mark.slow
def test_the_floor_proxy_joins_non_streaming_settings_and_its_table_is_rendered(tmp_path: Path) -> None:
    results, stdout, page = _run_quick(tmp_path, "direct,recorder", "chain:1024:1,fixed:1024:2,chain:1024:2:20:stream", "")
    assert [(r["label"], r["target"]) for r in results] == [
        ("chain P=1k N=1", "direct"), ("chain P=1k N=1", "recorder"), ("chain P=1k N=1", "floor"),
        ("fixed P=1k N=2", "direct"), ("fixed P=1k N=2", "recorder"), ("fixed P=1k N=2", "floor"),
        ("chain P=1k N=2 stream", "direct"), ("chain P=1k N=2 stream", "recorder"),
    ]
    for floor in (results[2], results[5]):
        assert floor["load"]["calls"] > 0 and floor["load"]["errors"] == 0  # checked replies, like every target
    assert "## The hop itself" in page
    hop = page.split("## The hop itself", 1)[1].split("##", 1)[0]
    assert "| chain P=1k N=1 |" in hop and "| fixed P=1k N=2 |" in hop and "stream" not in hop


def test_the_floor_proxy_records_exact_ids_and_answers_without_engine_fields(tmp_path: Path) -> None:
    with procs.engine_proc("chain", 300, tmp_path) as engine, \
            procs.floor_proc(engine.url, tmp_path / "floor.log", tmp_path) as floor:
        key = httpx.post(f"{floor.url}/sessions", timeout=10).json()["session_id"]
        messages = [{"role": "user", "content": "go"}]
        prompts = []
        for _ in range(3):
            r = httpx.post(f"{floor.url}/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                           json={"model": "fake-model", "messages": messages}, timeout=10)
            assert r.status_code == 200, r.text
            reply = r.json()
            assert "prompt_token_ids" not in reply and "token_ids" not in reply["choices"][0]
            call = reply["choices"][0]["message"]["tool_calls"][0]
            messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": call["id"], "content": "ok"}]
            direct = _chat(engine.url, messages[:-2]).json()  # the same prompt, asked of the engine itself
            prompts.append(direct["prompt_token_ids"])
        assert httpx.post(f"{floor.url}/v1/chat/completions", json={"stream": True, "messages": messages},
                          timeout=10).status_code == 400
        assert httpx.get(f"{floor.url}/nowhere", timeout=10).status_code == 404
    frames = floor_proxy.read_frames(str(tmp_path / "floor.log"))
    assert [ids.tolist() for _, _, ids in frames] == prompts  # exactly the engine's prompt ids
    assert all(head["valid"] and head["key"] == f"Bearer {key}" for head, _, _ in frames)
    assert [orjson.loads(body)["messages"] for _, body, _ in frames][-1] == messages[:-2]


@pytest.mark.slow
def test_the_dialect_benchmark_drives_all_three_apis_through_the_recorder(tmp_path: Path, capsys) -> None:
    import bench_dialects

    out = tmp_path / "dialects.jsonl"
    assert bench_dialects.main(["--settings", "chain:1024:1:3:stream", "--duration", "1", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["dialect"] for r in rows] == ["chat", "responses", "anthropic"]
    for r in rows:  # every reply was checked: the dialect's terminal event, a tool call to continue from
        assert r["calls"] >= 3 and r["calls"] % 3 == 0 and r["n_errors"] == 0, r
        assert r["recorder_cpu_ms_per_call"] > 0
    assert "| chain P=1k N=1 T=3 stream | anthropic |" in capsys.readouterr().out


@pytest.mark.slow  # the benchmark at one and two recorders behind the router (~7 s)
def test_the_scale_out_benchmark_runs_one_and_two_recorders_behind_the_router(tmp_path: Path) -> None:
    import bench_scale_out

    out = tmp_path / "scale.json"
    bench_scale_out.main(["--sessions", "4", "--duration", "1", "--turns", "2", "--replicas", "2",
                          "--results", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert sorted(r["recorders"] for r in rows) == [1, 2]
    for row in rows:
        assert row["calls"] > 0 and row["errors"] == 0
        assert row["stored_bytes_per_call"] > 0 and row["recorder_cpu_ms_per_call"] > 0


@pytest.mark.slow  # builds a baseline tree from git and benchmarks both (~18 s)
def test_compare_trees_runs_a_baseline_tree_beside_this_one_and_prints_ratios(tmp_path: Path) -> None:
    """The tree comparison end to end, with this commit as its own baseline (a git archive of HEAD)."""
    out = tmp_path / "compare.jsonl"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "compare_trees.py"), "--baseline", "HEAD",
         "--settings", "chain:1024:2", "--long", "chain:1024:1:4", "--targets", "baseline,recorder",
         "--reps", "1", "--duration", "1", "--quiet-wait", "0", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    cells = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert sorted((c["label"], c["target"]) for c in cells) == sorted([
        ("chain P=1k N=2", "baseline"), ("chain P=1k N=2", "recorder"),
        ("chain P=1k N=1 T=4", "baseline"), ("chain P=1k N=1 T=4", "recorder")])
    assert all(c["load"]["calls"] > 0 and c["load"]["errors"] == 0 for c in cells)
    long = [c for c in cells if c["label"].endswith("T=4")]
    assert all(c["load"]["calls"] == 4 and c["samples"] and c["samples"][-1][2] > 0 for c in long), \
        "a long session's RSS and disk bytes are sampled"
    assert "this tree ÷ baseline `HEAD`: calls/s" in done.stdout
