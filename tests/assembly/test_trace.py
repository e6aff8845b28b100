import subprocess
import sys

import pytest
from pydantic import ValidationError

from openenv_harness.assembly import HarnessTrace, assemble_session


def _metadata() -> dict:
    return {
        "chain_id": 0,
        "sample_index": 0,
        "strategy": "split",
        "node_ids": ["s/0"],
        "segments": [{"node_id": "s/0", "offset": 0, "length": 1, "trainable_tokens": 1}],
        "trainable_tokens": 1,
    }


def test_trace_is_strict_about_token_types() -> None:
    good = {
        "prompt_ids": [1, 2],
        "response_ids": [3],
        "loss_mask": [1],
        "response_logprobs": [-0.1],
        "metadata": _metadata(),
    }
    trace = HarnessTrace.model_validate(good)
    assert trace.reward is None and trace.input_ids == [1, 2, 3] and trace.trainable_tokens == 1
    for field, bad in [("loss_mask", [True]), ("response_ids", ["3"]), ("prompt_ids", [1.0, 2.0])]:
        with pytest.raises(ValidationError):
            HarnessTrace.model_validate({**good, field: bad})
    with pytest.raises(ValidationError):
        HarnessTrace.model_validate({**good, "metadata": {**_metadata(), "strategy": "merge"}})


def test_trace_survives_a_json_round_trip(toy) -> None:
    p0 = toy.render([("user", [21])])
    (trace,) = assemble_session([toy.record(p0, [100, toy.EOT], call_index=0)], reward=0.5).traces
    again = HarnessTrace.model_validate_json(trace.model_dump_json())
    assert again == trace and again.reward == 0.5 and again.metadata.segments[0].node_id == "sess/0"


def test_assembly_imports_neither_the_recorder_nor_openenv() -> None:
    code = (
        "import sys, openenv_harness.assembly\n"
        "banned = ('openenv_harness.recorder', 'openenv_harness.testing', 'openenv.')\n"
        "bad = [m for m in sys.modules if m.startswith(banned) or m == 'openenv']\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
