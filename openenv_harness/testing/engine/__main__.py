"""``python -m openenv_harness.testing.engine``: run the reference engine as its own process.

Prints one line ``READY http://HOST:PORT`` on stdout once it accepts connections (port 0 picks a
free port), so a parent process can start it and read where it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import uvicorn

from openenv_harness.testing.engine.app import create_engine_app
from openenv_harness.testing.engine.config import EngineConfig, GenerationConfig
from openenv_harness.testing.engine.policy import Script
from openenv_harness.testing.engine.protocol import engine_protocol_class
from openenv_harness.testing.engine.server import bind_socket


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m openenv_harness.testing.engine",
                                     description="A CPU reference engine speaking vLLM's OpenAI wire format.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--served-model-name", default="reference-model")
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--tokenizer", type=Path,
                        help="A model folder (its tokenizer.json, chat template, special tokens) or a tokenizer.json")
    parser.add_argument("--chat-template", type=Path, help="Serve this Hugging Face chat template (a .jinja file)")
    parser.add_argument("--generation-config", type=Path,
                        help="A generation_config.json (or a model folder): sampling defaults for absent fields")
    parser.add_argument("--tool-call-parser", choices=["hermes", "qwen3_xml"], default="hermes")
    parser.add_argument("--reasoning-parser", choices=["think", "none"], default="think")
    parser.add_argument("--reasoning-field", choices=["reasoning", "reasoning_content"], default="reasoning")
    parser.add_argument("--reasoning-content", choices=["rename", "drop"], default="rename",
                        help="What the chat route does with a replayed reasoning_content (vLLM 0.32: rename)")
    parser.add_argument("--return-tokens-as-token-ids", action="store_true")
    parser.add_argument("--logprobs-mode", choices=["raw_logprobs", "processed_logprobs"], default="raw_logprobs")
    parser.add_argument("--tool-arguments", choices=["verbatim", "parsed"], default="parsed")
    parser.add_argument("--strict-model-name", action="store_true")
    parser.add_argument("--decode-delay-s", type=float, default=0.0)
    parser.add_argument("--prefill-delay-s", type=float, default=0.0)
    parser.add_argument("--max-recorded-requests", type=int, default=1000)
    parser.add_argument("--vllm-version", choices=["0.32", "0.33", "0.34"], default="0.32",
                        help="Speak this vLLM release's semantics (one-step parse, refusing pause, empty tools, "
                        "chat weight-version spans)")
    parser.add_argument("--family", choices=["vllm", "sglang"], default="vllm",
                        help="Serve vLLM's routes and shapes, or SGLang 0.5.23's (/generate, /v1/chat/completions "
                        "with meta_info, /pause_generation, /update_weights_from_disk, ...)")
    parser.add_argument("--generate-derender", action="store_true",
                        help="vLLM 0.33: render answers a parse_context, generate takes output_mode='derender' "
                        "(implied by --vllm-version 0.33 and 0.34)")
    parser.add_argument("--no-dev-mode", action="store_true", help="Do not serve /pause, /resume, /is_paused "
                        "and the weight routes (/collective_rpc, /reset_prefix_cache, /update_weight_version, "
                        "/weight_info)")
    parser.add_argument("--script", type=Path, help="JSON file with the default Script")
    parser.add_argument("--builtin-tasks", action="store_true",
                        help="Serve the built-in tasks' scripted solutions by model name (reference/<task>, "
                        "reference/<task>/<shell tool>), so `openenv-harness run --recorder-url` can drive real agents")
    return parser.parse_args(argv)


def _builtin_scripts() -> dict[str, Script]:
    from openenv_harness.rollout.taskset import builtin_task_scripts

    return {name: Script(turns=turns) for name, turns in builtin_task_scripts().items()}


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    default_script = Script()
    if args.script is not None:
        default_script = Script.model_validate(json.loads(args.script.read_text(encoding="utf-8")))
    config = EngineConfig(
        served_model_name=args.served_model_name,
        max_model_len=args.max_model_len,
        tokenizer=args.tokenizer,
        chat_template=args.chat_template,
        generation_config=GenerationConfig.from_file(args.generation_config) if args.generation_config else None,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=None if args.reasoning_parser == "none" else args.reasoning_parser,
        reasoning_field=args.reasoning_field,
        reasoning_content=args.reasoning_content,
        return_tokens_as_token_ids=args.return_tokens_as_token_ids,
        logprobs_mode=args.logprobs_mode,
        tool_arguments=args.tool_arguments,
        strict_model_name=args.strict_model_name,
        decode_delay_s=args.decode_delay_s,
        prefill_delay_s=args.prefill_delay_s,
        max_recorded_requests=args.max_recorded_requests,
        vllm_version=args.vllm_version,
        family=args.family,
        **({"generate_derender": True} if args.generate_derender else {}),
        dev_mode=not args.no_dev_mode,
        default_script=default_script,
        scripts=_builtin_scripts() if args.builtin_tasks else {},
    )
    sock = bind_socket(args.host, args.port)
    server = uvicorn.Server(uvicorn.Config(create_engine_app(config), log_level="warning", access_log=False,
                                           lifespan="off", timeout_graceful_shutdown=1,
                                           http=engine_protocol_class() or "auto"))

    async def _announce_when_started() -> None:
        while not server.started:
            await asyncio.sleep(0.01)
        host, port = sock.getsockname()[:2]
        print(f"READY http://{host}:{port}", flush=True)

    async def _serve() -> None:
        announcer = asyncio.ensure_future(_announce_when_started())
        try:
            await server.serve(sockets=[sock])
        finally:
            announcer.cancel()

    # the loop uvicorn itself would run (uvloop where installed), as EngineServer's thread does:
    # with the plain asyncio loop a keep-alive POST was answered ~40 ms late on loopback (measured;
    # the delayed-ACK pattern), which made every benchmark against this process meaningless
    factory = server.config.get_loop_factory()
    if factory is None:
        asyncio.run(_serve())
    else:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(_serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
