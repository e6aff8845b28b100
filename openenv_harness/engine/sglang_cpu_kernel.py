"""A pure-torch stand-in for ``sgl_kernel``, the native op library SGLang's CPU engine imports.

Why it exists: SGLang 0.5.23 on CPU (``SGLANG_USE_CPU_ENGINE=1``) imports a few functions from
``sgl_kernel`` with no fallback, but the CPU build of sgl-kernel is not published on PyPI (only its
CUDA build is, which has no CPU ops). This module is copied into the SGLang venv as
``site-packages/sgl_kernel/__init__.py`` by ``openenv_harness.engine.sglang_cpu``; the project itself
never imports it.

What it does: it implements, in plain torch, the one op plain serving calls on SGLang's non-AMX path
(writing a batch's KV-cache slots into the request-to-token table). It registers nothing under
``torch.ops.sgl_kernel``, so SGLang's AMX probe (it looks for ``convert_weight_packed`` there) reports
no AMX and SGLang runs its torch-native layers and attention. Every other name resolves to a function
that raises ``NotImplementedError`` saying why: reaching one means a feature (speculative decoding,
CPU MoE or quantized kernels, ...) that needs the native build.
"""

from __future__ import annotations

from typing import Any, Callable, NoReturn

import torch

__version__ = "0.0.0+openenv.torch"


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """For each request ``i`` of the batch, in order, write the next ``end - start`` cache slots of
    ``out_cache_loc`` into ``req_to_token[req_pool_indices[i], start:end]`` (in place).

    ``out_cache_loc`` holds the batch's new slots back to back; ``pool_len`` (the table's row width)
    is only a bound check in the native op."""
    cursor = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        count = end - start
        if count <= 0:
            continue
        if end > pool_len:
            raise IndexError(f"request slot range {start}:{end} exceeds the pool row width {pool_len}")
        req_to_token[row, start:end] = out_cache_loc[cursor:cursor + count].to(req_to_token.dtype)
        cursor += count


def _not_in_this_build(name: str) -> Callable[..., NoReturn]:
    def missing(*_args: Any, **_kwargs: Any) -> NoReturn:
        raise NotImplementedError(
            f"sgl_kernel.{name} exists only in the native CPU build of sgl-kernel, which is not published on "
            "PyPI; this pure-torch stand-in implements only what SGLang's torch-native CPU serving calls")

    missing.__name__ = missing.__qualname__ = name
    return missing


def __getattr__(name: str) -> Callable[..., NoReturn]:
    """``from sgl_kernel import x`` succeeds for any ``x`` (SGLang imports many at module level); the
    call then fails loudly. Dunder lookups stay ordinary misses so tools probing the module behave."""
    if name.startswith("__"):
        raise AttributeError(name)
    return _not_in_this_build(name)
