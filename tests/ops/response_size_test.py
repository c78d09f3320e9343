#!/usr/bin/env python3
"""A response over 4 MiB (gRPC clients' default receive limit): a client at that default fails with
RESOURCE_EXHAUSTED and a message that says which limit to raise, the server logs the response's size
against the request id, and maskd's own client (512 MiB) gets the answer.

6 prompts with multimask and low-res logits: 18 x 256 x 256 float32 = 4.5 MiB of logits.

usage: response_size_test.py MASKD_BINARY"""
import re
import sys
import time

from checks import Checks
from maskd_run import Maskd, maskd_client, test_png


def main():
    binary = sys.argv[1]
    check = Checks()

    png = test_png(seed=3)
    prompts = [maskd_client.client.build_prompt(points=[(20 + 6 * i, 30, 1)], multimask=True)
               for i in range(6)]
    with Maskd(binary) as m:
        r = m.client.segment_prompts(png, prompts, format="logits")
        check(len(r.prompts) == 6, "maskd's client (512 MiB limit) gets the 6 prompts' logits")
        with maskd_client.MaskdClient(m.target, timeout=60, max_message_bytes=4 << 20) as small:
            try:
                small.segment_prompts(png, prompts, format="logits")
                check(False, "a client at the 4 MiB default fails")
            except maskd_client.ResourceExhausted as e:
                print("   ", e)
                check("receive limit" in e.details() and "max_message_bytes" in e.details(),
                      "the error says which receive limit to raise")
        time.sleep(0.5)
        lines = [l for l in m.log() if "is over 4 MiB" in l]
        check(len(lines) >= 2 and all("response of " in l for l in lines),
              f"the server logged the oversized responses with their size: {lines[:1]}")
        # The same 6 prompts as one SegmentStream message: the stream's response carries the hint
        # too (its own request id), and a 1-prompt message stays under the limit and is not logged.
        req = maskd_client.client.build_segment_request(png, prompts, "logits")
        small_req = maskd_client.client.build_segment_request(png, prompts[:1], "logits")
        before = len(lines)
        out = list(m.client.stub.SegmentStream(iter([req, small_req]), timeout=120))
        check(len(out) == 2 and len(out[0].results) == 6 and not out[0].HasField("error"),
              "the stream answered the 6-prompt message")
        time.sleep(0.5)
        lines = [l for l in m.log() if "is over 4 MiB" in l]
        check(len(lines) == before + 1, f"one more oversized-response line for the stream "
              f"({before} -> {len(lines)})")
        stream_rids = {mm.group(1) for l in m.log()
                       for mm in [re.search(r"\[([^\[\]]+)\] access method=SegmentStream\.message", l)] if mm}
        over = re.search(r"\[([^\[\]]+)\] response of", lines[-1])
        check(over is not None and over.group(1) in stream_rids,
              f"the stream's line carries a stream message's request id: {lines[-1].strip()[:160]}")
        check(m.stop() == 0, "maskd exited 0")
    return check.verdict()


if __name__ == "__main__":
    sys.exit(main())
