"""The ``docs/benchmarks.md`` page: method, tables, target verdicts, profiles, versions, caveats.

Generated from a results file so the page and the numbers can never disagree.
"""

from __future__ import annotations

import time
from typing import Any

import report

METHOD = """\
Four targets (three with streaming) are measured in one run, alternated per setting (A, B, C, D, A, B, ...):

- **A, direct**: load generator → engine. The load generator asks the engine itself for the token
  evidence a proxy would ask for (`logprobs`, `top_logprobs: 0`, `return_token_ids`), so the engine
  does the same work in A as behind a proxy.
- **B, recorder**: load generator → `python -m openenv_harness.recorder` (its CLI, defaults: SQLite
  store with `synchronous=NORMAL`, every record written to its journal before its reply) → engine. Each
  conversation is one recorder session: `POST /admin/sessions`, the secret as Bearer key on the
  session's `base_url`, `POST /admin/sessions/{id}/close` at the end, as a trainer does.
- **C, OpenEnv capture**: load generator → OpenEnv 0.10's capture server through its own CLI with
  default settings (`python -m openenv.core.harness.capture.server --llm-url http://127.0.0.1:$EP/v1
  --model fake-model --host 127.0.0.1 --port $CP`), which probes the engine at start and must reach
  `capture_level=tokens`. Each conversation is one capture session (`POST /sessions`, the session id as
  API key); sessions are never deleted during a run (capture has no TTL).
- **D, floor** (every setting without streaming): load generator → `benchmarks/floor_proxy.py` →
  engine, a baseline proxy that does per call only the work recording cannot skip (see "The hop
  itself"). Sessions follow capture's wire; it keeps the id readers of its 256 most recent ones.

**Engine** (`benchmarks/lean_engine.py`): uvicorn (uvloop, httptools), one process, orjson, no model
work. It answers in vLLM's chat wire format: top-level `prompt_token_ids`, `choices[0].token_ids`,
`choices[0].logprobs.content[{token: "token_id:N", logprob}]`, `usage`. Every reply is one bash
tool call of exactly 50 ids (49 text ids + EOS). Its tokenizer maps 4 bytes to one id and renders
each message as `[ROLE] enc(text) [EOS]`, so the returned tool call re-renders to exactly the sampled
ids and consecutive turns link by token prefix, as with real vLLM.
- **fixed** mode: `prompt_token_ids` is exactly P ids on every call (a sliding window over the
  conversation): unlinked prompts, the literal "P-token prompt" workload.
- **chain** mode: `prompt_token_ids` is the whole rendered conversation. The first prompt is P ids and
  each turn adds ≈ 565 ids (50 sampled + a 2 KB tool result + markup), so a 20-turn conversation
  with P=8k ends near 19k ids and the recorder's block sharing and chain classification see real
  linked conversations.

**Load generator** (`benchmarks/loadgen.py`): one process, aiohttp on uvloop. N concurrent agents run
back-to-back 20-turn conversations shaped like Pi's requests: system prompt (≈ 4·P bytes), a user
turn with text parts, then per turn the assistant tool call echoed exactly as received and a 2 KB
tool result; a 3-tool manifest on every call, `max_completion_tokens`, `temperature`. Every reply is
checked (status, a usable tool call, a finish reason; for A the token ids and their counts against
`usage`); a conversation can only continue from what the reply said. Bodies are pre-serialized by
joining bytes. Latency runs from sending a request to having read its whole body. The deadline is
checked only between conversations, so every conversation runs all its turns and the prompt-size mix
is identical for A, B and C. Throughput = calls / (last response − first request).

**Each cell** starts a fresh engine and (B, C) a fresh proxy with an empty store, runs a discarded
pre-warm (4 sessions × 3 turns), then the measured load. CPU per call is `utime+stime` of each
process from `/proc/<pid>/stat` over the measured run (for the recorder also split into its
event-loop thread and its other threads, mainly the store writer). RSS is `VmRSS` after the
pre-warm and at the end. Store bytes are the logical bytes in the SQLite file (row and blob
lengths) after the recorder stopped. "Background cores" is the rest of the machine's CPU use during
the run (system busy time minus the three processes), since the machine is shared.

**The long session**: one conversation of 100 turns, chain and fixed mode, P=8k, for each target,
after the same pre-warm, with per-call latencies. RSS is read before it, right after it, and
"settled" after 2.5 s idle: the last calls' buffers (a 64k-id prompt's body, reply and ids) are
freed by then and the recorder's heap trimmer (every second) has handed them back, so the settled
reading is what the session left held. For the recorder, the session's stored bytes
(`SQLiteStore.session_bytes`: its rows plus every blob it references) are compared with its final
prompt+completion ids at 4 bytes per id, and its records are read back through the admin API."""

