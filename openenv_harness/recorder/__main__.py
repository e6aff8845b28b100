"""``python -m openenv_harness.recorder``: run a recorder in the foreground (no CLI dependencies)."""

from __future__ import annotations

import argparse
import os
import sys

from openenv_harness.recorder.context import RecorderConfig
from openenv_harness.recorder.server import serve
from openenv_harness.recorder.store.index_priority import PRIORITIES


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m openenv_harness.recorder")
    p.add_argument("--engine-url", default=os.environ.get("OEH_ENGINE_URL"))
    p.add_argument("--engine-family", choices=("vllm", "sglang", "auto"), default=os.environ.get("OEH_ENGINE_FAMILY", "vllm"),
                   help="whose routes the engine serves: vLLM's, SGLang's, or auto (read from the engine at start)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--store", default=os.environ.get("OEH_STORE", "runs/recorder.db"))
    p.add_argument("--admin-token", default=os.environ.get("OEH_ADMIN_TOKEN"))
    p.add_argument("--public-base-url", default=None)
    p.add_argument("--log-level", default="warning")
    p.add_argument("--pause-wait-s", type=float, default=30.0,
                   help="how long a call waits for a paused engine (a weight sync) before 503")
    p.add_argument("--no-probe", action="store_true", help="do not probe the engine's template via /tokenize")
    p.add_argument("--index-priority", choices=PRIORITIES, default="idle",
                   help="CPU priority of the index process: 'idle' (SCHED_IDLE while it keeps up, normal "
                        "while behind; 'low' where the system forbids that), 'low' (nice +10) or 'normal'")
    p.add_argument("--keep-alive-s", type=float, default=RecorderConfig.model_fields["keep_alive_timeout_s"].default,
                   help="how long an idle agent connection stays open (longer than clients keep theirs)")
    p.add_argument("--backlog", type=int, default=RecorderConfig.model_fields["listen_backlog"].default,
                   help="connections the listen socket queues (capped by net.core.somaxconn)")
    p.add_argument("--admin-port", type=int, default=None,
                   help="also serve session create and close on this port, off the agents' event loop (0: any free port)")
    p.add_argument("--admin-nice", type=int, default=RecorderConfig.model_fields["admin_nice"].default,
                   help="nice steps for the admin listener's thread relative to the recorder (negative = sooner; "
                        "needs CAP_SYS_NICE, else it runs at the recorder's priority)")
    p.add_argument("--prompt-cache-mb", type=float, default=RecorderConfig.model_fields["prompt_cache_mb"].default,
                   help="memory (MiB) for the prompts open sessions keep to read their next call's new ids fast")
    p.add_argument("--store-backlog-mb", type=float, default=16.0,
                   help="unindexed journal (MiB) past which calls wait for the indexer (a reply always follows its durable record)")
    a = p.parse_args(argv)
    if a.host not in ("127.0.0.1", "localhost", "::1") and not a.admin_token:
        sys.exit("refusing to listen on a non-loopback address without --admin-token")
    config = RecorderConfig(
        store_path=a.store, engine_url=a.engine_url, engine_family=a.engine_family, admin_token=a.admin_token,
        engine_api_key=os.environ.get("OEH_ENGINE_API_KEY") or None,  # never a flag: flags show in `ps`
        public_base_url=a.public_base_url, probe_template=not a.no_probe,
        pause_wait_s=a.pause_wait_s, index_priority=a.index_priority, store_backlog_mb=a.store_backlog_mb,
        prompt_cache_mb=a.prompt_cache_mb,
        keep_alive_timeout_s=a.keep_alive_s, listen_backlog=a.backlog, admin_port=a.admin_port,
        admin_nice=a.admin_nice,
    )
    if not a.admin_token:
        from openenv_harness.recorder.auth import new_admin_token

        config.admin_token = new_admin_token()
        print(f"admin token: {config.admin_token}", flush=True)
    serve(config, host=a.host, port=a.port, log_level=a.log_level)


if __name__ == "__main__":
    main()
