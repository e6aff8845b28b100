"""How a recorder runs: every setting, with its default and why (the CLI, the Space and the library build one).

Plain data: the call's steps read it through their services (``call/services.py``) without importing
the recorder's live parts (``context.py``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from openenv_harness.recorder.edge.request_body import MAX_JSON_DEPTH_LIMIT


class RecorderConfig(BaseModel):
    """How a recorder runs. Every field has a safe default except where the store lives."""

    model_config = ConfigDict(extra="forbid")

    store_path: str = Field(description="SQLite file for sessions and records")
    engine_url: str | None = Field(None, description="The trainer's engine (vLLM) root URL")
    engine_api_key: str | None = Field(None, repr=False, description="The engine's bearer key (never shown)")
    engine_family: Literal["vllm", "sglang", "auto"] = Field(
        "vllm", description="Whose wire the engine speaks: vLLM's routes, or SGLang's (``upstream/sglang.py`` maps "
        "the recorder's engine protocol onto them); auto: read from the engine when the recorder starts")
    admin_token: str | None = Field(None, repr=False, description="Control-plane token; generated when absent")
    public_base_url: str | None = Field(
        None, description="How agents reach this recorder (used in the base_url handed out per session)"
    )
    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0, description="Larger request bodies get 413")
    max_json_depth: int = Field(
        64, ge=2, le=MAX_JSON_DEPTH_LIMIT, description="Agent bodies nested deeper get 400 (the top-level "
        "object is level 1); bounded so that every accepted body can be forwarded and stored unchanged")
    max_header_bytes: int = Field(
        64 * 1024, ge=1024, description="Largest request line plus header section, in bytes on the wire; "
        "larger gets 431 and the connection is closed (every route, before authentication)")
    max_header_count: int = Field(100, ge=8, description="Most header fields in one request; more gets 431")
    request_head_timeout_s: float = Field(
        30.0, gt=0, description="Time a connection has to send a request's line and headers (from its first "
        "byte, or from connecting): then 408 and the connection is closed")
    request_body_timeout_s: float = Field(
        120.0, gt=0, description="Time a request has to send its whole body once its headers are in: then 408 "
        "and the connection is closed")
    keep_alive_timeout_s: float = Field(
        75.0, gt=0, description="How long an idle keep-alive connection from an agent stays open. Longer than "
        "clients keep theirs (aiohttp 15 s, Node's fetch about 4 s, httpx 5 s): a server that closes first races "
        "a client reusing the connection, which then gets a reset. uvicorn's own default is 5 s")
    listen_backlog: int = Field(
        2048, ge=1, description="Connections the listen socket queues before the recorder accepts them (the "
        "kernel caps it at net.core.somaxconn); many sandboxes connecting at once need room here")
    admin_port: int | None = Field(
        None, ge=0, le=65535, description="A second listener for session create and close, on its own thread and "
        "event loop (admin_listener.py), so that they do not wait behind the agents' calls on the main port's "
        "loop; same host and admin token as the main port, which keeps every admin route. 0: any free port; "
        "None: none. GET /admin/listener on the main port names it, and RecorderClient uses it when it does")
    admin_nice: int = Field(
        -10, ge=-39, le=39, description="Nice steps for the admin listener's thread relative to the recorder "
        "(Linux; negative = sooner): it wakes only for admin calls, and ahead of the agents' work it answers "
        "them without waiting for a CPU. Needs CAP_SYS_NICE or RLIMIT_NICE to raise it; without, it runs at "
        "the recorder's priority. 0: leave it")
    upstream_timeout_s: float = Field(600.0, gt=0)
    affinity_header: str | None = Field(
        "X-Session-ID", pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$",
        description="Header carrying each session's trajectory affinity key on every engine call (vllm-router's "
        "consistent_hash reads X-Session-ID first); None: not sent")
    replica_header: str | None = Field(
        None, description="A reply header naming the replica that served a call (one a gateway in front of the "
        "engines adds), recorded as provenance.replica; vLLM and vllm-router 0.1.17 send none")
    engine_replicas: list[str] = Field(
        default_factory=list, description="The engine replicas behind engine_url (a router): the fence pauses and "
        "resumes every one (a router sends /pause to one replica only)")
    engine_replicas_from_router: bool = Field(
        False, description="Ask the router at engine_url for its workers (vllm-router: GET /list_workers) at each "
        "pause instead of (or besides) engine_replicas")
    sqlite_synchronous: str = Field("NORMAL", description="NORMAL survives process kill; FULL survives power loss")
    store_indexer: Literal["process", "thread"] = Field(
        "process", description="where records are indexed into SQLite after the reply: a child process "
        "(its own interpreter lock, so the event loop never waits on it) or a thread")
    index_priority: Literal["normal", "low", "idle"] = Field(
        "idle", description="the index process's CPU priority: 'idle' runs it under SCHED_IDLE while it keeps "
        "up and at normal priority while it is behind, so the engine, the agents and the recorder go first "
        "(a lower p99 per call) without leaving indexing behind on a busy machine; where the system does "
        "not allow leaving SCHED_IDLE it runs as 'low' (nice +10); 'normal' never lowers it")
    prompt_cache_mb: float = Field(
        64.0, ge=0, description="Recent prompts (MiB, all sessions together) kept whole between calls to speed up "
        "the next: each session's last prompt text and ids (parsed only past them) and its chain tips' prompts "
        "(compared with bytes). Past it the sessions that called least recently keep digests instead "
        "(upstream/span_budget.py): only speed depends on it, never what is recorded")
    store_backlog_mb: float = Field(
        16.0, gt=0, description="Unindexed journal (MiB) past which a call waits for the indexer before its record is "
        "journalled (its reply still follows the durable write): bounds the store's disk footprint above its "
        "content when indexing falls behind, at the agents' latency (store/backlog.py); the most it may be: while "
        "the database is smaller than it, the bound is the database's size, at least 1 MiB (store/disk_budget.py)")
    pause_wait_s: float = Field(30.0, ge=0, description="How long a call waits for a paused engine before 503")
    retry_after_s: int = Field(2, ge=1, description="Retry-After sent with recorder-made 503s")
    close_grace_s: float = Field(10.0, ge=0, description="How long closing a session lets its calls in flight "
                                 "finish before cancelling them (recorded as cancelled, never trainable)")
    stream_keepalive_s: float = Field(
        10.0, ge=0, description="A streaming call still with the engine after this long is committed to a 200 "
        "event stream that carries the agent API's keepalive event this often until the reply (whose terminal "
        "event still follows the durable record); CLIs drop streams silent for minutes. 0 never does")
    dedupe_window: int = Field(64, ge=0, description="Recent request digests per session kept for retry replay")
    probe_template: bool = Field(True, description="Probe the engine's served template via /tokenize")
    template_reprobe_s: float = Field(
        300.0, gt=0, description="Probe the engine's template (fingerprint, certification) again after this long; "
        "also on a fingerprint mismatch, an unreachable engine, or POST /admin/engine/reprobe")
    engine_sampling_defaults: dict[str, Any] | None = Field(
        None, description="The sampling values the engine applies to fields a request leaves out (vLLM: the "
        "model's generation_config.json); recorded with every call. None: recorded as unknown -- a recorder "
        "cannot ask vLLM for them, so the launcher that started the engine, or the user, says what they are")
    engine_logprobs_mode: str | None = Field(
        None, description="What the engine's logprobs are said to be (vLLM --logprobs-mode; its default is "
        "raw_logprobs: before temperature, top-p/top-k and penalties). The recorder measures the default engine's "
        "mode (probe_logprobs_mode) and records the measurement; this declared value is recorded where nothing was "
        "measured, and a measurement that contradicts it is logged")
    probe_logprobs_mode: bool = Field(
        True, description="Measure whether the default engine's logprobs are raw or processed (two one-token calls "
        "at temperatures 1 and 2: processed logprobs halve the gap between the two likeliest tokens) whenever its "
        "template is probed; recorded as provenance.logprobs_mode with every call")