CAVEATS = """\
- **The machine is shared and has 2 cores.** Load generator, engine and proxy share them with other
  work; the "background cores" column says how much else ran during each cell. Cells with
  background above ~0.3 cores are noisy. One rep per cell unless stated, so treat differences under
  ~15 % as noise.
- **At N ≥ 16 the direct path is bound by this machine**: load generator and engine together
  saturate both cores, so "recorder ÷ direct" is optimistic for the recorder only in the sense that
  a bigger machine would raise the direct figure; the proxy's own ceiling (one event loop) would
  not rise with more cores.
- **Agents here have no think time.** Each agent sends its next call as soon as the previous reply
  arrives, so at N=64 a saturated server's latency is simply N ÷ throughput (Little's law); compare
  the recorder's p99 with the direct column's, which is bound by the same rule on this machine.
- **The engine does no model work.** Added latency is therefore absolute proxy cost; against a real
  engine taking 100 ms to seconds per call it is small in relative terms, but the per-process
  ceiling in calls/s still applies whenever the aggregate call rate approaches it.
- **OpenEnv capture ran on uvloop + httptools** here, because both are installed in this
  environment and uvicorn picks them automatically; a plain `pip install openenv` does not pull
  them in, so stock capture is somewhat slower than column C.
- **The tokenizer is 4 bytes per id** and the tool manifest is not rendered into the prompt; the
  request bodies are as large as real agent bodies with the same prompt length (P=8k: a 32 KB system
  prompt; turn 20 ≈ 78 KB; turn 100 ≈ 264 KB).
- **RSS at the end of a run includes everything a run kept**: capture keeps every turn in memory;
  the recorder keeps per-session counters and chain tips (recent prompts as bytes) for every session
  it has seen, closed ones included."""


def _profiles(results: list[dict[str, Any]]) -> list[str]:
    parts: list[str] = []
    for p in (r for r in results if r.get("kind") == "profile"):
        load = p["load"]
        parts += [f"**{p['label']}** ({load['calls']} calls, {load['throughput']:.0f} calls/s, p50 "
                  f"{load['p50_ms']:.1f} ms, p99 {load['p99_ms']:.1f} ms while sampled)", "", "```",
                  p["summary"], "```", ""]
    return parts


def _run_sections(results: list[dict[str, Any]], level: str) -> list[str]:
    """Tables, targets and profiles of one run, under headings of the given level."""
    parts = [
        f"{level} Latency and throughput", "",
        "Medians over reps. *added* = recorder − direct; ratios are throughput ratios.", "",
        report.main_table(results), "",
        f"{level} Resources", "",
        report.resource_table(results), "",
    ]
    floor = report.floor_table(results)
    if floor:
        parts += [f"{level} The hop itself", "",
                  "The baseline proxy (`benchmarks/floor_proxy.py`) does per call only what recording token evidence "
                  "cannot skip: httptools request parsing, the recorder's engine client and id reader, one `writev` "
                  "of the call, the reply without engine-only fields. Its added latency is what a proxy hop in "
                  "Python costs on this machine; the recorder's excess over it is its own bookkeeping.", "",
                  floor, ""]
    if report.cells(results, long_session=True):
        parts += [f"{level} One long session", "", report.long_session_table(results)]
    parts += [f"{level} Targets", "", report.targets_table(results), ""]
    profiles = _profiles(results)
    if profiles:
        parts += [f"{level} Where the recorder's time goes", "",
                  "py-spy (`benchmarks/profile_recorder.py`, 100 Hz, all threads, waiting frames left out) on the "
                  "recorder process under the named load. Each sample is charged to the innermost frame matching a "
                  "rule, so C work (orjson, sqlite3, zstd, simdjson) counts toward the Python function that called it.", ""]
        parts += profiles
    return parts


