#!/usr/bin/env python3
"""GET /metrics of a running CPU maskd after real gRPC traffic: the text parses with the Prometheus
client's own parser, and the counters moved exactly with the calls made.

usage: metrics_scrape_test.py MASKD_BINARY"""
import sys
import time
import urllib.request

import grpc
from prometheus_client.parser import text_string_to_metric_families

from checks import Checks
from maskd_run import Maskd, maskd_client, test_png


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        assert r.status == 200, r.status
        ctype = r.headers.get("Content-Type", "")
        assert ctype.startswith("text/plain"), ctype
        text = r.read().decode("utf-8")
    samples = {}
    families = {}
    for family in text_string_to_metric_families(text):  # raises on a malformed exposition
        families[family.name] = family
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return families, samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def main():
    binary = sys.argv[1]
    check = Checks()

    with Maskd(binary, ["--metrics-listen", "127.0.0.1:0"], want_metrics=True) as m:
        _, before = scrape(m.metrics_port)
        c = m.client
        png_a, png_b = test_png(seed=0), test_png(seed=7)
        segments_ok = 0
        for png in (png_a, png_a, png_b):  # a: miss then hit; b: miss
            r = c.segment(png, points=[(40, 30, 1)])
            check(len(r.prompts) == 1, "Segment answered one prompt")
            segments_ok += 1
        c.embed(png_b)  # cached already: a hit
        c.info()
        try:  # a Segment without an image: INVALID_ARGUMENT, counted under its code
            c.stub.Segment(maskd_client.maskd_pb2.SegmentRequest(), timeout=30)
            check(False, "Segment without an image fails")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.INVALID_ARGUMENT, f"Segment without an image: {e.code()}")
        with c.session() as s:
            s.send(png_a, points=[(40, 30, 1)])
            s.send(None, points=[(50, 20, 1)])  # the stream's current image

        # A stream is counted in its reactor's OnDone, which gRPC may run just after the client
        # has seen the stream's status: wait for it, briefly.
        deadline = time.time() + 10
        while True:
            families, after = scrape(m.metrics_port)
            key = ("maskd_requests_total", (("code", "OK"), ("method", "SegmentStream")))
            if after.get(key, 0) > before.get(key, 0) or time.time() > deadline:
                break
            time.sleep(0.1)

        def moved(name, **labels):
            return value(after, name, **labels) - value(before, name, **labels)

        check(moved("maskd_requests_total", method="Segment", code="OK") == segments_ok,
              f"maskd_requests_total{{Segment,OK}} moved by {segments_ok}")
        check(moved("maskd_requests_total", method="Segment", code="INVALID_ARGUMENT") == 1,
              "maskd_requests_total{Segment,INVALID_ARGUMENT} moved by 1")
        check(moved("maskd_requests_total", method="Embed", code="OK") == 1,
              "maskd_requests_total{Embed,OK} moved by 1")
        check(moved("maskd_requests_total", method="SegmentStreamMessage", code="OK") == 2,
              "maskd_requests_total{SegmentStreamMessage,OK} moved by 2")
        check(moved("maskd_requests_total", method="SegmentStream", code="OK") == 1,
              "maskd_requests_total{SegmentStream,OK} moved by 1")
        # The client's own GetInfo (model identity) and ours: at least one.
        check(moved("maskd_requests_total", method="GetInfo", code="OK") >= 1,
              "maskd_requests_total{GetInfo,OK} moved")
        check(families["maskd_requests"].type == "counter", "maskd_requests is a counter")
        check(families["maskd_request_duration_seconds"].type == "histogram",
              "maskd_request_duration_seconds is a histogram")
        check(moved("maskd_request_duration_seconds_count", method="Segment") == segments_ok + 1,
              "Segment latency histogram counted every Segment call")
        check(value(after, "maskd_request_duration_seconds_sum", method="Segment") > 0,
              "Segment latency histogram has a positive sum (seconds)")
        check(value(after, "maskd_request_duration_seconds_bucket", method="Segment", le="+Inf")
              == value(after, "maskd_request_duration_seconds_count", method="Segment"),
              "the +Inf bucket equals the count")
        # Two different images reached the encoder (a and b), one pass each at least.
        enc = moved("maskd_encoder_batch_size_sum", device="cpu")
        check(enc == 2, f"encoder batch sizes sum to the 2 distinct images (got {enc})")
        dec = moved("maskd_decoder_batch_size_sum", device="cpu")
        check(dec == segments_ok + 2, f"decoder batch sizes sum to the {segments_ok + 2} prompts (got {dec})")
        check(moved("maskd_cache_misses_total", device="cpu") == 2, "cache misses moved by 2")
        hits = moved("maskd_cache_hits_total", device="cpu")
        check(hits >= 3, f"cache hits moved by >= 3 (a again, Embed b, the stream's a; got {hits})")
        check(value(after, "maskd_cache_bytes", device="cpu", tier="device") > 0,
              "the device tier holds embedding bytes")
        check(value(after, "maskd_cache_entries", device="cpu", tier="device") == 2,
              "the device tier holds the 2 embeddings")
        check(value(after, "maskd_queue_capacity", device="cpu", queue="encoder") == 64,
              "encoder queue capacity is the default 64")
        check(moved("maskd_stage_duration_seconds_count", device="cpu", stage="encoder_compute") == 2,
              "encoder_compute stage counted the 2 encodes")
        check(moved("maskd_stage_duration_seconds_count", device="cpu", stage="total") >= segments_ok,
              "total stage counted the calls")
        info = [s for s in families["maskd_model_info"].samples]
        check(len(info) == 1 and info[0].value == 1 and info[0].labels.get("demo") == "true"
              and info[0].labels.get("arch") == "tiny" and info[0].labels.get("precision") == "fp32",
              f"maskd_model_info reports the demo model: {info}")
        # Bounded label sets: no label value came from a request.
        methods = {v for (_, labels) in after for k, v in labels if k == "method"}
        check(methods <= {"Embed", "Segment", "GetInfo", "SegmentStream", "SegmentStreamMessage"},
              f"method labels are the service's methods only: {sorted(methods)}")
        code = m.stop()
        check(code == 0, f"maskd exited 0 on SIGTERM (got {code})")
    return check.verdict()


if __name__ == "__main__":
    sys.exit(main())
