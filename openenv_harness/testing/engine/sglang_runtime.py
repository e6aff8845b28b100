"""What the SGLang flavour adds to the engine's shared state: SGLang's pause modes, its in-flight
requests (which a pause, a weight update or a version change acts on), and sampling one scripted turn.

Why over the same ``Fence`` and ``LoadedWeights`` as the vLLM flavour: a weight sync must change what is
served, and when a request straddles it, the same way whichever engine family a test drives. SGLang's
modes map onto the fence: ``abort`` ends in-flight requests now (``finish_reason`` abort) and holds new
ones until ``/continue_generation``; ``in_place`` freezes in-flight requests where they are; ``retract``
also freezes them, counting a retraction on each (SGLang re-queues and recomputes them; with the
deterministic script the tokens are the same). New requests are held in every mode, as SGLang's tokenizer
manager holds them while ``is_pause``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

from openenv_harness.testing.engine.fence import Generation as FenceSlot
from openenv_harness.testing.engine.policy import Script, TurnChoice, as_reported, logprob_scale, sample_turn
from openenv_harness.testing.engine.sglang_wire import Generation
from openenv_harness.testing.engine.state import EngineState

SGLANG_VERSION = "0.5.23"
#: SGLang's names for the engine's parsers (its ``--tool-call-parser`` / ``--reasoning-parser`` values)
TOOL_PARSER_NAMES = {"hermes": "qwen25", "qwen3_xml": "qwen3_coder"}
REASONING_PARSER_NAMES = {"think": "qwen3"}
PAUSE_TO_FENCE = {"abort": "abort", "in_place": "keep", "retract": "keep"}


class SGLangRuntime:
    """One SGLang-flavoured engine's pause state and in-flight requests."""

    def __init__(self, state: EngineState) -> None:
        self.state = state
        self.pause_mode: str | None = None
        self.running: dict[str, tuple[Generation, FenceSlot]] = {}
        self.started = time.time()

    @property
    def tool_call_parser(self) -> str:
        return TOOL_PARSER_NAMES[self.state.config.tool_call_parser]

    @property
    def reasoning_parser(self) -> str | None:
        parser = self.state.config.reasoning_parser
        return None if parser is None else REASONING_PARSER_NAMES[parser]

    def sample(self, choice: TurnChoice, script: Script, key: str, prompt_ids: list[int], max_new_tokens: int | None,
               temperature: float, rid: str | None) -> Generation:
        """The scripted turn for ``prompt_ids``, within the context's room and ``max_new_tokens``."""
        state = self.state
        room = state.config.max_model_len - len(prompt_ids)
        budget = room if max_new_tokens is None else min(max_new_tokens, room)
        scale = logprob_scale(state.config.logprobs_mode, temperature)
        sample = as_reported(sample_turn(choice, script, key, state.tokenizer, state.template, budget), scale)
        return Generation(rid=rid or uuid.uuid4().hex, key=key, turn_index=choice.index, prompt_ids=list(prompt_ids),
                          token_ids=list(sample.token_ids), logprobs=list(sample.logprobs),
                          finish=sample.finish_reason, started=time.time(), scale=scale)

    async def run(self, gen: Generation) -> None:
        """Emit ``gen``'s tokens through the fence: held while paused, frozen or aborted by a pause."""
        fence, config = self.state.fence, self.state.config
        slot = await fence.admit()
        self.running[gen.rid] = (gen, slot)
        try:
            if config.prefill_delay_s:
                await slot.wait_aborted(config.prefill_delay_s)
            for _ in gen.token_ids:
                if slot.aborted or not await fence.step(slot, config.decode_delay_s):
                    gen.aborted = True
                    break
                gen.emitted += 1
        finally:
            self.running.pop(gen.rid, None)
            fence.release(slot)

    def abort_all(self) -> None:
        for _gen, slot in list(self.running.values()):
            slot.abort()

    async def pause(self, mode: str) -> None:
        if mode == "retract":
            for gen, _slot in self.running.values():
                gen.retractions += 1
        self.pause_mode = mode
        await self.state.fence.pause(PAUSE_TO_FENCE[mode])

    def resume(self) -> None:
        self.pause_mode = None
        self.state.fence.resume()

    def set_version(self, version: str) -> None:
        """A new weight version: requests in flight keep a span of what they emitted under the old one."""
        old = self.state.weights.version
        if version != old:
            for gen, _slot in self.running.values():
                if gen.emitted:
                    gen.version_events.append((old, gen.emitted))
        self.state.weights.version = version

    async def wait_idle(self, poll_s: float = 0.005) -> None:
        """SGLang's model-update writer lock: a weight update waits for running requests unless paused."""
        while self.running and self.pause_mode is None:
            await asyncio.sleep(poll_s)

    def load_weights(self, model_path: str) -> str | None:
        """Load ``model_path`` (a folder with safetensors); the failure message, or None on success. A
        failure leaves the served weights as they were (SGLang fails before reading any tensor)."""
        folder = Path(model_path)
        if not folder.is_dir() or not any(folder.glob("*.safetensors")):
            return f"Failed to get weights iterator: Cannot find any model weights with `{model_path}`."
        self.state.weights.loaded(model_path)
        return None

    def flush_cache(self) -> bool:
        """SGLang flushes only an idle cache: no running requests, and no waiting ones unless paused (its
        scheduler's ``is_fully_idle(ignore_waiting=paused)``). A ``retract`` pause has moved the running
        requests to the waiting queue and an ``abort`` pause ended them; ``in_place`` leaves them running."""
        if self.running and self.pause_mode not in ("retract", "abort"):
            return False
        self.state.weights.cache_stale = False
        self.state.weights.cache_resets += 1
        return True
