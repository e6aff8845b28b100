"""The reference engine's mutable state: scripts, faults, the request log and the fence.

Why one object: every route reads the same few things, and ``/_ref/reset`` must clear them all
at once so tests cannot leak into each other. Lookups follow one rule everywhere: a request is
known by its session header (what a recorder forwards), else its model name, else ``*``.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import deque
from typing import Any

from openenv_harness.testing.engine.config import EngineConfig
from openenv_harness.testing.engine.faults import Fault, FaultBook
from openenv_harness.testing.engine.fence import Fence
from openenv_harness.testing.engine.policy import Script
from openenv_harness.testing.engine.template import ChatTemplate, load_chat_template
from openenv_harness.testing.engine.prompt_reading import PromptReader
from openenv_harness.testing.engine.tokenizer import ReferenceTokenizer, hf_tokenizer, reference_tokenizer
from openenv_harness.testing.engine.weights import LoadedWeights

DEFAULT_KEY = "*"


class EngineState:
    """Shared by all routes of one engine app."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        folder = config.tokenizer if config.tokenizer is not None and config.tokenizer.is_dir() else None
        added = tuple(config.added_special_tokens)
        self.tokenizer: ReferenceTokenizer = (hf_tokenizer(config.tokenizer, added) if config.tokenizer is not None
                                              else reference_tokenizer(added))
        self.template: ChatTemplate = load_chat_template(config.chat_template, folder)
        #: what ``GET /v1/models`` reports as ``root`` (vLLM: the model path it loaded)
        self.model_root = str(folder) if folder is not None else config.served_model_name
        digest = hashlib.sha256(f"{config.served_model_name}\x1f{self.template.sha256}\x1f"
                                f"{self.tokenizer.fingerprint()}".encode()).hexdigest()
        #: vLLM's form: ``vllm-<version>-<8 hex of its config hash>``
        self.system_fingerprint = f"vllm-{config.version}-{digest[:8]}"
        #: reads roles and open think blocks back out of id prompts (the scale-out routes)
        self.prompt_reader = PromptReader(self.tokenizer)
        self.fence = Fence(reject_new=config.pause_rejects_new)
        #: which weights are served, as a weight sync changes them (``weights.py``)
        self.weights = LoadedWeights(str(config.weights_dir) if config.weights_dir is not None else self.model_root)
        self.faults = FaultBook()
        self._scripts: dict[str, Script] = {}
        self._requests: deque[dict[str, Any]] = deque(maxlen=config.max_recorded_requests)
        self._lock = threading.Lock()

    @property
    def weight_version(self) -> str:
        """The label of the weights being served (vLLM's ``/update_weight_version``; "default" from the start)."""
        return self.weights.version

    @staticmethod
    def keys_for(session: str | None, model: str | None) -> list[str]:
        """Lookup keys of a request, most specific first."""
        keys = [k for k in (session, model) if k]
        keys.append(DEFAULT_KEY)
        return keys

    def set_script(self, key: str, script: Script) -> None:
        """Register ``script`` under ``key``; faults attached to its turns are armed for those turns."""
        with self._lock:
            self._scripts[key] = script
        for index, turn in enumerate(script.turns):
            if turn.fault is not None:
                self.faults.add(key, turn.fault.model_copy(update={"on_turn": index}))

    def script_for(self, keys: list[str]) -> tuple[str, Script]:
        """The script of the first key that has one (the default script otherwise), and that key."""
        with self._lock:
            for key in keys:
                if key in self._scripts:
                    return key, self._scripts[key]
        return keys[0], self.config.default_script

    def add_fault(self, key: str, fault: Fault) -> None:
        self.faults.add(key, fault)

    def knows_model(self, model: str | None) -> bool:
        """vLLM's model check: the served name, or (like a loaded LoRA) a name with a script."""
        if model is None or model == self.config.served_model_name:
            return True
        with self._lock:
            return model in self._scripts

    def record(self, *, session: str | None, model: str | None, path: str, headers: dict[str, str],
               body: Any) -> dict[str, Any]:
        """Log one request (kept for ``/_ref/requests``); returns the entry for later annotation."""
        entry = {
            "key": self.keys_for(session, model)[0],
            "session": session,
            "model": model,
            "path": path,
            "headers": headers,
            "body": body,
            "received_at": time.time(),
        }
        if self.config.max_recorded_requests:
            with self._lock:
                self._requests.append(entry)
        return entry

    def recorded(self, key: str | None = None) -> list[dict[str, Any]]:
        """Logged requests whose session or model is ``key`` (all of them for none or ``*``)."""
        with self._lock:
            entries = list(self._requests)
        if key is None or key == DEFAULT_KEY:
            return entries
        return [e for e in entries if key in (e["session"], e["model"])]

    def reset(self) -> None:
        """Forget scripts, faults and logged requests, lift any pause, and serve the weights of the start."""
        with self._lock:
            self._scripts.clear()
            self._requests.clear()
        self.faults.clear()
        self.fence.resume()
        self.weights.reset()
