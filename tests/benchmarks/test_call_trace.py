"""``benchmarks/call_trace.py`` counts what one call runs through, and only the recorder's own code.

No counts are asserted as targets (they are measurements, in ``docs/benchmarks.md``): the test holds
the method -- the hook sees the steps of each call's path, sees nothing outside the package, and is
off again once the call is answered.
"""

from __future__ import annotations

import call_trace


def test_each_call_is_traced_through_its_own_steps_and_nothing_else() -> None:
    result = call_trace.measure()
    for case in call_trace.CASES:
        files = result[case]["file_list"]
        assert all(f.startswith("openenv_harness/") for f in files), files
        assert {"openenv_harness/recorder/call/pipeline.py", "openenv_harness/recorder/call/record.py"} <= set(files)
        assert result[case]["files"] == len(files) and result[case]["functions"] > result[case]["files"]
        assert not any("/testing/" in f for f in files)  # the reference engine runs on its own thread
    assert "openenv_harness/recorder/dialects/anthropic.py" in result["anthropic"]["file_list"]
    assert "openenv_harness/recorder/dialects/anthropic.py" not in result["chat"]["file_list"]
    assert "openenv_harness/recorder/prompt_modes/incremental.py" in result["incremental"]["file_list"]
