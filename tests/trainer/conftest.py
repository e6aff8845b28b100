"""Fixtures for the trainer-side helpers: the reference engine, a recorder in front of it, and a
``transformers`` tokenizer built offline from the engine's own tokenizer and template."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.testing.engine import EngineConfig, EngineServer, reference_template, reference_tokenizer

ADMIN = "trainer-admin-token-0123456789abcdef"


def _hf_tokenizer(chat_template: str | None = None) -> Any:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(reference_tokenizer().to_json()),
                                  eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = reference_template().source if chat_template is None else chat_template
    return tok


@pytest.fixture(scope="session")
def hf_tokenizer() -> Any:
    """Builds the reference engine's BPE as a ``PreTrainedTokenizerFast`` (what a trainer loads for its
    model), with the engine's template unless another one is given."""
    return _hf_tokenizer


class Stack:
    """An engine and a recorder in front of it, started together."""

    def __init__(self, store: Path, engine_config: EngineConfig | None = None, **recorder_kw: Any) -> None:
        self.engine = EngineServer(engine_config).start()
        config = RecorderConfig(store_path=str(store), engine_url=self.engine.url, admin_token=ADMIN, **recorder_kw)
        self.recorder = RecorderServer(config).start()
        self.admin_token = ADMIN
        self.admin = RecorderClient(self.recorder.url, ADMIN)

    def close(self) -> None:
        self.admin.close()
        self.recorder.stop()
        self.engine.stop()


@pytest.fixture
def make_stack(tmp_path: Path) -> Iterator:
    stacks: list[Stack] = []

    def make(engine_config: EngineConfig | None = None, **recorder_kw: Any) -> Stack:
        stack = Stack(tmp_path / f"records-{len(stacks)}.db", engine_config, **recorder_kw)
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        stack.close()
