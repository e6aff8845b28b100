"""``openenv-harness doctor``: is this machine ready, and does the engine give token evidence?"""

from __future__ import annotations

import sys

import asyncio
import platform
import shutil
import subprocess

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


def _engine_checks(url: str, model: str | None) -> list[tuple[str, bool, str]]:
    import httpx

    from openenv_harness.recorder.certify import certify_template
    from openenv_harness.recorder.provenance import engine_version, probe_template
    from openenv_harness.recorder.upstream.http import HTTPEngine
    from openenv_harness.recorder.upstream.reply_parse import parse_json_object
    from openenv_harness.recorder.validate import extract_evidence

    out: list[tuple[str, bool, str]] = []

    async def go() -> None:
        eng = HTTPEngine(url, timeout_s=60)
        await eng.start()
        try:
            out.append(("engine version", True, await engine_version(eng) or "unknown"))
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
                ev = extract_evidence(parse_json_object(reply.body) or {})
                out.append(("token ids + logprobs", ev.valid, "ok" if ev.valid else "; ".join(ev.reasons)))
            fp, status = await probe_template(eng, body["model"] or None)
            out.append(("template fingerprint", fp is not None, fp or status))
            cert = await certify_template(eng, body["model"] or None)
            if cert.status == "uncertified":
                out.append(("template certification", False, f"uncertified: {cert.reason}"))
            else:
                via = f"probed via {cert.probed_via}" + (f": {cert.render_unavailable}, so /tokenize, which can "
                                                          "differ from the chat route" if cert.render_unavailable else "")
                out.append(("template certification", cert.status == "certified", f"{cert.status} ({via})"))
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


def doctor(
    engine_url: str = typer.Option(None, "--engine-url", help="Also check this engine"),
    model: str = typer.Option(None, "--model", help="Model name to use for the engine check"),
) -> None:
    from openenv_harness.harnesses.doctor import doctor as harness_doctor
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
    bad = 0
    for status in harness_doctor():
        ok = status.ok
        bad += not ok
        t.add_row(f"harness {status.name}", "yes" if ok else "no", f"{status.version or '-'}  {status.message}")
    if engine_url:
        for name, ok, detail in _engine_checks(engine_url, model):
            bad += not ok
            t.add_row(name, "yes" if ok else "no", detail)
    console.print(t)
    if bad:
        raise typer.Exit(1)
