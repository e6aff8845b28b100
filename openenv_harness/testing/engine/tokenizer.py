"""The engine's tokenizer: a real byte-level BPE, trained locally -- or a model's own.

Why train one instead of shipping a model's tokenizer: the reference engine has to run offline,
start in well under a second and give identical ids in every process. A small BPE (a few thousand
entries) trained on ``corpus.corpus_lines()`` with fixed settings does all three, and it is a
*real* BPE: decode -> encode is not injective, merges exist for common words and JSON punctuation,
and multi-byte characters can straddle tokens -- the properties the recorder and the assembler
must cope with on a real model.

Pre-tokenization isolates every ``"\\n"``. That keeps the boundary between a prompt (which ends
with ``"<|im_start|>assistant\\n"``) and the sampled text a pre-token boundary, so a canonical
completion encodes the same alone as inside the next prompt -- the property that lets a chat
template be checked for token-level prefix preservation.

``hf_tokenizer(path)`` loads a model's own ``tokenizer.json`` instead (the real Qwen2.5
tokenizer, for instance), so the engine can produce exactly the ids a real vLLM serving that
model would; the lookups below are the same for both.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from openenv_harness.testing.engine.corpus import corpus_lines

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

#: Control tokens: never part of decoded text when special tokens are skipped (like vLLM's default).
SPECIAL_TOKENS: tuple[str, ...] = (ENDOFTEXT, IM_START, IM_END)
#: Markup tokens: atomic, but part of the decoded text (the engine's parsers read them).
ADDED_TOKENS: tuple[str, ...] = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, THINK_OPEN, THINK_CLOSE)

VOCAB_SIZE = 3072
MIN_FREQUENCY = 1

#: Text between atomic tokens is encoded independently (that is how HF tokenizers work), so the
#: engine encodes piece by piece and caches pieces: the system prompt, the tool schemas and every
#: earlier turn of a growing conversation are encoded once, not on every call.
PIECE_CACHE_SIZE = 8192


def _atomic_split(texts: tuple[str, ...]) -> re.Pattern[str]:
    """Splits text around atomic tokens, longest first (so no token matches inside another)."""
    ordered = sorted(texts, key=len, reverse=True)
    return re.compile("(" + "|".join(re.escape(t) for t in ordered) + ")")


def _byte_to_unicode() -> dict[int, str]:
    """The byte-level alphabet: every byte maps to one printable character (GPT-2's scheme)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    mapping: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


_UNICODE_TO_BYTE: dict[str, int] = {ch: b for b, ch in _byte_to_unicode().items()}


def _train() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split("\n", behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=MIN_FREQUENCY,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines(), trainer=trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    return tokenizer


@dataclass
class ReferenceTokenizer:
    """The trained tokenizer plus the lookups the engine needs on its hot path."""

    tokenizer: Tokenizer
    #: Decoded text of each id (special tokens included), as vLLM reports it in logprobs.
    token_texts: list[str] = field(default_factory=list)
    #: Raw bytes of each id (a token may hold part of a multi-byte character).
    token_bytes: list[bytes] = field(default_factory=list)
    #: For each merged id, the two shorter vocabulary ids it was merged from.
    merge_parts: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: Ids of special and added tokens (never split, never byte-decoded).
    atomic_ids: frozenset[int] = frozenset()
    #: Control tokens: skipped when text is decoded with special tokens skipped (vLLM's default).
    special_ids: frozenset[int] = frozenset()
    #: Where it came from: ``"reference"`` or the ``tokenizer.json`` it was loaded from.
    source: str = "reference"
    #: False when some added token matches loosely (stripping, normalized): then whole-text encoding.
    piecewise: bool = True
    _atomic_by_text: dict[str, int] = field(default_factory=dict, repr=False)
    _split: re.Pattern[str] | None = field(default=None, repr=False)
    _fingerprint: str | None = field(default=None, repr=False)
    _encode_piece: Callable[[str], tuple[int, ...]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._atomic_by_text = {self.token_texts[i]: i for i in self.atomic_ids}
        self._split = _atomic_split(tuple(self._atomic_by_text)) if self._atomic_by_text else None
        encode = self.tokenizer.encode
        self._encode_piece = functools.lru_cache(maxsize=PIECE_CACHE_SIZE)(
            lambda piece: tuple(encode(piece, add_special_tokens=False).ids)
        )

    @property
    def vocab_size(self) -> int:
        return len(self.token_texts)

    def encode(self, text: str) -> list[int]:
        """Canonical ids of ``text``; special and added tokens in the text stay atomic.

        Equal to ``tokenizer.encode(text, add_special_tokens=False).ids``, computed piecewise.
        """
        if not self.piecewise or self._split is None:
            return self.tokenizer.encode(text, add_special_tokens=False).ids
        ids: list[int] = []
        atomic = self._atomic_by_text
        for piece in self._split.split(text):
            if not piece:
                continue
            token_id = atomic.get(piece)
            if token_id is not None:
                ids.append(token_id)
            else:
                ids.extend(self._encode_piece(piece))
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def atomic_id(self, text: str) -> int | None:
        """The id of a special or added token spelled ``text`` (always encoded whole), if it is one."""
        return self._atomic_by_text.get(text)

    def token_id(self, token: str) -> int:
        found = self.tokenizer.token_to_id(token)
        if found is None:
            raise KeyError(f"{token!r} is not in the reference vocabulary")
        return found

    @property
    def im_end_id(self) -> int:
        return self.token_id(IM_END)

    def vocab_string(self, token_id: int) -> str:
        """The vocabulary entry itself (``"Ġworld"``): what vLLM's ``/tokenize`` lists as ``token_strs``."""
        return self.tokenizer.id_to_token(token_id) or ""

    def to_json(self) -> str:
        """The tokenizer in HF ``tokenizer.json`` form (loadable by ``PreTrainedTokenizerFast``)."""
        return self.tokenizer.to_str()

    def fingerprint(self) -> str:
        """sha256 of the serialized tokenizer: equal fingerprints mean equal ids everywhere (computed once)."""
        if self._fingerprint is None:
            self._fingerprint = hashlib.sha256(self.to_json().encode()).hexdigest()
        return self._fingerprint

    def split(self, token_id: int) -> tuple[int, int] | None:
        """Two shorter vocabulary ids that decode to the same bytes as ``token_id``, if any."""
        return self.merge_parts.get(token_id)


def _build_lookups(tokenizer: Tokenizer, atomic_texts: tuple[str, ...], special_texts: tuple[str, ...],
                   source: str = "reference", piecewise: bool = True) -> ReferenceTokenizer:
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    size = max(vocab.values()) + 1
    atomic = frozenset(vocab[t] for t in atomic_texts)
    by_id = {i: t for t, i in vocab.items()}
    texts: list[str] = []
    raw: list[bytes] = []
    for token_id in range(size):
        token = by_id.get(token_id, "")
        if token_id in atomic:
            texts.append(token)
            raw.append(token.encode())
            continue
        try:
            data = bytes(_UNICODE_TO_BYTE[ch] for ch in token)
        except KeyError as exc:
            raise ValueError(f"{source}: only byte-level BPE tokenizers are supported "
                             f"(token {token_id} {token!r} is not in the byte alphabet)") from exc
        raw.append(data)
        texts.append(data.decode("utf-8", errors="replace"))
    merges = json.loads(tokenizer.to_str())["model"].get("merges") or []
    parts: dict[int, tuple[int, int]] = {}
    for merge in merges:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        merged = vocab.get(left + right)
        if merged is not None and merged not in parts:
            parts[merged] = (vocab[left], vocab[right])
    special = frozenset(vocab[t] for t in special_texts)
    return ReferenceTokenizer(tokenizer, texts, raw, parts, atomic, special, source, piecewise)


@functools.lru_cache(maxsize=4)
def reference_tokenizer(added_special: tuple[str, ...] = ()) -> ReferenceTokenizer:
    """The process-wide reference tokenizer (trained on first use, then cached), with
    ``added_special`` registered as special tokens."""
    if not added_special:
        return build_reference_tokenizer()
    base = reference_tokenizer()
    tokenizer = Tokenizer.from_str(base.tokenizer.to_str())
    return _with_special(tokenizer, added_special, source="reference")


def build_reference_tokenizer() -> ReferenceTokenizer:
    """Train a fresh, uncached copy (for determinism checks)."""
    return _build_lookups(_train(), SPECIAL_TOKENS + ADDED_TOKENS, SPECIAL_TOKENS)


def tokenizer_file(path: Path) -> Path:
    """``path`` itself, or the ``tokenizer.json`` inside a model folder."""
    return path / "tokenizer.json" if path.is_dir() else path


@functools.lru_cache(maxsize=8)
def _load(file: str, added_special: tuple[str, ...] = ()) -> ReferenceTokenizer:
    return _with_special(Tokenizer.from_file(file), added_special, source=file)


def _with_special(tokenizer: Tokenizer, added_special: tuple[str, ...], *, source: str) -> ReferenceTokenizer:
    """The tokenizer's lookups, ``added_special`` first registered as special tokens (one id each)."""
    if added_special:
        tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in added_special])
    added = tokenizer.get_added_tokens_decoder()
    atomic = tuple(token.content for token in added.values())
    special = tuple(token.content for token in added.values() if token.special)
    exact = all(not (t.lstrip or t.rstrip or t.single_word or t.normalized) for t in added.values())
    return _build_lookups(tokenizer, atomic, special, source=source, piecewise=exact)


def hf_tokenizer(path: Path | str, added_special: tuple[str, ...] = ()) -> ReferenceTokenizer:
    """A model's own tokenizer (``tokenizer.json``, or a model folder holding one), loaded once.

    Raises ``FileNotFoundError`` when there is none and ``ValueError`` for a tokenizer that is not
    a byte-level BPE (the only kind whose token bytes the engine can report like vLLM does).
    """
    file = tokenizer_file(Path(path)).resolve()
    if not file.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {file}")
    return _load(str(file), tuple(added_special))


def is_noncanonical(tokenizer: ReferenceTokenizer, ids: list[int]) -> bool:
    """True when ``ids`` decode to a text whose canonical encoding is different ids.

    This is the decode -> encode non-injectivity a real sampler exhibits: ``[fish, ing]`` and
    ``[fishing]`` are the same text, but only one of them is what ``encode`` returns.
    """
    text = tokenizer.decode(ids)
    return tokenizer.encode(text) != list(ids)
