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
from openenv_harness.recorder import prompt_mode, flow as flow_mod
orig_send = h1_engine.H1Engine._send
async def _send(self, method, path, body, **kw):
    t = time.perf_counter()
    try:
        return await orig_send(self, method, path, body, **kw)
    finally:
        out.write(f"x {path} {(time.perf_counter() - t) * 1000:.3f} {t:.6f}\n")
h1_engine.H1Engine._send = _send
for cls in (prompt_mode.Incremental, prompt_mode.FullHistory):
    orig = cls.send
    def make(orig, name):
        async def send(self, flow, upstream):
            t = time.perf_counter()
            try:
                return await orig(self, flow, upstream)
            finally:
                out.write(f"s {name} {(time.perf_counter() - t) * 1000:.3f} {t:.6f}\n")
        return send
    cls.send = make(orig, cls.name)
orig_hc = flow_mod.handle_chat
async def handle_chat(*a, **kw):
    t = time.perf_counter()
    try:
        return await orig_hc(*a, **kw)
    finally:
        out.write(f"h - {(time.perf_counter() - t) * 1000:.3f} {t:.6f}\n")
flow_mod.handle_chat = handle_chat
import openenv_harness.recorder.chat_protocol as cp
cp.handle_chat = handle_chat
sys.argv = ["openenv_harness.recorder", *sys.argv[1:]]
runpy.run_module("openenv_harness.recorder", run_name="__main__", alter_sys=True)
