"""``examples/trl_async_grpo.py`` without a GPU: every part that does not need vLLM or a model, run for real.

The reference engine stands in for vLLM (configured to parse tool-call arguments as vLLM does);
the example's own builders make the recorder, the session factory, the dataset, TRL's worker
arguments and config, and TRL's harness loop then runs a real Pi rollout through that wiring.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Iterator

import httpx
import pytest

from openenv_harness.recorder import RecorderClient, free_port
from openenv_harness.rollout import BUILTIN_TASKS, TRLSessionFactory
from openenv_harness.testing.engine import (
    EngineConfig, EngineServer, Script, ToolCallSpec, Turn, reference_template, reference_tokenizer,
)
from openenv_harness.trainer import template_fingerprint

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
pytest.importorskip("trl")

pytestmark = pytest.mark.compat

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_async_grpo.py"
MODEL = "ref-example-model"


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trl_async_grpo_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def vllm_like_engine() -> Iterator[EngineServer]:
    """The reference engine rendering tool-call arguments the way vLLM does (parsed, then ``tojson``)."""
    with EngineServer(EngineConfig(tool_arguments="parsed")) as engine:
        yield engine


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The engine's vocabulary with TRL's Qwen3 template (TRL's loop accepts only templates it knows)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast
    from trl.chat_template_utils import qwen3_chat_template

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(reference_tokenizer().to_json()),
                                  eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = qwen3_chat_template
    return tok


def spaced_reference_script(task_id: str) -> Script:
    """The task's solution with object arguments sampled as vLLM renders them back (``tojson``),
    so the agent's compact replay re-renders to the very tokens sampled."""
    turns = []
    for turn in BUILTIN_TASKS[task_id].reference_script:
        calls = [ToolCallSpec(name=c["name"], arguments=json.loads(c["arguments"]) if isinstance(c["arguments"], str)
                              else c["arguments"]) for c in turn.get("tool_calls", [])]
        turns.append(Turn(content=turn.get("content"), tool_calls=calls))
    return Script(turns=turns, arguments_format="spaced")


