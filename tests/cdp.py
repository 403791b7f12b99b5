"""A real headless Chromium driven over the DevTools protocol (aiohttp websocket; no extra
package and no browser download: the distribution's `chromium`)."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1"]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """`async with Browser() as b: await b.open(url); await b.eval("1+1")`."""

    def __init__(self, width: int = 1280, height: int = 1600) -> None:
        self.width, self.height = width, height
        self._ids = itertools.count(1)

    async def __aenter__(self) -> "Browser":
        exe = chromium_path()
        if exe is None:
            raise RuntimeError("chromium not installed")
        self.profile = Path(tempfile.mkdtemp(prefix="cdp-profile-"))
        self.proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={self.profile}", f"--window-size={self.width},{self.height}",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                await self._close_process()
                raise RuntimeError("chromium did not open its DevTools port")
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().split("\n")[0])
        self.http = aiohttp.ClientSession()
        async with self.http.get(f"http://127.0.0.1:{port}/json/list") as resp:
            page = next(t for t in await resp.json() if t["type"] == "page")
        self.ws = await self.http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=64 * 2**20)
        await self.call("Page.enable")
        await self.call("Runtime.enable")
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.ws.close()
            await self.http.close()
        finally:
            await self._close_process()

    async def _close_process(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self._ids)
        await self.ws.send_json({"id": msg_id, "method": method, "params": params})
        while True:
            msg = await asyncio.wait_for(self.ws.receive(), 60)
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise RuntimeError(f"DevTools connection closed: {msg.type}")
            data = json.loads(msg.data)
            if data.get("id") == msg_id:
                if "error" in data:
                    raise RuntimeError(f"{method}: {data['error']}")
                return data.get("result", {})

    async def open(self, url: str, width: int | None = None, height: int | None = None, mobile: bool = False) -> None:
        await self.call("Emulation.setDeviceMetricsOverride", width=width or self.width, height=height or self.height,
                        deviceScaleFactor=1, mobile=mobile)
        await self.call("Page.navigate", url=url)

    async def eval(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = await self.eval(expression)
            except RuntimeError:
                value = None  # navigating: the context is being replaced
            if value:
                return value
            await asyncio.sleep(0.25)
        raise AssertionError(f"{what} not shown within {timeout}s")

    async def screenshot(self, path: Path, full_page: bool = True) -> None:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            height = await self.eval("document.documentElement.scrollHeight")
            width = await self.eval("document.documentElement.scrollWidth")
            params["clip"] = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
            params["captureBeyondViewport"] = True
        data = await self.call("Page.captureScreenshot", **params)
        path.write_bytes(base64.b64decode(data["data"]))
