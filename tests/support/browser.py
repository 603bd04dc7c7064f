"""A headless Chromium driven over the Chrome DevTools Protocol (a JSON-RPC over one websocket), for tests
of the playground page. Only what those tests need: open a page, evaluate JavaScript, type, click."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import websockets

_BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
_DEVTOOLS_URL = re.compile(r"DevTools listening on (ws://\S+)")


def find_chromium() -> str | None:
    """$AQUEDUCT_CHROMIUM, else the first Chromium-family browser on PATH (Debian's package is `chromium`)."""
    explicit = os.environ.get("AQUEDUCT_CHROMIUM")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    return next((path for name in _BINARIES if (path := shutil.which(name))), None)


class Page:
    """One browser tab: `send` a CDP command and get its result (events are ignored)."""

    def __init__(self, socket: websockets.ClientConnection) -> None:
        self.socket = socket
        self._ids = itertools.count(1)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        command_id = next(self._ids)
        await self.socket.send(json.dumps({"id": command_id, "method": method, "params": params}))
        while True:
            message = json.loads(await self.socket.recv())
            if message.get("id") == command_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (promises awaited), as JSON."""
        result = await self.send("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"JavaScript failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float = 30.0) -> Any:
        """Polls until `expression` is truthy; returns its value."""
        deadline = time.monotonic() + timeout_s
        while not (value := await self.evaluate(expression)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"still false after {timeout_s} s: {expression}")
            await asyncio.sleep(0.02)
        return value

    async def type_text(self, text: str) -> None:
        """Types into the focused element as a keyboard would (an input event per insertion)."""
        await self.send("Input.insertText", text=text)

    async def click(self, selector: str) -> None:
        """A real mouse click (press and release) at the centre of the element."""
        box = await self.evaluate(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
                                  "e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect(); "
                                  "return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        for kind in ("mousePressed", "mouseReleased"):
            await self.send("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)


@asynccontextmanager
async def headless_page(binary: str, url: str) -> AsyncIterator[Page]:
    """A fresh headless Chromium (own profile, killed afterwards) with one tab loaded at `url`."""
    # Chromium's helper processes may still be writing the profile for a moment after the kill:
    # a leftover file there is no test failure.
    with tempfile.TemporaryDirectory(prefix="aq-chromium-", ignore_cleanup_errors=True) as profile, \
            open(f"{profile}.log", "w+") as log:
        process = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--window-size=1280,1024", "--no-default-browser-check", "--remote-debugging-port=0",
             f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=log,  # a file, not a pipe: a full pipe would stall the browser
            start_new_session=True)  # its own process group, so the kill reaches the helper processes too
        try:
            browser_url = await _devtools_url(process, log.name)
            page_socket_url = await asyncio.to_thread(_first_page_socket, browser_url)
            async with websockets.connect(page_socket_url, max_size=None) as socket:
                page = Page(socket)
                await page.send("Page.enable")
                await page.send("Page.navigate", url=url)
                await page.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'")
                yield page
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
            os.unlink(log.name)


async def _devtools_url(process: subprocess.Popen[bytes], log_path: str, timeout_s: float = 60.0) -> str:
    """Chromium prints its browser websocket URL on stderr once it listens."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(log_path) as log:
            if match := _DEVTOOLS_URL.search(log.read()):
                return match.group(1)
        if process.poll() is not None:
            break
        await asyncio.sleep(0.05)
    with open(log_path) as log:
        raise RuntimeError("chromium did not start its DevTools server: " + log.read()[-2000:])


def _first_page_socket(browser_url: str) -> str:
    """The websocket of the tab Chromium opened, from its /json/list endpoint."""
    http_base = "http://" + browser_url.removeprefix("ws://").split("/", 1)[0]
    with urllib.request.urlopen(http_base + "/json/list", timeout=10) as response:
        targets = json.load(response)
    return next(target["webSocketDebuggerUrl"] for target in targets if target["type"] == "page")
