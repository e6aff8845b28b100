"""Where a session's step-0 verification is kept, and how the viewer reads it.

``openenv-harness trace verify`` scores a session's sampled tokens with the trainer's own model
(``openenv_harness.trainer.verify``) and stores the report beside the record store; the viewer shows
each call's δ when one is there. A file beside the store, not a table in it: verification runs in
the trainer's environment (torch, transformers), long after the recorder wrote the records, and the
recorder never depends on it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def verification_path(store_path: str, session_id: str) -> Path:
    store = Path(store_path)
    return store.with_name(store.name + ".verify") / f"{session_id}.json"


STAT_KEYS = ("tokens", "delta_max", "delta_mean", "ratio_min", "ratio_max", "share_within", "mean_log_ratio", "kl_k3")


def load_verification(store_path: str, session_id: str) -> dict[int, dict[str, Any]]:
    """Per call index: ``{constrained, refused, model, dtype, verdict}`` and the call's statistics
    (``STAT_KEYS``: δ, ratios, the signed mean log ratio, the k3 KL estimate); a call the check refused
    to score carries ``refused`` (its reasons) and no statistics. ``verdict`` is the session's
    (``verified | failed | cannot verify | nothing verified``). Empty when the session was never
    verified (or the file is unreadable)."""
    try:
        data = json.loads(verification_path(store_path, session_id).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    verdict = (data.get("verdict") or {}).get("status") if isinstance(data.get("verdict"), dict) else None
    common = {"model": data.get("model"), "dtype": data.get("dtype"), "verdict": verdict}
    out: dict[int, dict[str, Any]] = {}
    for call in data.get("calls") or []:
        stats = call.get("stats") or {}
        out[int(call.get("call_index", -1))] = {
            "constrained": bool(call.get("constrained")), "refused": None, **common,
            **{k: stats.get(k) for k in STAT_KEYS},
        }
    for call in data.get("refused") or []:
        out[int(call.get("call_index", -1))] = {"constrained": bool(call.get("constrained")),
                                                "refused": list(call.get("reasons") or []), **common}
    return out