def render_page(results: list[dict[str, Any]], *, command: str, earlier: list[dict[str, Any]] | None = None,
                earlier_title: str = "", earlier_command: str = "", notes: str = "") -> str:
    """The page for one run; ``earlier`` adds a complete earlier run (e.g. a previous recorder revision)."""
    checks = report.target_checks(results)
    met = sum(1 for _, _, ok, _ in checks if ok)
    machine, versions = report.machine(), report.versions()
    started = min((r.get("started_at", 0) for r in results if r.get("started_at")), default=time.time())
    measured = next((r["commit"] for r in results if r.get("commit")), machine["commit"])
    parts = [
        "# Recorder benchmark",
        "",
        "How much the recorder adds to an agent's calls, compared with calling the engine directly and with "
        "OpenEnv 0.10's own capture server, on the same 2-core machine, engine and load. Generated by "
        f"`benchmarks/run.py` and `benchmarks/report.py` (run started {time.strftime('%Y-%m-%d %H:%M', time.localtime(started))} "
        f"machine time, openenv-harness at {measured}). **{met} of {len(checks)} targets met**; see "
        "[Targets](#targets).",
        "",
    ]
    if earlier:
        parts += [f"A complete matrix measured earlier is kept below: [{earlier_title}](#earlier-run).", ""]
    if notes:
        parts += ["## Findings", "", notes.strip(), ""]
    parts += ["## Method", "", METHOD, ""]
    parts += _run_sections(results, "##")
    if earlier:
        parts += ["## Earlier run", "", f"**{earlier_title}.** Same method and machine; command: `{earlier_command}`.", ""]
        parts += _run_sections(earlier, "###")
    from bench_footprint import page_section  # the footprint run's own section, when one was kept

    footprint = page_section()
    if footprint:
        parts += [footprint, ""]
    parts += [
        "## How to reproduce",
        "",
        "```bash",
        "pip install aiohttp py-spy   # load generator and profiler (benchmark-only dependencies)",
        command,
        "python benchmarks/report.py RESULTS.jsonl --docs docs/benchmarks.md "
        "[--earlier OTHER.jsonl --earlier-title T] [--notes benchmarks/findings.md]   # render this page",
        "python benchmarks/run.py            # the full matrix, ~15-20 min on 2 shared cores; writes this page",
        "python benchmarks/run.py --quick    # ~2 minute smoke of the same path (prints, writes no page)",
        "python benchmarks/bench_footprint.py --baseline REF --docs docs/benchmarks.md   # disk, memory, admin calls (~20 min)",
        "python benchmarks/profile_recorder.py --mode chain --prompt-tokens 8192 --sessions 64 --duration 10",
        "```",
        "",
        "## Software and machine",
        "",
        f"- Machine: {machine['cores']} × {machine['cpu']}, {machine['memory']} RAM, kernel {machine['kernel']}.",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".",
        "",
        "## Caveats",
        "",
        CAVEATS,
        "",
        "## Appendix: every run, in execution order",
        "",
        report.raw_table(results),
        "",
    ]
    if earlier:
        parts += ["Earlier run:", "", report.raw_table(earlier), ""]
    return "\n".join(parts)
