"""SIGTERM on a real node process: /readyz goes 503 first, then the process exits in time."""

import json
import os
import selectors
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

NODE = Path(__file__).with_name("daemon_sigterm_node.py")


def readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(timeout):
        raise AssertionError(f"no output from the node within {timeout} s")
    return proc.stdout.readline()


@pytest.mark.timeout(60)
def test_sigterm_flips_readiness_then_drains_and_exits_within_the_deadline():
    deadline_s, drain_s = 4.0, 2.0
    proc = subprocess.Popen(
        [sys.executable, str(NODE), str(deadline_s), str(drain_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        port = json.loads(read_line(proc, 30))["port"]
        assert readyz(port) == 200
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        statuses = []
        while proc.poll() is None and time.monotonic() - sent < 30:
            try:
                statuses.append(readyz(port))
            except (urllib.error.URLError, ConnectionError):
                break  # the server is closing: the process is about to exit
            if statuses[-1] == 503:
                break
            time.sleep(0.02)
        # 503 came from the live server, which answers until the drain is over: readiness
        # flipped before the drain finished
        assert statuses and statuses[-1] == 503, statuses
        # The stubborn daemon (stop timeout 60 s) is cancelled at the drain deadline: the node
        # exits within a wait far shorter than its 60 s, and not before the deadline.
        rc = proc.wait(timeout=deadline_s + 26)
        elapsed = time.monotonic() - sent
        assert rc == 0
        # The well-behaved worker finished its drain even though another daemon hung.
        assert json.loads(proc.stdout.read()) == {"stopped": True, "worker_drained": True}
        assert elapsed > deadline_s - 0.5
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