def test_vllm_command_carries_the_flags_the_recorder_and_trl_need(example: ModuleType) -> None:
    cfg = example.ExampleConfig(served_template_path="/srv/train.jinja")
    env, argv = example.vllm_serve_command(cfg)
    assert env == {"VLLM_SERVER_DEV_MODE": "1"}
    assert argv[:3] == ["vllm", "serve", cfg.model]
    assert "--return-tokens-as-token-ids" in argv and "--enable-auto-tool-choice" in argv

    def value(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert value("--logprobs-mode") == "processed_logprobs"
    assert value("--tool-call-parser") == "hermes" and value("--reasoning-parser") == "qwen3"
    assert json.loads(value("--weight-transfer-config")) == {"backend": "nccl"}
    assert value("--chat-template") == "/srv/train.jinja" and value("--port") == "8000"
    _, plain = example.vllm_serve_command(example.ExampleConfig(reasoning_parser=None))
    assert "--reasoning-parser" not in plain and "--chat-template" not in plain


def test_print_commands_needs_no_model_and_no_network(example: ModuleType, capsys: pytest.CaptureFixture) -> None:
    assert example.main(["--print-commands", "--harness", "opencode", "--admin-token", "tok-123"]) == 0
    out = capsys.readouterr().out
    assert "VLLM_SERVER_DEV_MODE=1 vllm serve Qwen/Qwen3-1.7B" in out
    assert "-m openenv_harness.recorder --engine-url http://127.0.0.1:8000" in out and "--admin-token tok-123" in out
    run_line = [line for line in out.splitlines() if "trl_async_grpo.py" in line][0]
    assert "OEH_ADMIN_TOKEN=tok-123" in run_line and "--harness opencode" in run_line
    assert "--print-commands" not in run_line


def test_the_printed_recorder_command_fronts_the_engine_and_verifies_the_template(
        example: ModuleType, vllm_like_engine: EngineServer, tokenizer: Any, tmp_path: Path) -> None:
    port = free_port()
    # a token that starts with "-", as one in 64 generated tokens does: still one argument
    cfg = example.ExampleConfig(vllm_port=vllm_like_engine.port, recorder_port=port, store=str(tmp_path / "r.db"),
                                admin_token="-" + "t" * 31)
    proc = subprocess.Popen(example.recorder_command(cfg), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        # a session with a trainer's fingerprint has the served template fingerprinted again first (three
        # /tokenize calls to the engine): seconds on a loaded machine, so no short client timeout
        with RecorderClient(cfg.in_process_recorder_url, cfg.admin_token, timeout_s=60) as admin:
            deadline = time.monotonic() + 60
            while True:
                try:
                    health = admin.health()
                    break
                except httpx.HTTPError:
                    assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                    assert time.monotonic() < deadline, "the recorder process did not come up"
                    time.sleep(0.2)
            served = health["engine"]["template_fingerprint"]
            # the trainer-side fingerprint the example computes (default: parse tool arguments like vLLM)
            assert template_fingerprint(tokenizer, chat_template=reference_template().source) == served
            assert admin.create_session(trainer_template_fingerprint=served)["template_status"] == "verified"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_the_example_wiring_trains_a_real_pi_rollout_through_trls_loop(
        example: ModuleType, vllm_like_engine: EngineServer, tokenizer: Any, tmp_path: Path) -> None:
    from openenv_harness.harnesses.install import ensure_installed
    from trl.experimental.async_grpo.openenv_harness import _HarnessRolloutLoop
    from trl.experimental.async_grpo.vllm_client import VLLMClient

    ensure_installed(["pi"])
    vllm_like_engine.set_script(MODEL, spaced_reference_script("fix-add"))
    cfg = example.ExampleConfig(model=MODEL, harness="pi", tasks=("fix-add",), vllm_port=vllm_like_engine.port,
                                recorder_port=free_port(), store=str(tmp_path / "records.db"), num_generations=2)
    with example.build_recorder(cfg) as recorder:
        assert recorder.url == cfg.in_process_recorder_url and recorder.config.engine_url == vllm_like_engine.url
        fingerprint = template_fingerprint(tokenizer, chat_template=reference_template().source)
        factory = example.build_session_factory(cfg, recorder.url, fingerprint)
        assert isinstance(factory, TRLSessionFactory) and pickle.loads(pickle.dumps(factory)) == factory
        dataset = example.build_dataset(cfg.tasks)
        kwargs = example.rollout_worker_kwargs(cfg, tokenizer, dataset, factory)
        kwargs = pickle.loads(pickle.dumps(kwargs))  # what TRL's worker checks before spawning its child
        with pytest.raises(ImportError, match="vLLM"):  # TRL's real worker class, which needs vLLM installed
            example.build_rollout_worker(kwargs)

        from accelerate.state import PartialState

        PartialState()
        loop = _HarnessRolloutLoop(**kwargs, rollout_buffer=None, model_version_value=None, heartbeat_value=None,
                                   failed_event=None, exception_info_queue=None, metrics_queue=None)
        try:
            (completion, completion_ids, rows, tool_calls, _, reward), metrics = loop._run_session(
                dataset[0]["prompt"], 0)
        finally:
            loop._session_pool.shutdown(wait=True)
            loop._tool_pool.shutdown(wait=True)
            loop._loop.close()
        assert reward == 1.0 and tool_calls == 3
        assert len(rows) == 1 and metrics["tally"]["clean"] == 3.0  # vLLM-style rendering keeps the chain CLEAN
        sampled = [r["sampled"] for r in vllm_like_engine.requests(MODEL) if "sampled" in r]
        assert completion_ids == [i for s in sampled for i in s["token_ids"]]
        assert rows[0].input_ids == sampled[-1]["prompt_token_ids"] + sampled[-1]["token_ids"]
        with RecorderClient(recorder.url, cfg.admin_token) as admin:
            session = [s for s in admin.sessions() if s["metadata"].get("run") == Path(cfg.output_dir).name][-1]
            assert session["template_status"] == "verified"  # the served template is the trainer's
            assert session["budgets"] == cfg.budgets

        # the trainer's weight-sync fence, through the example's recorder, on the engine's /pause and /resume
        trainer = SimpleNamespace(vllm_client=VLLMClient(vllm_like_engine.url), weight_transfer=None, model_version=0)
        fenced = example.install_recorder_fence(trainer, recorder.url, cfg.admin_token)
        trainer.vllm_client.pause()
        assert vllm_like_engine.is_paused()
        trainer.vllm_client.resume()
        assert not vllm_like_engine.is_paused() and fenced.policy_version() == 1
        fenced.close()


def test_wait_for_engine(example: ModuleType, vllm_like_engine: EngineServer) -> None:
    started = time.monotonic()
    example.wait_for_engine(vllm_like_engine.url, timeout_s=5)
    assert time.monotonic() - started < 5
    with pytest.raises(TimeoutError, match="no engine answered"):
        example.wait_for_engine(f"http://127.0.0.1:{free_port()}", timeout_s=0.1)


def test_trls_async_grpo_is_found_on_the_installed_path(example: ModuleType) -> None:
    """TRL 1.16 (what installs here) has AsyncGRPO only under experimental: the stable path of 1.18 is tried
    first and falls through to it."""
    import trl
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    config, trainer, where = example.async_grpo()
    if trl.__version__.startswith("1.16"):
        assert (config, trainer, where) == (AsyncGRPOConfig, AsyncGRPOTrainer, "trl.experimental.async_grpo")
    else:
        assert where == "trl.trainer.async_grpo_trainer" and config.__name__ == "AsyncGRPOConfig"


def test_config_and_dataset(example: ModuleType, tmp_path: Path) -> None:
    from openenv.core.harness.capture.upstream import training_sampling

    cfg = example.ExampleConfig(output_dir=str(tmp_path / "out"), num_generations=4, max_steps=7)
    config = example.build_config(cfg, bf16=False)  # bf16 mixed precision needs a GPU
    assert config.vllm_server_base_url == "http://127.0.0.1:8000"  # weight sync talks to vLLM, not the recorder
    assert (config.num_generations, config.max_steps, config.weight_sync_steps) == (4, 7, 1)
    assert (config.temperature, config.top_p, config.top_k, config.dtype) == (1.0, 1.0, 0, "bfloat16")
    # the loop-owning worker turns these into the sampling it pins on every agent call: it must be accepted
    assert training_sampling({"temperature": config.temperature, "top_p": config.top_p, "top_k": config.top_k,
                              "repetition_penalty": config.repetition_penalty})["temperature"] == 1.0
    dataset = example.build_dataset(["fix-add", "write-greeting"])
    assert dataset["prompt"] == [[{"role": "user", "content": t}] for t in ("fix-add", "write-greeting")]
    with pytest.raises(ValueError, match="unknown task ids"):
        example.build_dataset(["no-such-task"])


def test_serving_trls_training_template(example: ModuleType, tokenizer: Any, tmp_path: Path) -> None:
    from trl.chat_template_utils import qwen3_training_chat_template

    path = tmp_path / "served.jinja"
    text = example.write_served_template(tokenizer, path)
    assert text == qwen3_training_chat_template == path.read_text()
    # the trainer's fingerprint follows what vLLM will serve, not the tokenizer's stock template
    assert template_fingerprint(tokenizer, chat_template=text) != template_fingerprint(tokenizer)
    tokenizer_ok = type(tokenizer)(tokenizer_object=tokenizer.backend_tokenizer, eos_token="<|im_end|>")
    tokenizer_ok.chat_template = qwen3_training_chat_template
    assert example.write_served_template(tokenizer_ok, tmp_path / "none.jinja") is None
    assert not (tmp_path / "none.jinja").exists()
