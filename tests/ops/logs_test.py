#!/usr/bin/env python3
"""Request-scoped logs of a running CPU maskd, in both --log-format text and json: every line of a
request's life (the RPC's access line, the pipeline's routing line, the encoder's and the decoder's
batch lines) carries the request id the client sent in x-request-id, which comes back in the initial
metadata; with json every line is one JSON object with ts, level, thread, msg.

usage: logs_test.py MASKD_BINARY"""
import json
import re
import sys
import time

from checks import Checks
from maskd_run import Maskd, maskd_client, test_png

pb = maskd_client.maskd_pb2


def traffic(m, request_id, seed):
    """One Segment on a new image (so the encoder runs for it) under `request_id`; returns the
    x-request-id of the response's initial metadata."""
    req = pb.SegmentRequest(image=pb.Image(encoded=test_png(seed=seed)),
                            prompts=[maskd_client.client.build_prompt(points=[(40, 30, 1)])])
    _, call = m.client.stub.Segment.with_call(req, timeout=60,
                                              metadata=[("x-request-id", request_id)])
    return dict(call.initial_metadata()).get("x-request-id")


def wait_for(m, pred, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred(m.log()):
            return True
        time.sleep(0.1)
    return False


def main():
    binary = sys.argv[1]
    check = Checks()

    # text: "[id] message"; a batch line lists the ids of its requests "[a,b] ".
    rid = "ops-text-1"
    with Maskd(binary, ["--log-format", "text", "--log-level", "debug"]) as m:
        check(traffic(m, rid, seed=1) == rid, "text: x-request-id comes back in the initial metadata")
        wait_for(m, lambda lines: any(f"[{rid}] access method=Segment" in l for l in lines))
        mine = [l for l in m.log() if re.search(r"\[([^\]]*,)?" + re.escape(rid) + r"(,[^\]]*)?\] ", l)]
        for what, needle in (("access line", "access method=Segment "),
                             ("pipeline routing line", "-> cpu: "),
                             ("encoder batch line", "encoder batch of 1 image"),
                             ("decoder batch line", "decoder batch of 1 prompt")):
            check(any(needle in l for l in mine), f"text: the {what} carries [{rid}]")
        stray = [l for l in m.log() if ("access method=Segment " in l or "batch of" in l)
                 and rid not in l]
        check(not stray, f"text: no request line without the id: {stray[:3]}")
        check(m.stop() == 0, "text: maskd exited 0")

    # json: one object per line; an id with a quote and a backslash must come out escaped, intact.
    rid = 'ops-"json"\\1'
    with Maskd(binary, ["--log-format", "json", "--log-level", "debug"]) as m:
        check(traffic(m, rid, seed=2) == rid, "json: x-request-id comes back in the initial metadata")
        wait_for(m, lambda lines: any("access method=Segment " in l for l in lines))
        m.stop()
        objects, bad = [], []
        for line in m.log():
            try:
                o = json.loads(line)
                if not isinstance(o, dict):
                    raise ValueError("not an object")
                objects.append(o)
            except ValueError:
                bad.append(line)
        check(not bad, f"json: every line is one JSON object ({len(objects)} lines; bad: {bad[:3]})")
        check(all({"ts", "level", "thread", "msg"} <= o.keys() for o in objects),
              "json: every line has ts, level, thread, msg")
        check(all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", o["ts"]) for o in objects),
              "json: ts is RFC 3339 UTC with milliseconds")
        check(any(o["msg"].startswith("listening on ") and "request_id" not in o for o in objects),
              "json: lines outside a request have no request_id")

        def of_request(o):
            return o.get("request_id") == rid or rid in o.get("request_ids", [])

        mine = [o for o in objects if of_request(o)]
        for what, needle in (("access line", "access method=Segment "),
                             ("pipeline routing line", "-> cpu: "),
                             ("encoder batch line", "encoder batch of 1 image"),
                             ("decoder batch line", "decoder batch of 1 prompt")):
            check(any(needle in o["msg"] for o in mine), f"json: the {what} has request_id {rid!r}")
        check(not any(rid in o["msg"] for o in mine), "json: the id is a field, not in msg")
    return check.verdict()


if __name__ == "__main__":
    sys.exit(main())
