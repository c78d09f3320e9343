"""Runs a real CPU maskd (the built-in demo model: no golden data needed) for the operability tests,
and gives them the Python client (client/python, stubs generated when missing) and a test image."""
import io
import os
import re
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
CLIENT = os.path.join(REPO, "client", "python")
sys.path.insert(0, CLIENT)
subprocess.run([sys.executable, os.path.join(CLIENT, "generate.py"), "--if-needed"], check=True)

import maskd_client  # noqa: E402  (after the stubs exist)

LISTEN_RE = re.compile(r"listening on (\S+):(\d+)")
METRICS_RE = re.compile(r"metrics on (\S+):(\d+)")


class Maskd:
    """`maskd --device cpu --listen 127.0.0.1:0 ARGS`; the ports come from its log lines. All output
    (stdout and stderr) is kept in `lines`."""

    def __init__(self, binary, args=(), timeout=180.0, want_metrics=False):
        cmd = [binary, "--device", "cpu", "--listen", "127.0.0.1:0", *args]
        self.lines = []
        self._lock = threading.Lock()
        self.port = self.metrics_port = None
        self._ready = threading.Event()
        self._want_metrics = want_metrics
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     bufsize=1)
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(timeout) or self.port is None or (want_metrics and not self.metrics_port):
            self.stop()
            raise RuntimeError(f"maskd did not start within {timeout} s (exit {self.proc.poll()}):\n"
                               + "".join(self.lines[-40:]))
        self.target = f"127.0.0.1:{self.port}"
        self.client = maskd_client.MaskdClient(self.target, timeout=120)
        deadline = time.time() + timeout
        while True:
            try:
                if self.client.health() == "SERVING":
                    break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            if time.time() > deadline:
                self.stop()
                raise RuntimeError("maskd not SERVING in time:\n" + "".join(self.lines[-40:]))
            time.sleep(0.2)

    def _read(self):
        for line in self.proc.stdout:
            with self._lock:
                self.lines.append(line)
            m = LISTEN_RE.search(line)
            if m and self.port is None:
                self.port = int(m.group(2))
            m = METRICS_RE.search(line)
            if m and self.metrics_port is None:
                self.metrics_port = int(m.group(2))
            if self.port and (self.metrics_port or not self._want_metrics):
                self._ready.set()
        self._ready.set()

    def log(self):
        with self._lock:
            return list(self.lines)

    def stop(self):
        """SIGTERM and wait; returns the exit code."""
        if getattr(self, "client", None):
            self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        time.sleep(0.2)  # the reader drains the last lines
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def test_png(width=96, height=64, seed=0):
    """A small PNG with a bright square, different per seed (different image ids)."""
    from PIL import Image, ImageDraw
    img = Image.new("RGB", (width, height), (20 + seed, 30, 40))
    ImageDraw.Draw(img).rectangle([20, 10, 60, 50], fill=(230, 200 - seed, 90))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()
