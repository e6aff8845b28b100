"""An incremental Pi rollout on the real vLLM (--enable-scale-out): exact chains where full history drifts.

With ``tool_choice: "required"`` pinned, this stack drifts at every tool turn in full history (the
grammar makes the model sample the ``<tool_call>`` tag as text pieces; the template re-renders it as
the special id, ``test_real_rollouts.py``). In incremental mode the engine continues from the exact
ids it sampled: every transition is exact, TRL's reconciler sees only CLEAN transitions and trains
every sampled token in one row; the records say where vLLM's own full render would have differed.
"""

from __future__ import annotations

import pytest

from incremental_checks import assert_one_exact_chain, run_incremental_pi
from real_stack import RealStack

pytestmark = [pytest.mark.real_engine, pytest.mark.cli, pytest.mark.compat, pytest.mark.slow]


def test_an_incremental_pi_rollout_is_one_exact_chain(stack: RealStack) -> None:
    _, agent, trace = run_incremental_pi(stack)
    assert_one_exact_chain(agent, trace, "real-incremental")
