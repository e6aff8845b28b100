"""The engine routes the recorder asks besides chat completions, named once.

``RENDER``, ``GENERATE`` and ``DERENDER`` are vLLM's scale-out routes (``--enable-scale-out``):
the template's rendering as ids, sampling from ids, and the engine's parsers run over sampled ids.
``COMPLETIONS`` samples from an id prompt on every vLLM. ``TOKENIZE`` renders and counts.
"""

from __future__ import annotations

RENDER = "/v1/chat/completions/render"
DERENDER = "/v1/chat/completions/derender"
GENERATE = "/inference/v1/generate"
COMPLETIONS = "/v1/completions"
TOKENIZE = "/tokenize"
