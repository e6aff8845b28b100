"""What the recorder knows about the default engine's template, and when it looks again.

A start-up probe trusted for the life of the recorder goes stale without a sound: the trainer
restarts vLLM with another ``--chat-template`` behind the same URL, serves another model, or
upgrades vLLM. So the engine's version, served models, template fingerprint and template
certification are probed at start and again when any of these says the engine may have changed:
the time-to-live passed (``template_reprobe_s``), a trainer's fingerprint does not match (checked
against what is served *now* before refusing), the engine could not be reached (a restart), or an
operator asks (``POST /admin/engine/reprobe``). Sessions keep the snapshot they were created with.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from openenv_harness.recorder.engine_knowledge.certify import Certification, certify_template, exact_in_words
from openenv_harness.recorder.engine_knowledge.provenance import (
    engine_models,
    engine_sampling_defaults,
    engine_version,
    measure_logprobs_mode,
    probe_template,
)

if TYPE_CHECKING:
    from openenv_harness.recorder.upstream.base import Upstream

log = logging.getLogger("openenv_harness.recorder")


class EngineWatch:
    """Probes the default engine and keeps the result in ``info`` (the dict health reports)."""

    def __init__(self, info: dict[str, Any], *, ttl_s: float, probe_template: bool,
                 probe_logprobs_mode: bool = True) -> None:
        self.info = info
        self.ttl_s = ttl_s
        self.probe_template = probe_template
        self.probe_logprobs_mode = probe_logprobs_mode
        self.certification: Certification | None = None
        self.probed_at: float | None = None
        self.probes = 0
        self._stale_reason: str | None = "not probed yet"
        self._lock = asyncio.Lock()

    def mark_stale(self, reason: str) -> None:
        self._stale_reason = self._stale_reason or reason

    def stale_reason(self) -> str | None:
        if self._stale_reason:
            return self._stale_reason
        if self.probed_at is not None and time.monotonic() - self.probed_at > self.ttl_s:
            return f"older than {self.ttl_s:g} s"
        return None

    async def ensure_fresh(self, upstream: Upstream | None, *, force: str | None = None) -> bool:
        """Probe again when stale (or ``force`` gives a reason); True when a probe ran."""
        if upstream is None:
            return False
        if force:
            self.mark_stale(force)
        if self.stale_reason() is None:
            return False
        async with self._lock:
            reason = self.stale_reason()
            if reason is None:  # another caller probed while this one waited
                return False
            await self._probe(upstream, reason)
            return True

    async def confirm_fingerprint(self, upstream: Upstream) -> None:
        """Fingerprint the served template now (three /tokenize calls); a change re-probes everything.
        Run before a trainer's fingerprint is checked, so it is never checked against a stale probe."""
        if not self.probe_template:
            return
        now, _status = await probe_template(upstream)
        if now != self.info.get("template_fingerprint"):
            await self.ensure_fresh(upstream, force="the served template changed")

    async def _probe(self, upstream: Upstream, reason: str) -> None:
        before = (self.info.get("version"), self.info.get("served_models"), self.info.get("template_fingerprint"),
                  self.info.get("logprobs_mode"))
        self.info["name"] = upstream.name
        self.info["version"] = await engine_version(upstream)
        models = await engine_models(upstream)
        self.info.pop("max_model_len", None)
        self.info.update(models)
        served = (models.get("served_models") or [None])[0]
        self.info.pop("sampling_defaults", None)
        defaults = await engine_sampling_defaults(upstream, served)
        if defaults is not None:
            self.info["sampling_defaults"] = defaults
        if self.probe_logprobs_mode:
            mode, how = await measure_logprobs_mode(upstream, served)
            self.info["logprobs_mode"], self.info["logprobs_mode_measure"] = mode, how
        if self.probe_template:
            fp, status = await probe_template(upstream)
            self.info["template_fingerprint"] = fp
            self.info["template_status"] = status
            self.certification = await certify_template(upstream, served, engine_version=self.info["version"])
            self.info["template_certification"] = self.certification.summary()
        self.probed_at = time.monotonic()
        self.probes += 1
        self.info["probed_at"] = time.time()
        self.info["probe_reason"] = reason
        self._stale_reason = None
        after = (self.info.get("version"), self.info.get("served_models"), self.info.get("template_fingerprint"),
                 self.info.get("logprobs_mode"))
        if self.probes > 1 and after != before:
            log.warning("recorder: the engine changed (%s): version %s -> %s, models %s -> %s, template %s -> %s, "
                        "logprobs %s -> %s", reason, before[0], after[0], before[1], after[1], before[2], after[2],
                        before[3], after[3])
        if self.certification is not None:
            log.info("recorder: served template %s (%s), probed via %s (probe: %s)%s", self.certification.status,
                     exact_in_words(self.certification.exact_in), self.certification.probed_via, reason, "".join(
                f"\n  {p.name} ({'required' if p.required else 'info'}): {_mark(p)} -- {p.detail}"
                for p in self.certification.properties) or f": {self.certification.reason}")


def _mark(prop: Any) -> str:
    """A property's verdict as the doctor prints it: an informational property that fails is a note,
    not a FAIL next to a certified template."""
    if prop.passed:
        return "pass"
    if prop.passed is None:
        return "unchecked"
    return "FAIL" if prop.required else "note"
