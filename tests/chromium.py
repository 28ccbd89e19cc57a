"""Headless Chromium driven over the DevTools protocol, with the standard library only.

`--remote-debugging-pipe` makes the browser read protocol messages on fd 3 and write its answers
on fd 4, each a JSON object ended by a NUL byte (the transport Puppeteer's `pipe: true` uses), so
no WebSocket client is needed. Unlike `--dump-dom`, this lets a test click through the report app
and wait on a condition in the page instead of a fixed virtual-time budget.

`chromium_or_skip()` finds Debian's `chromium` (installed by `make browser`, part of `make test`):
absent, tests skip with the reason, except under CI=true, where they fail.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

EXECUTABLES = ("chromium", "chromium-browser", "google-chrome")


def chromium_or_skip() -> str:
    for name in EXECUTABLES:
        if path := shutil.which(name):
            return path
    reason = "headless Chromium not found (Debian: apt-get install chromium, or `make browser` as root)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


def _above_9(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


class PageError(AssertionError):
    pass


class Chromium:
    """One headless browser with one page; `evaluate` runs JavaScript in it and returns the value."""

    def __init__(self, exe: str, profile_dir: Path, width: int = 1600, height: int = 1000):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # The child's ends above fd 9, so moving them onto fds 3 and 4 cannot clobber one another.
        to_browser_r, from_browser_w = (_above_9(to_browser_r), _above_9(from_browser_w))
        args = [exe, "--headless", "--remote-debugging-pipe", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--no-default-browser-check", "--hide-scrollbars",
                f"--user-data-dir={profile_dir}", f"--window-size={width},{height}"]
        if os.geteuid() == 0:
            args.append("--no-sandbox")  # Chromium refuses to start its sandbox as root
        # The shell puts the pipe ends on fds 3 and 4, where the browser expects them.
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$@" 3<&{to_browser_r} 4>&{from_browser_w} '
                           f'{to_browser_r}<&- {from_browser_w}>&-', "chromium", *args],
            pass_fds=(to_browser_r, from_browser_w), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buf = b""
        self._next_id = 0
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.send("Page.enable", session=True)

    def send(self, method: str, session: bool = False, timeout: float = 60, **params) -> dict:
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:  # events arrive interleaved with answers: skip them
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise PageError(f"{method}: {reply['error']}")
                return reply["result"]

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from Chromium")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                err = self.proc.stderr.read().decode(errors="replace")
                raise PageError(f"Chromium exited: {err[-2000:]}")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def navigate(self, url: str) -> None:
        self.send("Page.navigate", session=True, url=url)

    def evaluate(self, expression: str):
        res = self.send("Runtime.evaluate", session=True, expression=expression, returnByValue=True,
                        awaitPromise=True)
        if "exceptionDetails" in res:
            raise PageError(f"{expression[:200]}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def evaluate_in_frame(self, expression: str):
        """Run JavaScript in the page's one child frame (the report shows an HTML result in an iframe
        loaded from a data: URI, whose document the page's own scripts cannot reach): in an isolated
        world of that frame, which shares its DOM. None while there is no such frame."""
        frames = self.send("Page.getFrameTree", session=True)["frameTree"].get("childFrames", [])
        if len(frames) != 1:
            return None
        world = self.send("Page.createIsolatedWorld", session=True, frameId=frames[0]["frame"]["id"])
        res = self.send("Runtime.evaluate", session=True, expression=expression, returnByValue=True,
                        contextId=world["executionContextId"])
        if "exceptionDetails" in res:
            raise PageError(f"{expression[:200]}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def set_viewport(self, width: int, height: int) -> None:
        """The page's viewport exactly width x height CSS pixels (--window-size sizes the window)."""
        self.send("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def wait_for(self, expression: str, timeout: float = 60, what: str = "") -> object:
        """Poll until `expression` is truthy in the page (the report renders in scripts after load)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.2)
        raise PageError(f"timed out after {timeout} s waiting for {what or expression}")

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", session=True, format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except (PageError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        self.proc.stderr.close()
