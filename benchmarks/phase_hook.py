"""A recorder process that logs, per chat call, each engine exchange's round trip and the prompt
mode's time (``prompt_mode_phases.py`` starts it in place of ``python -m openenv_harness.recorder``).

Why a wrapper: the split of a continued call into its waits is only visible inside the recorder;
this wraps three functions from outside, so the recorder's code carries no timing hooks.
Lines go to ``$OEH_PHASE_LOG``: ``x PATH MS START`` (an exchange), ``s MODE MS START`` (the
strategy), ``h - MS START`` (the whole call).
"""
import os, runpy, sys, time
out = open(os.environ["OEH_PHASE_LOG"], "a", buffering=1)
from openenv_harness.recorder.upstream import h1_engine
from openenv_harness.recorder.prompt_modes import full_history, incremental
from openenv_harness.recorder.call import pipeline
orig_send = h1_engine.H1Engine._send
async def _send(self, method, path, body, **kw):
    t = time.perf_counter()
    try:
        return await orig_send(self, method, path, body, **kw)
    finally:
        out.write(f"x {path} {(time.perf_counter() - t) * 1000:.3f} {t:.6f}\n")
h1_engine.H1Engine._send = _send
for cls in (incremental.Incremental, full_history.FullHistory):
    orig = cls.sample
    def make(orig, name):
        async def sample(self, flow, upstream):
            t = time.perf_counter()
            try:
                return await orig(self, flow, upstream)
            finally:
                out.write(f"s {name} {(time.perf_counter() - t) * 1000:.3f} {t:.6f}\n")
        return sample
    cls.sample = make(orig, cls.name)
orig_hc = pipeline.handle_call
async def handle_call(*a, **kw):
    t = time.perf_counter()
    try:
        return await orig_hc(*a, **kw)
    finally:
        out.write(f"h - {(time.perf_counter() - t) * 1000:.3f} {t:.6f}\n")
pipeline.handle_call = handle_call
import openenv_harness.recorder.edge.agent_protocol as cp
import openenv_harness.recorder.app as app_mod
cp.handle_call = app_mod.handle_call = handle_call
sys.argv = ["openenv_harness.recorder", *sys.argv[1:]]
runpy.run_module("openenv_harness.recorder", run_name="__main__", alter_sys=True)
