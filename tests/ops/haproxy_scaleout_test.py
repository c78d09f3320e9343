#!/usr/bin/env python3
"""Scale-out that has run: 3 CPU maskd replicas behind HAProxy 2.6 (deploy/haproxy/haproxy.cfg:
HTTP/2 both ways, consistent hashing on x-maskd-image-id, grpc.health.v1 checks), on loopback.

1. Affinity: repeated prompts on the same images reach the replica that cached each image: after
   the first touch of each image the cache hit rate (from every replica's GetInfo) is >= 95 %, and
   no image is encoded on two replicas.
2. A replica killed (SIGKILL) mid-run: every request ends exactly once, either OK (after client
   retries, on another replica) or UNAVAILABLE; none is lost or answered with another's response.

Prints the figures (hit rate, requests lost, retries) for deploy/README.md.
Exit 77 (skipped) when haproxy is not installed, except under CI=true, where that fails.

usage: haproxy_scaleout_test.py MASKD_BINARY MASKCTL_BINARY"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from checks import Checks
from maskd_run import REPO, Maskd, maskd_client, test_png

N_IMAGES = 12
ROUNDS = 5
KILL_REQUESTS = 60   # per client thread in part 2
RETRIES = 4


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    maskd, maskctl = sys.argv[1], sys.argv[2]
    haproxy = shutil.which("haproxy")
    if not haproxy:
        print("haproxy not installed (apt-get install haproxy)")
        return 1 if os.environ.get("CI") == "true" else 77
    check = Checks()

    with tempfile.TemporaryDirectory(prefix="maskd-haproxy-") as tmp:
        bindir = os.path.join(tmp, "bin")
        os.makedirs(bindir)
        os.symlink(os.path.abspath(maskctl), os.path.join(bindir, "maskctl"))
        replicas = [Maskd(maskd) for _ in range(3)]
        hap = None
        try:
            port = free_port()
            env = dict(os.environ,
                       MASKD_HAPROXY_BIND=f"127.0.0.1:{port}",
                       MASKD_CHECK_PATH=":".join([os.path.join(REPO, "deploy", "haproxy"), bindir,
                                                  "/usr/bin", "/bin"]),
                       **{f"MASKD_R{i + 1}": r.target for i, r in enumerate(replicas)})
            hap_log = open(os.path.join(tmp, "haproxy.log"), "w")
            hap = subprocess.Popen([haproxy, "-f", os.path.join(REPO, "deploy", "haproxy", "haproxy.cfg"),
                                    "-db"], env=env, stdout=hap_log, stderr=subprocess.STDOUT)
            target = f"127.0.0.1:{port}"
            # The first round of health checks (one maskctl per replica) before any traffic, so
            # that no replica changes state in the middle of part 1.
            time.sleep(7)
            check(hap.poll() is None, "haproxy is running")

            # --- 1. affinity ----------------------------------------------------------------
            images = [test_png(seed=10 + i) for i in range(N_IMAGES)]
            with maskd_client.MaskdClient(target, timeout=120) as c:
                for rnd in range(ROUNDS):
                    for i, png in enumerate(images):
                        r = c.segment(png, points=[(30 + rnd, 25, 1)], request_tag=f"a{rnd}.{i}")
                        assert r.request_tag == f"a{rnd}.{i}"
            hits = misses = 0
            per_replica = []
            for r in replicas:
                cache = r.client.info().cache
                hits += cache.hits
                misses += cache.misses
                per_replica.append(cache.misses)
            after_first = N_IMAGES * (ROUNDS - 1)
            hit_rate = hits / after_first
            print(f"figures: affinity: {N_IMAGES} images x {ROUNDS} rounds through haproxy; "
                  f"images encoded per replica {per_replica}; cache hits {hits} of {after_first} "
                  f"calls after each image's first touch = hit rate {hit_rate:.1%}", flush=True)
            check(misses == N_IMAGES, f"every image was encoded once, on one replica (misses {misses})")
            check(hit_rate >= 0.95, f"hit rate after the first touch {hit_rate:.1%} >= 95 %")
            check(sum(1 for m in per_replica if m > 0) >= 2,
                  f"the images spread over several replicas: {per_replica}")

            # --- 2. a replica killed mid-run ---------------------------------------------------
            victim = max(range(3), key=lambda k: per_replica[k])
            outcomes = {}   # tag -> final code name
            retries = [0]
            lock = threading.Lock()
            started = threading.Event()

            def worker(w):
                with maskd_client.MaskdClient(target, timeout=60) as c:
                    for n in range(KILL_REQUESTS):
                        tag = f"k{w}.{n}"
                        i = (n * 5 + w) % N_IMAGES
                        final = None
                        for attempt in range(RETRIES + 1):
                            try:
                                r = c.segment(images[i], points=[(40, 30, 1)], request_tag=tag)
                                final = "OK" if r.request_tag == tag and len(r.prompts) == 1 else \
                                    f"WRONG_ANSWER({r.request_tag})"
                                break
                            except maskd_client.Unavailable:
                                final = "UNAVAILABLE"
                                if attempt < RETRIES:
                                    with lock:
                                        retries[0] += 1
                                    time.sleep(0.5)
                            except maskd_client.MaskdError as e:
                                final = e.code().name
                                break
                        with lock:
                            if tag in outcomes:
                                outcomes[tag] = "TWICE"
                            else:
                                outcomes[tag] = final
                        if n == 10:
                            started.set()

            threads = [threading.Thread(target=worker, args=(w,)) for w in range(2)]
            for t in threads:
                t.start()
            started.wait(300)
            replicas[victim].proc.send_signal(signal.SIGKILL)
            killed_at = time.time()
            for t in threads:
                t.join(900)
            sent = 2 * KILL_REQUESTS
            ok = sum(1 for v in outcomes.values() if v == "OK")
            unavailable = sum(1 for v in outcomes.values() if v == "UNAVAILABLE")
            other = {k: v for k, v in outcomes.items() if v not in ("OK", "UNAVAILABLE")}
            lost = sent - len(outcomes)
            print(f"figures: kill: replica r{victim + 1} killed after ~20 of {sent} requests; "
                  f"OK {ok}, UNAVAILABLE {unavailable}, other {len(other)}, lost {lost}, "
                  f"client retries {retries[0]} ({time.time() - killed_at:.1f} s after the kill)",
                  flush=True)
            check(lost == 0, "no request lost")
            check(not other, f"every request ended OK or UNAVAILABLE, each once: {other}")
            check(ok >= sent - 2, f"all but a few succeeded on the other replicas ({ok} of {sent})")
        finally:
            if hap is not None and hap.poll() is None:
                hap.terminate()
                hap.wait(10)
            for r in replicas:
                r.stop()
            try:
                print("haproxy log (tail):\n" + "".join(open(os.path.join(tmp, "haproxy.log")).readlines()[-15:]))
            except OSError:
                pass
    return check.verdict()


if __name__ == "__main__":
    sys.exit(main())
