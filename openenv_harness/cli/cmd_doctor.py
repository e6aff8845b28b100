"""``openenv-harness doctor``: is this machine ready, and does the engine give token evidence?"""

from __future__ import annotations

import asyncio
import platform
import shutil
import subprocess
import sys
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

console = Console(width=None if sys.stdout.isatty() else 150)


def _node_version() -> str:
    node = shutil.which("node")
    if not node:
        return "missing (install Node.js 20+)"
    try:
        return subprocess.run([node, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"broken: {exc}"


def _container_sandbox() -> tuple[str, str]:
    """The container sandbox's row: ``(ok, detail)``. Informational: the local sandbox needs none of it."""
    from openenv_harness.sandbox.container_engine import REMEDY, find_container_engine
    from openenv_harness.sandbox.container_image import DEFAULT_IMAGE, image_present

    engine = find_container_engine()
    if engine is None:
        return "no", f"no container engine (docker or podman) is installed: {REMEDY}"
    ok, detail = engine.available()
    if not ok:
        return "no", f"{detail}: {REMEDY}"
    if not image_present(engine, DEFAULT_IMAGE):
        return "no", (f"{engine.kind} {detail}; image {DEFAULT_IMAGE} absent: build it as root with "
                      "`python -m openenv_harness.sandbox.container_image` (~1 min, from Debian packages)")
    return "yes", f"{engine.kind} {detail}; image {DEFAULT_IMAGE}"


def _engine_checks(url: str, model: str | None, family: str = "vllm") -> list[tuple[str, bool, str]]:
    import httpx

    from openenv_harness.recorder.engine_knowledge.certify import certify_template, exact_in_words
    from openenv_harness.recorder.engine_knowledge.provenance import engine_version, measure_logprobs_mode, probe_template
    from openenv_harness.recorder.upstream.base import Upstream
    from openenv_harness.recorder.upstream.http import HTTPEngine
    from openenv_harness.recorder.upstream.sglang import SGLangEngine
    from openenv_harness.recorder.upstream.reply_parse import parse_json_object
    from openenv_harness.recorder.validate import extract_evidence

    out: list[tuple[str, bool, str]] = []

    async def go() -> None:
        transport = HTTPEngine(url, timeout_s=60)
        eng: Upstream = SGLangEngine(transport) if family == "sglang" else transport
        await eng.start()
        try:
            reachable = await eng.request("GET", "/v1/models")
            if reachable.status != 200:
                out.append(("engine", False, f"{url} answered /v1/models with HTTP {reachable.status}: not a "
                            f"{family} server, or not ready"))
                return
            version = await engine_version(eng)
            out.append(("engine version", True, version or "not reported (/version answered no version)"))
            body = {"model": model or "", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8,
                    "return_token_ids": True, "logprobs": True, "top_logprobs": 0}
            if not model:
                models = await eng.request("GET", "/v1/models")
                data = (models.json or {}).get("data") or [{}]
                body["model"] = data[0].get("id", "")
            reply = await eng.chat(body, session_id="doctor")
            if reply.status != 200 or reply.json is None:
                out.append(("chat call", False, f"HTTP {reply.status}: {reply.body[:200]!r}"))
            else:
                # the transport cut the prompt ids out of ``reply.json`` (the flow reads them from the
                # raw span); the doctor reads the whole body as the engine sent it
                # (the SGLang adapter hands its reply over rebuilt, in ``json``)
                ev = extract_evidence((parse_json_object(reply.body) if reply.body else reply.json) or {})
                out.append(("token ids + logprobs", ev.valid, "ok" if ev.valid else "; ".join(ev.reasons)))
            out.extend(await _path_checks(eng, body))
            mode, how = await measure_logprobs_mode(eng, body["model"] or None)
            # either mode trains (processed: at the sampled temperature; raw: at temperature 1 only); unknown fails
            out.append(("logprobs mode", mode != "unknown", f"{mode} ({how})" + (
                "; raw logprobs are the sampling policy's at temperature 1 only" if mode == "raw_logprobs" else "")))
            fp, status = await probe_template(eng, body["model"] or None)
            out.append(("template fingerprint", fp is not None, fp or status))
            cert = await certify_template(eng, body["model"] or None)
            if cert.status == "uncertified":
                out.append(("template certification", False, f"uncertified: {cert.reason}"))
            else:
                via = f"probed via {cert.probed_via}" + (f": {cert.render_unavailable}, so /tokenize, which can "
                                                          "differ from the chat route" if cert.render_unavailable else "")
                partial = "" if cert.status == "certified" else f"; {exact_in_words(cert.exact_in)}" + (
                    " (run with --prompt-mode incremental)" if cert.exact_in == ["incremental"] else "")
                out.append(("template certification", cert.status == "certified", f"{cert.status} ({via}){partial}"))
                for prop in cert.properties:
                    # a failed informational property is reported, and fails nothing
                    ok = prop.passed is not False or not prop.required
                    mark = ("pass" if prop.passed else "unchecked" if prop.passed is None
                            else "FAIL" if prop.required else "note")
                    extra = f" [{prop.found!r} where {prop.expected!r}]" if prop.passed is False and prop.found else ""
                    kind = "required" if prop.required else "info"
                    out.append((f"  {prop.name} ({kind})", ok, f"{mark}: {prop.detail}{extra}"))
        except Exception as exc:  # report, never crash the doctor
            out.append(("engine", False, f"{type(exc).__name__}: {exc}"))
        finally:
            await eng.aclose()

    asyncio.run(go())
    del httpx
    return out


async def _path_checks(eng: Any, chat: dict[str, Any]) -> list[tuple[str, bool, str]]:
    """A router in front (its worker list), and whether the incremental prompt mode's token route
    carries evidence on this path. Absent scale-out routes are a note (that mode falls back to full
    history); a route that answers without token ids or logprobs is a failure (a router dropping them)."""
    out: list[tuple[str, bool, str]] = []
    workers = await eng.request("GET", "/list_workers")
    urls = (workers.json or {}).get("urls") if workers.status == 200 else None
    if isinstance(urls, list):
        out.append(("router", True, f"{len(urls)} worker(s): {', '.join(map(str, urls))} -- give the recorder "
                    "engine_replicas (or engine_replicas_from_router) so its fence pauses every one"))
    render = await eng.request("POST", "/v1/chat/completions/render", json={k: v for k, v in chat.items()
                                                                          if k in ("model", "messages")})
    ids = (render.json or {}).get("token_ids")
    if render.status in (403, 404, 405):
        out.append(("scale-out token routes", True, f"absent (render: HTTP {render.status}): the incremental "
                    "prompt mode falls back to full history"))
        return out
    if render.status != 200 or not isinstance(ids, list):
        out.append(("scale-out token routes", False, f"render: HTTP {render.status}, no token_ids in the reply "
                    "(dropped on the way?)"))
        return out
    params = {**((render.json or {}).get("sampling_params") or {}), "max_tokens": 4, "logprobs": 0}
    generated = await eng.request("POST", "/inference/v1/generate",
                                  json={"token_ids": ids, "sampling_params": params, "model": chat.get("model")})
    reply = generated.json or {}
    choice = (reply.get("choices") or [{}])[0]
    missing = [name for name, value in (("token_ids", choice.get("token_ids")), ("logprobs", choice.get("logprobs")))
               if not value]
    ok = generated.status == 200 and not missing
    detail = "ok" if ok else (f"generate: HTTP {generated.status}" if generated.status != 200
                              else "generate reply without " + ", ".join(missing) + " (dropped on the way?)")
    out.append(("scale-out token routes", ok, detail))
    return out


def doctor(
    engine_url: str = typer.Option(None, "--engine-url", help="Also check this engine"),
    engine_family: str = typer.Option("vllm", "--engine-family", help="vllm | sglang: whose routes it serves"),
    model: str = typer.Option(None, "--model", help="Model name to use for the engine check"),
) -> None:
    from openenv_harness.harnesses.doctor import doctor as harness_doctor
    from openenv_harness.harnesses.registry import get_preset
    from openenv_harness.version import __version__

    t = Table(title="openenv-harness doctor")
    t.add_column("check")
    t.add_column("ok")
    t.add_column("detail")
    t.add_row("openenv-harness", "yes", __version__)
    t.add_row("python", "yes", platform.python_version())
    node = _node_version()
    t.add_row("node", "yes" if node.startswith("v") else "no", node)
    rg = shutil.which("rg")
    t.add_row("ripgrep", "yes" if rg else "no", rg or "missing: OpenCode would download it (apt-get install ripgrep)")
    t.add_row("container sandbox", *_container_sandbox())
    bad = 0
    for status in harness_doctor():
        ok = status.ok
        bad += not ok
        dialect = get_preset(status.name).dialect  # the API it speaks to the recorder
        t.add_row(f"harness {status.name}", "yes" if ok else "no",
                  f"{status.version or '-'}  dialect {dialect}  {status.message}")
    if engine_url:
        for name, ok, detail in _engine_checks(engine_url, model, engine_family):
            bad += not ok
            t.add_row(name, "yes" if ok else "no", detail)
    else:
        t.add_row("engine", "skipped", "not checked: pass --engine-url URL to check token ids, logprobs and the "
                  "served template")
    console.print(t)
    if bad:
        raise typer.Exit(1)
