"""A headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`:
commands on fd 3, answers on fd 4, each a JSON text ended by a NUL byte), so a test can ask
the browser what it laid out and painted, with no driver package and no network.

DevTools evaluation is not bound by the page's Content-Security-Policy (the report forbids
scripts), so the page is checked exactly as a reader gets it."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

FLAGS = (
    "--headless",
    "--no-sandbox",  # root on CI machines
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",  # this machine's network is closed: no update pings
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
)


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One browser process and one page; `call` sends a command and waits for its answer."""

    def __init__(self, profile: Path, timeout: float = 60.0) -> None:
        exe = chromium()
        assert exe, "chromium is not installed"
        to_browser_r, self._w = os.pipe()
        self._r, from_browser_w = os.pipe()

        def child_fds() -> None:
            """The child must find the pipes at fds 3 and 4 (moved above 10 first, so that
            neither lands on the other's target)."""
            a = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)  # inheritable, unlike the pipes themselves
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            close_fds=False,
            preexec_fn=child_fds,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self.timeout = timeout
        self._id = 0
        self._buf = b""
        self.session: str | None = None

    def _send(self, msg: dict) -> None:
        os.write(self._w, json.dumps(msg).encode() + b"\0")

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not answer")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"chromium closed the pipe: {err[-2000:]}")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict | None = None, *, page: bool = True) -> dict:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if page and self.session:
            msg["sessionId"] = self.session
        self._send(msg)
        deadline = time.monotonic() + self.timeout
        while True:
            answer = self._read(deadline)
            if answer.get("id") == self._id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})

    def open(self, url: str, width: int = 1200, height: int = 900) -> None:
        target = self.call("Target.createTarget", {"url": "about:blank"}, page=False)
        self.session = self.call(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}, page=False
        )["sessionId"]
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        self.call("Page.navigate", {"url": url})
        deadline = time.monotonic() + self.timeout
        while self.evaluate("document.readyState") != "complete":
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not finish loading")
            time.sleep(0.05)

    def evaluate(self, expression: str) -> Any:
        res = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression[:80]}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def screenshot(self) -> bytes:
        """The whole page, beyond the viewport, as PNG bytes."""
        res = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        return base64.b64decode(res["data"])

    def close(self) -> None:
        try:
            self.call("Browser.close", page=False)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._w)
        os.close(self._r)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
