"""Starts a real maskd on the built-in demo model (CPU, random tiny weights: no data needed) on ephemeral
loopback ports, for the COCO export, HTTP front and browser tests. The ports are read from maskd's log
lines `listening on HOST:PORT` (gRPC) and `HTTP front listening on HOST:PORT`; the object is ready
once maskd logs that it is serving (model loaded and warm)."""
import os
import re
import subprocess
import tempfile
import threading
import time

GRPC_RE = re.compile(r"(?<!HTTP front )listening on (\S+):(\d+)")
HTTP_RE = re.compile(r"HTTP front listening on (\S+):(\d+)")


class DemoMaskd:
    def __init__(self, binary, http=False, extra_args=(), startup_timeout=180.0):
        # An empty models folder: maskd serves the demo model only when it finds no checkpoint.
        self._models = tempfile.TemporaryDirectory(prefix="maskd-demo-models-")
        args = [binary, "--device", "cpu", "--listen", "127.0.0.1:0", "--models-dir", self._models.name,
                *extra_args]
        if http:
            args += ["--http-listen", "127.0.0.1:0"]
        env = {k: v for k, v in os.environ.items() if k != "MASKD_CHECKPOINT"}
        self.log = []
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     bufsize=1, env=env)
        self.grpc_port = None
        self.http_port = None
        self._want_http = http
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(startup_timeout) or self.grpc_port is None or (http and self.http_port is None):
            self.stop()
            raise RuntimeError(f"maskd did not log its listening lines within {startup_timeout} s "
                               f"(exit {self.proc.poll()}); log:\n" + "".join(self.log[-40:]))
        self.target = f"127.0.0.1:{self.grpc_port}"
        self.http_base = f"http://127.0.0.1:{self.http_port}" if http else None

    def _read(self):
        for line in self.proc.stdout:
            self.log.append(line)
            m = HTTP_RE.search(line)
            if m:
                self.http_port = int(m.group(2))
            else:
                m = GRPC_RE.search(line)
                if m and self.grpc_port is None:
                    self.grpc_port = int(m.group(2))
            # Ready once the model is loaded and warm (health SERVING).
            if "serving maskd.v1.MaskService" in line:
                self._ready.set()
        self._ready.set()  # exited before listening

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._models.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def write_test_image(path, width=160, height=120):
    """A PNG with a red rectangle holding a black square, written to `path`; returns (width, height)."""
    import numpy as np
    from PIL import Image

    a = np.full((height, width, 3), 230, np.uint8)
    a[20:80, 30:100] = (200, 40, 40)
    a[40:60, 50:70] = (0, 0, 0)
    Image.fromarray(a).save(path)
    return width, height


def wait_until(predicate, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
