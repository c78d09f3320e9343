"""Starts a real maskd on an ephemeral loopback port for tests and examples."""
import os
import re
import subprocess
import threading
import time

LISTEN_RE = re.compile(r"listening on (\S+):(\d+)")


class MaskdProcess:
    """`maskd --checkpoint CKPT --device cpu --listen 127.0.0.1:0`; the port is read from its log
    line `listening on HOST:PORT`."""

    def __init__(self, binary, checkpoint, extra_args=(), startup_timeout=180.0):
        """checkpoint None: no --checkpoint (maskd_fake, whose engine needs none)."""
        self.binary = binary
        args = [binary, *(["--checkpoint", checkpoint] if checkpoint else []), "--device", "cpu",
                "--listen", "127.0.0.1:0", *extra_args]
        self.log = []
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     bufsize=1)
        self._port = None
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(startup_timeout) or self._port is None:
            self.stop()
            raise RuntimeError(f"maskd did not log 'listening on HOST:PORT' within {startup_timeout} s "
                               f"(exit {self.proc.poll()}); log:\n" + "".join(self.log[-40:]))
        self.target = f"127.0.0.1:{self._port}"

    def _read(self):
        for line in self.proc.stdout:
            self.log.append(line)
            m = LISTEN_RE.search(line)
            if m and self._port is None:
                self._port = int(m.group(2))
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

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def wait_serving(client, timeout=180.0):
    """Health is NOT_SERVING until the model is warm."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = client.health()
            if last == "SERVING":
                return
        except Exception as e:  # noqa: BLE001 - any RPC error: retry until the deadline
            last = repr(e)
        time.sleep(0.2)
    raise RuntimeError(f"maskd not SERVING after {timeout} s (last: {last})")
