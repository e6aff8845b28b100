"""The real Pi and OpenCode CLIs complete a tool episode against the reference engine.

Their echo of the first turn must extend the first prompt token for token (arguments re-rendered
by vLLM's parse + ``tojson``, reasoning sent back): the property every clean chain in a recorder
test relies on. The CLIs are the project's own pinned installs (``ensure_installed``: the prefix
``./dev setup`` fills, installed on first use), so this runs wherever the suite runs.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from openenv_harness.harnesses.install import ensure_installed
from openenv_harness.testing.engine import EngineServer, Script, ToolCallSpec, Turn
from openenv_harness.testing.engine.messages import prepare_messages, prepare_tools
from openenv_harness.testing.engine.policy import sampled_text
from openenv_harness.testing.engine.template import reference_template
from openenv_harness.testing.engine.tokenizer import reference_tokenizer

PROMPT = "Run the shell command 'echo hi' and tell me what it printed."
SCRIPT = Script(turns=[Turn(reasoning="I should run it.",
                            tool_calls=[ToolCallSpec(name="bash", arguments={"command": "echo hi"})]),
                       Turn(content="It printed hi.")])

pytestmark = [pytest.mark.cli, pytest.mark.slow]


@pytest.fixture(scope="module")
def cli_paths() -> dict[str, Path]:
    return ensure_installed(["pi", "opencode"])


def _home_env(run: Path) -> dict[str, str]:
    home = run / "home"
    return {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": f"{home}/.config",
            "XDG_DATA_HOME": f"{home}/.local/share", "XDG_CACHE_HOME": f"{home}/.cache",
            "XDG_STATE_HOME": f"{home}/.local/state", "ROLLOUT_API_KEY": "sk-reference"}


def _run_opencode(binary: Path, base_url: str, run: Path, work: Path) -> subprocess.CompletedProcess[str]:
    model = {"name": "reference-model", "tool_call": True, "reasoning": False,
             "limit": {"context": 32768, "output": 4096}}
    config = {"provider": {"ref": {"npm": "@ai-sdk/openai-compatible", "name": "ref",
                                   "options": {"baseURL": base_url, "apiKey": "{env:ROLLOUT_API_KEY}"},
                                   "models": {"reference-model": model}}},
              "model": "ref/reference-model", "small_model": "ref/reference-model", "autoupdate": False,
              "share": "disabled", "snapshot": False, "agent": {"title": {"disable": True}},
              "compaction": {"auto": False}, "tools": {"webfetch": False}}
    env = _home_env(run)
    env.update({f"OPENCODE_DISABLE_{name}": "1" for name in (
        "AUTOUPDATE", "SHARE", "MODELS_FETCH", "LSP_DOWNLOAD", "DEFAULT_PLUGINS", "CLAUDE_CODE",
        "EXTERNAL_SKILLS", "PROJECT_CONFIG")})
    env["OPENCODE_CONFIG_CONTENT"] = json.dumps(config)
    plugin_dir = run / "home/.config/opencode"
    (plugin_dir / "node_modules").mkdir(parents=True)
    (plugin_dir / "package.json").write_text('{"dependencies":{"@opencode-ai/plugin":"*"}}')
    (plugin_dir / "package-lock.json").write_text('{"packages":{"":{"dependencies":{"@opencode-ai/plugin":"*"}}}}')
    return subprocess.run([str(binary), "run", "--format", "json"], input=PROMPT, cwd=work, env=env,
                          capture_output=True, text=True, timeout=180)


def _run_pi(binary: Path, base_url: str, run: Path, work: Path) -> subprocess.CompletedProcess[str]:
    agent = run / "agent"
    agent.mkdir()
    model = {"id": "reference-model", "reasoning": False, "input": ["text"], "contextWindow": 32768, "maxTokens": 4096}
    compat = {"supportsDeveloperRole": False, "supportsStore": False, "maxTokensField": "max_tokens"}
    (agent / "models.json").write_text(json.dumps({"providers": {"ref": {
        "baseUrl": base_url, "api": "openai-completions", "apiKey": "ROLLOUT_API_KEY", "compat": compat,
        "models": [model]}}}))
    (agent / "settings.json").write_text(json.dumps({
        "defaultProvider": "ref", "defaultModel": "reference-model", "quietStartup": True,
        "enableInstallTelemetry": False, "compaction": {"enabled": False},
        "retry": {"enabled": False, "provider": {"maxRetries": 0, "timeoutMs": 600000}}}))
    env = {**_home_env(run), "PI_CODING_AGENT_DIR": str(agent), "PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1",
           "PI_TELEMETRY": "0"}
    return subprocess.run([str(binary), "-p", "--model", "ref/reference-model", "--no-session", PROMPT],
                          cwd=work, env=env, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("runner", [_run_opencode, _run_pi], ids=["opencode", "pi"])
def test_cli_episode_extends_the_prompt_token_for_token(runner, engine: EngineServer, tmp_path: Path,
                                                         cli_paths: dict[str, Path]) -> None:
    name = "opencode" if runner is _run_opencode else "pi"
    engine.set_script("*", SCRIPT)
    work = tmp_path / "work"
    work.mkdir()
    result = runner(cli_paths[name], engine.url + "/v1", tmp_path, work)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "It printed hi." in result.stdout
    agent_calls = [r["body"] for r in engine.requests() if r["body"].get("tools")]
    assert len(agent_calls) == 2 and all(r["stream"] for r in agent_calls)
    template, tok = reference_template(), reference_tokenizer()
    first, second = (template.render(prepare_messages(b["messages"]), prepare_tools(b["tools"]),
                                     add_generation_prompt=True) for b in agent_calls)
    sampled = sampled_text(template, SCRIPT.turns[0], SCRIPT.arguments_format)
    held = tok.encode(first) + tok.encode(sampled)
    assert tok.encode(second)[: len(held)] == held
    logged = [r["sampled"] for r in engine.requests() if r["body"].get("tools")]
    assert logged[1]["prompt_token_ids"][: len(held)] == held  # what the engine itself rendered
