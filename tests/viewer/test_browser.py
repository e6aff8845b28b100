"""The page in a real headless Chromium: it logs in, renders real sessions, and shows what matters.

Checked three ways: a screenshot (Pillow counts the mask-1 and replay-drift colours: the page is not
blank and those meanings are drawn in quantity), the rendered DOM (every call, every fidelity
class, the failed call's engine error, the budget stop), and a live page driven over the DevTools
protocol (clicking a long prompt's expander loads exactly the ids the record holds; typing the admin
token into the login form logs in, and the token is in no URL the browser visited). Set ``OEH_VIEWER_SCREENSHOT=path`` to keep
a copy of the screenshot (how ``docs/viewer.png`` is made).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from PIL import Image
from websockets.sync.client import ClientConnection, connect

from viewer_support import ADMIN, ENGINE_ERROR, Recorded, login_code

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="Debian's chromium is not installed (apt-get install -y chromium; ./dev setup does it)",
)

#: The page's colours for mask 1 (sampled, trained) and replay drift (viewer.css --mask1, --drift).
MASK1_RGB = (22, 163, 74)
DRIFT_RGB = (245, 158, 11)
OFFLINE_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
    "--enable-logging=stderr", "--v=0",  # the page's console (script errors, CSP refusals) goes to stderr
]


def chromium(tmp_path: Path, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    args = [str(CHROMIUM), *OFFLINE_FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=5000", *extra, url]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, console  # no script error, no refused resource, no stray log
    return done


def session_url(recorded: Recorded, session_id: str) -> str:
    """A one-time login link to a session: what ``openenv-harness serve`` prints, never the token."""
    return f"{recorded.url}/viewer/login?code={login_code(recorded)}&next=/viewer/%23session={session_id}"


def count_colour(image: Image.Image, rgb: tuple[int, int, int], tolerance: int = 6) -> int:
    lo = [c - tolerance for c in rgb]
    hi = [c + tolerance for c in rgb]
    return sum(n for n, px in image.getcolors(maxcolors=1 << 24)
               if all(lo[i] <= px[i] <= hi[i] for i in range(3)))


def test_screenshot_shows_masks_and_drift(tmp_path: Path, recorded: Recorded) -> None:
    png = tmp_path / "viewer.png"
    chromium(tmp_path, session_url(recorded, recorded.drift), f"--screenshot={png}", "--window-size=1400,1800")
    image = Image.open(png).convert("RGB")
    assert image.size == (1400, 1800)
    colours = image.getcolors(maxcolors=1 << 24)
    background = max(colours)[0]
    assert len(colours) > 200 and background < 0.8 * 1400 * 1800, "the page looks blank"
    assert count_colour(image, MASK1_RGB) > 3000, "no sampled (mask 1) ids drawn"
    assert count_colour(image, DRIFT_RGB) > 3000, "no replay drift drawn"
    if os.environ.get("OEH_VIEWER_SCREENSHOT"):
        shutil.copyfile(png, os.environ["OEH_VIEWER_SCREENSHOT"])


def rendered(tmp_path: Path, recorded: Recorded, session_id: str) -> str:
    dom = chromium(tmp_path, session_url(recorded, session_id), "--dump-dom").stdout
    assert 'data-state="ready"' in dom, dom[-3000:]
    return dom


def test_dom_of_a_drifting_session(tmp_path: Path, recorded: Recorded) -> None:
    dom = rendered(tmp_path, recorded, recorded.drift)
    records = recorded.admin.records(recorded.drift)
    nodes = re.findall(r'<section class="card[^"]*" id="call-(\d+)" data-node="([^"]+)"', dom)
    assert [node for _, node in nodes] == [r["metadata"]["node_id"] for r in records]
    classes = re.findall(r'data-fidelity="([a-z_]+)"', dom)
    assert classes == ["root", "replay_drift", "none", "replay_drift", "replay_drift", "break"]
    assert "▼ replay drift @" in dom and "▼ break @" in dom and "not replayed verbatim in #1" in dom
    assert "policy v1" in dom and ENGINE_ERROR in dom
    assert 'data-strategy="split"' in dom and 'data-strategy="realign"' in dom
    for session_id in (recorded.drift, recorded.faults):  # the sessions list
        assert f'data-session="{session_id}"' in dom


def test_dom_of_a_failing_session(tmp_path: Path, recorded: Recorded) -> None:
    dom = rendered(tmp_path, recorded, recorded.faults)
    assert re.findall(r'data-status="([a-z]+)"', dom) == ["ok", "ok", "failed", "ok", "invalid"]
    assert re.findall(r'data-fidelity="([a-z_]+)"', dom) == ["none", "root", "none", "exact", "exact"]
    assert "aux (no-tools)" in dom and "NOT trained (aux call)" in dom
    assert "straddled weight sync" in dom and "policy v1→v2" in dom
    assert ENGINE_ERROR in dom and "agent got HTTP 500" in dom and "engine answered HTTP 500" in dom
    assert "stop reason: max_agent_calls" in dom and "stopped: max_agent_calls" in dom  # header and graph
    assert "untrainable: " in dom and "NOT trained (invalid evidence)" in dom


def test_long_prompts_render_windowed(tmp_path: Path, recorded: Recorded) -> None:
    """~27k prompt ids per call: the page shows the end and the divergence, the rest behind expanders."""
    dom = rendered(tmp_path, recorded, recorded.long)
    prompt_chips = len(re.findall(r'<span class="t (?:t0|td-[a-z_]+)"', dom))
    assert 0 < prompt_chips <= 2 * (128 + 64)
    hidden = [int(n.replace(",", "")) for n in re.findall(r"⋯ ([\d,]+) ids \[0,", dom)]
    assert len(hidden) == 2 and min(hidden) > 20_000
    assert "▼ replay drift @" in dom


def test_without_login_the_browser_gets_only_the_login_form(tmp_path: Path, recorded: Recorded) -> None:
    dom = chromium(tmp_path, f"{recorded.url}/viewer/#session={recorded.drift}", "--dump-dom").stdout
    assert "<form" in dom and "Admin token" in dom
    assert recorded.drift not in dom and "data-node" not in dom


class Page:
    """A live Chromium tab driven over the DevTools protocol (what clicking needs)."""

    def __init__(self, socket: ClientConnection) -> None:
        self._socket = socket
        self._ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        message_id = next(self._ids)
        self._socket.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self._socket.recv(timeout=30))
            if reply.get("id") == message_id:
                assert "error" not in reply, reply
                return reply["result"]

    def js(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 20.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {expression}")


@pytest.fixture
def page(tmp_path: Path) -> Iterator[Page]:
    profile = tmp_path / "live-profile"
    args = [str(CHROMIUM), *OFFLINE_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
            "--window-size=1400,1800", "about:blank"]
    browser = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            assert browser.poll() is None and time.monotonic() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        target = next(t for t in targets if t["type"] == "page")
        with connect(target["webSocketDebuggerUrl"], max_size=None) as socket:
            yield Page(socket)
    finally:
        browser.terminate()
        try:
            browser.wait(timeout=15)
        except subprocess.TimeoutExpired:
            browser.kill()
            browser.wait(timeout=15)


def test_expander_loads_the_records_ids(page: Page, recorded: Recorded) -> None:
    prompt = recorded.admin.records(recorded.long)[0]["prompt_token_ids"]
    page.call("Page.navigate", url=session_url(recorded, recorded.long))
    page.wait_for("document.body && document.body.dataset.state === 'ready'")
    chips = "Array.from(document.querySelectorAll('#call-0 .prompt-ids .t'), (e) => Number(e.textContent))"
    shown = page.js(chips)
    assert shown == prompt[-len(shown):] and len(shown) < 1000
    page.js("document.querySelector('#call-0 .prompt-ids button.gap').click()")
    page.wait_for(f"document.querySelectorAll('#call-0 .prompt-ids .t').length > {len(shown)}")
    expanded = page.js(chips)
    assert expanded == prompt[-(len(shown) + 1024):]  # exactly the 1024 ids before the shown ones, in place
    gap = page.js("document.querySelector('#call-0 .prompt-ids button.gap').textContent")
    assert gap.startswith(f"⋯ {len(prompt) - len(expanded):,} ids [0, {len(prompt) - len(expanded):,})")


def test_the_login_form_logs_in_and_the_token_is_in_no_url(page: Page, recorded: Recorded) -> None:
    page.call("Page.enable")
    page.call("Page.navigate", url=f"{recorded.url}/viewer/login?next=/viewer/%23session={recorded.drift}")
    page.wait_for("document.querySelector('form input[name=token]') !== null")
    assert page.js("document.body.dataset.state") in (None, "")  # the login form, not the page
    page.js(f"document.querySelector('input[name=token]').value = {json.dumps(ADMIN)}")
    page.js("document.querySelector('form').submit()")
    page.wait_for("document.body && document.body.dataset.state === 'ready'")
    assert page.js(f"document.querySelector('[data-session=\"{recorded.drift}\"]') !== null")
    assert page.js("document.querySelectorAll('section.card').length") == len(recorded.admin.records(recorded.drift))
    history = page.call("Page.getNavigationHistory")["entries"]
    urls = [entry["url"] for entry in history] + [page.js("location.href")]
    assert any("/viewer/" in url for url in urls) and not any(ADMIN in url for url in urls), urls
    page.call("Network.enable")
    cookies = page.call("Network.getAllCookies")["cookies"]
    assert [c["name"] for c in cookies] == ["oeh_admin"] and ADMIN not in cookies[0]["value"]
