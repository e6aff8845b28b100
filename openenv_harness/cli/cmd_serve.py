"""``openenv-harness serve``: the recorder in the foreground."""

from __future__ import annotations

import os

import typer

from openenv_harness.cli.errors import CLIError
from openenv_harness.recorder.store.index_priority import PRIORITIES


def serve(
    engine_url: str = typer.Option(None, "--engine-url", envvar="OEH_ENGINE_URL", help="The trainer's engine (vLLM or SGLang) URL"),
    engine_family: str = typer.Option("vllm", "--engine-family", envvar="OEH_ENGINE_FAMILY",
                                      help="Whose routes the engine serves: vllm, sglang, or auto (read from "
                                      "the engine at start)"),
    host: str = typer.Option("127.0.0.1", help="Bind address (loopback by default)"),
    port: int = typer.Option(8765, help="Port"),
    store: str = typer.Option("runs/recorder.db", "--store", envvar="OEH_STORE", help="SQLite file for records"),
    admin_token: str = typer.Option(None, "--admin-token", envvar="OEH_ADMIN_TOKEN",
                                    help="Control-plane token (generated and printed once when absent); prefer "
                                    "OEH_ADMIN_TOKEN: a flag shows in `ps`"),
    public_base_url: str = typer.Option(None, help="How agents reach this recorder, if not host:port"),
    max_body_mb: int = typer.Option(32, help="Largest accepted request body, in MiB"),
    pause_wait_s: float = typer.Option(30.0, help="How long a call waits on a paused engine before 503"),
    index_priority: str = typer.Option(
        "idle", help="CPU priority of the index process: idle (SCHED_IDLE while it keeps up, normal while "
        "behind; 'low' where the system forbids that), low (nice +10) or normal"),
    keep_alive_s: float = typer.Option(75.0, "--keep-alive-s", help="How long an idle agent connection stays open; "
                                       "longer than clients keep theirs (aiohttp 15 s, Node's fetch ~4 s)"),
    backlog: int = typer.Option(2048, "--backlog", help="Connections the listen socket queues (capped by "
                                "net.core.somaxconn)"),
    admin_port: int = typer.Option(None, "--admin-port", help="Also serve session create and close on this port, "
                                   "off the agents' event loop (0: any free port; same host and admin token)"),
    admin_nice: int = typer.Option(-10, "--admin-nice", help="Nice steps for the admin listener's thread relative "
                                   "to the recorder (negative = sooner; needs CAP_SYS_NICE, else the recorder's)"),
    prompt_cache_mb: float = typer.Option(
        64.0, help="Memory (MiB) for the prompts open sessions keep to read their next call's new ids fast"),
    store_backlog_mb: float = typer.Option(
        16.0, help="Unindexed journal (MiB) past which calls wait for the indexer (a reply always follows its durable record)"),
    log_level: str = typer.Option("info", help="uvicorn log level"),
) -> None:
    from openenv_harness.recorder.auth import new_admin_token
    from openenv_harness.recorder.context import RecorderConfig, RecorderContext
    from openenv_harness.recorder.server import serve as run_server

    if host not in ("127.0.0.1", "localhost", "::1") and not admin_token:
        raise CLIError(f"refusing to listen on {host} with a generated admin token",
                       "pass --admin-token (or OEH_ADMIN_TOKEN) when binding a non-loopback address")
    if index_priority not in PRIORITIES:
        raise CLIError(f"unknown --index-priority {index_priority!r}", f"use one of: {', '.join(PRIORITIES)}")
    if engine_family not in ("vllm", "sglang", "auto"):
        raise CLIError(f"unknown --engine-family {engine_family!r}", "use vllm, sglang or auto")
    _check_port_free(host, port)
    if not engine_url:
        typer.echo("warning: no --engine-url: agent calls will get 503 until an engine is configured", err=True)
    token = admin_token or new_admin_token()
    if not admin_token:
        typer.echo(f"admin token (shown once): {token}")
    os.makedirs(os.path.dirname(os.path.abspath(store)), exist_ok=True)
    config = RecorderConfig(store_path=store, engine_url=engine_url, admin_token=token,
                            engine_family=engine_family,  # checked above
                            engine_api_key=os.environ.get("OEH_ENGINE_API_KEY") or None,
                            public_base_url=public_base_url, max_body_bytes=max_body_mb * 1024 * 1024,
                            pause_wait_s=pause_wait_s, index_priority=index_priority,
                            keep_alive_timeout_s=keep_alive_s, listen_backlog=backlog, admin_port=admin_port,
                            admin_nice=admin_nice,
                            store_backlog_mb=store_backlog_mb, prompt_cache_mb=prompt_cache_mb)
    typer.echo(f"recorder on http://{host}:{port}  store={store}  engine={engine_url or '-'}")

    def announce(ctx: RecorderContext) -> None:
        code = ctx.viewer_logins.new_code()
        minutes = int(ctx.viewer_logins.code_s // 60)
        typer.echo(f"trace viewer: http://{host}:{port}/viewer/login?code={code} (one-time link, valid {minutes} min; "
                   f"after that log in at http://{host}:{port}/viewer/ with the admin token)")

    run_server(config, host=host, port=port, log_level=log_level, announce=announce)


def _check_port_free(host: str, port: int) -> None:
    """Refuse, before printing a URL or a login link or writing anything, a port another process holds:
    those would name the other process."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a TIME_WAIT port is free
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise CLIError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                           "another process holds it: stop it, or pass --port") from None
