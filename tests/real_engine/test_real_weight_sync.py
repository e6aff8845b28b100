"""A weight sync whose reload fails on the real vLLM, through the recorder's fence: a folder whose
safetensors file is corrupt makes vLLM's ``reload_weights`` raise after it has begun (its in-place
reload moves the layers off before it reads the files). The sync must put the base weights back
and resume at the old version: vLLM's own ``/weight_checker`` checksums are the base model's again,
and the next agent call is served, and recorded, at the old version.

The engine is the tier's shared vLLM: whatever happens, it is left resumed on its base weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from real_stack import MODEL, RealStack
from openenv_harness.engine import VLLMServer
from openenv_harness.trainer.weight_sync import DiskWeightSync, SyncRolledBack

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


def _checksums(url: str) -> dict[str, str]:
    resp = httpx.post(url + "/weight_checker", json={"action": "checksum"}, timeout=120)
    resp.raise_for_status()
    return resp.json()["checksums"]


@pytest.fixture
def base_stack(tmp_path: Path, vllm: VLLMServer) -> Iterator[tuple[RealStack, dict[str, str]]]:
    """A recorder in front of the shared vLLM, and the base weights' checksums (read first)."""
    base = _checksums(vllm.url)
    stack = RealStack(tmp_path / "records.db", vllm.url)
    try:
        yield stack, base
    finally:
        httpx.post(vllm.url + "/resume", timeout=60).raise_for_status()  # never left paused for the tests after
        if _checksums(vllm.url) != base:
            DiskWeightSync(stack.admin, vllm.url).reload(vllm.settings.model_dir)
        stack.close()


def test_a_reload_vllm_refuses_is_rolled_back_to_the_base_weights(base_stack: tuple[RealStack, dict[str, str]],
                                                                   vllm: VLLMServer, tmp_path: Path,
                                                                   record_property) -> None:
    real_stack, base = base_stack
    corrupt = tmp_path / "policy-corrupt"
    corrupt.mkdir()
    (corrupt / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")  # a header that is no header
    real_stack.admin.set_policy_version(6)
    sync = DiskWeightSync(real_stack.admin, vllm.url, base_weights=vllm.settings.model_dir)
    with pytest.raises(SyncRolledBack) as raised:
        sync.sync(corrupt, version_before=6)
    report = raised.value.report
    record_property("failed_sync", json.dumps({"phases": report.phases, "error": report.error}))
    print("failed sync:", report)
    assert "/collective_rpc answered 500" in (report.error or ""), report.error
    assert (report.outcome, report.version_after) == ("rolled_back", 6)
    assert report.engine_weights == str(Path(vllm.settings.model_dir).resolve())
    assert report.engine_weight_version is not None  # read back from vLLM's /weight_info
    fence = real_stack.admin.health()["fence"]
    assert (fence["policy_version"], fence["paused"]) == (6, False)
    assert httpx.get(vllm.url + "/is_paused", timeout=30).json() == {"is_paused": False}
    assert _checksums(vllm.url) == base  # vLLM serves the base model's weights, every tensor of them
    # an agent call after it: served by the base weights, recorded at the old version
    sid, secret = real_stack.session()
    reply = real_stack.chat(sid, secret, {"model": MODEL, "tools": TOOLS, "max_tokens": 8, "temperature": 0,
                                          "messages": [{"role": "user", "content": "List the files."}]})
    assert reply.status_code == 200, reply.text
    [record] = real_stack.admin.records(sid)
    md = record["metadata"]
    assert (md["status"], md["policy_version_start"], md["policy_version_end"], md["straddled_sync"]) == (
        "ok", 6, 6, False)
