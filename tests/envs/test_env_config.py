"""The server's ``OEH_*`` configuration: defaults, deployments, and errors that name the variable."""

from __future__ import annotations

import pytest
from harness_env.server.config import ConfigError, EnvServerConfig


def test_nothing_set_is_the_embedded_deployment() -> None:
    config = EnvServerConfig.from_environ({})
    assert config.mode == "embedded"
    assert config.harness == "pi" and config.max_concurrent_envs == 4
    assert config.budgets() == {"max_wall_clock_s": 600.0, "max_agent_calls": 30}
    assert config.default_step_timeout_s == 630.0


def test_variables_are_read_and_empty_ones_count_as_unset() -> None:
    config = EnvServerConfig.from_environ({
        "OEH_ENGINE_URL": "http://gpu:8000", "OEH_MODEL": "Qwen/Qwen3-8B", "OEH_HARNESS": "opencode",
        "OEH_MAX_CONCURRENT_ENVS": "8", "OEH_MAX_TOTAL_TOKENS": "200000", "OEH_MAX_WALL_CLOCK_S": "120",
        "OEH_STEP_TIMEOUT_S": "90", "OEH_RECORDER_URL": "", "OEH_ADMIN_TOKEN": "  ",
    })
    assert config.mode == "engine" and config.model == "Qwen/Qwen3-8B" and config.harness == "opencode"
    assert config.max_concurrent_envs == 8 and config.default_step_timeout_s == 90.0
    assert config.budgets() == {"max_wall_clock_s": 120.0, "max_agent_calls": 30, "max_total_tokens": 200000}
    assert config.recorder_url is None and config.admin_token is None


def test_external_recorder_deployment() -> None:
    config = EnvServerConfig.from_environ({"OEH_RECORDER_URL": "http://trainer:8765", "OEH_MODEL": "m",
                                           "OEH_ADMIN_TOKEN": "x" * 20})
    assert config.mode == "external-recorder"


def _several(**environ: str) -> dict[str, str]:
    """An external-recorder deployment over two recorders, with ``environ`` on top."""
    return {"OEH_RECORDER_URL": "http://a:1,http://b:2", "OEH_MODEL": "m", "OEH_ADMIN_TOKEN": "x" * 20, **environ}


def test_several_external_recorders_are_read_in_order() -> None:
    config = EnvServerConfig.from_environ(_several(OEH_RECORDER_URL=" http://a:1/ , http://b:2",
                                                   OEH_AGENT_RECORDER_URL="http://ta:1,http://tb:2"))
    assert config.mode == "external-recorder"
    assert config.recorder_urls == ["http://a:1", "http://b:2"]
    assert EnvServerConfig.from_environ(_several(OEH_RECORDER_URL="http://only:1")).recorder_urls == ["http://only:1"]


@pytest.mark.parametrize(("environ", "message"), [
    ({"OEH_ENGINE_URL": "http://gpu:8000"}, "need OEH_MODEL"),
    ({"OEH_RECORDER_URL": "http://trainer:8765", "OEH_MODEL": "m"}, "OEH_RECORDER_URL needs OEH_ADMIN_TOKEN"),
    ({"OEH_RECORDER_URL": "http://r", "OEH_ENGINE_URL": "http://e", "OEH_MODEL": "m", "OEH_ADMIN_TOKEN": "x" * 20},
     "not both"),
    ({"OEH_MAX_CONCURRENT_ENVS": "many"}, "OEH_MAX_CONCURRENT_ENVS: Input should be a valid integer"),
    ({"OEH_MAX_CONCURRENT_ENVS": "0"}, "OEH_MAX_CONCURRENT_ENVS: Input should be greater than or equal to 1"),
    ({"OEH_ADMIN_TOKEN": "short"}, "OEH_ADMIN_TOKEN: String should have at least 16 characters"),
    ({"OEH_MAX_WALL_CLOCK_S": "-5"}, "OEH_MAX_WALL_CLOCK_S"),
    (_several(OEH_RECORDER_URL="http://a:1,,http://b:2"), "OEH_RECORDER_URL: '' is not an http"),
    (_several(OEH_RECORDER_URL="http://a:1,b:2"), "OEH_RECORDER_URL: 'b:2' is not an http"),
    (_several(OEH_RECORDER_URL="http://a:1,http://a:1/"), "OEH_RECORDER_URL names the same recorder twice"),
    (_several(OEH_AGENT_RECORDER_URL="http://tunnel:1"),
     "OEH_AGENT_RECORDER_URL lists 1 URL\\(s\\) for 2 recorder\\(s\\)"),
    (_several(OEH_RECORDER_PUBLIC_URL="http://p:1,http://p:2,http://p:3"),
     "OEH_RECORDER_PUBLIC_URL lists 3 URL\\(s\\) for 2 recorder\\(s\\)"),
])
def test_bad_configuration_names_the_variable(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EnvServerConfig.from_environ(environ)


def test_overrides_win_over_the_environment() -> None:
    config = EnvServerConfig.from_environ({"OEH_HARNESS": "opencode"}, harness="pi")
    assert config.harness == "pi"
