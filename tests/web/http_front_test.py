"""maskd's HTTP front through real HTTP against a CPU maskd (demo model): the JSON routes answer what
the gRPC calls answer (same image ids, same masks), polygons included; bad input gets the gRPC error
code name and its HTTP status; the page is served from the binary and fetches nothing from elsewhere.

Run: python -m pytest http_front_test.py --maskd BUILD/server/maskd --maskctl BUILD/client/maskctl
"""
import base64
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest
from pycocotools import mask as mask_util

sys.path.insert(0, os.path.dirname(__file__))
from maskd_demo import DemoMaskd, write_test_image  # noqa: E402


@pytest.fixture(scope="module")
def maskd(request):
    # Small request limits keep the HTTP body limit (derived from them) small enough to test.
    with DemoMaskd(request.config.getoption("--maskd"), http=True,
                   extra_args=["--max-prompts-per-request", "4", "--max-image-bytes", "200000",
                               "--max-image-pixels", "40000"]) as m:
        yield m


@pytest.fixture(scope="module")
def png(tmp_path_factory):
    path = tmp_path_factory.mktemp("img") / "picture.png"
    write_test_image(path)
    return path


def http(maskd, method, path, body=None, headers=None, raw=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(maskd.http_base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def post(maskd, path, body, **kw):
    status, headers, data = http(maskd, "POST", path, body, **kw)
    return status, headers, json.loads(data)


def maskctl_json(request, maskd, *args):
    r = subprocess.run([request.config.getoption("--maskctl"), "--server", maskd.target, *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def embed(maskd, png):
    status, headers, r = post(maskd, "/v1/embed", {"image": {"encoded": base64.b64encode(png.read_bytes()).decode()}})
    assert status == 200, r
    return r


def test_embed_gives_the_grpc_image_id(request, maskd, png):
    r = embed(maskd, png)
    assert re.fullmatch(r"[0-9a-f]{64}", r["image_id"])
    assert (r["width"], r["height"]) == (160, 120)
    assert isinstance(r["timing"]["total_us"], str)  # proto3 JSON: 64-bit integers are strings
    grpc = json.loads(maskctl_json(request, maskd, "embed", str(png), "--json"))
    assert grpc["image_id"] == r["image_id"]
    assert grpc["cached"] is True  # the HTTP call embedded it: one cache, one service


def test_segment_over_http_equals_segment_over_grpc(request, maskd, png, tmp_path):
    image_id = embed(maskd, png)["image_id"]
    prompt = {"points": [{"x": 60, "y": 30, "label": "POINT_LABEL_FOREGROUND"},
                         {"x": 120, "y": 100, "label": "POINT_LABEL_BACKGROUND"}], "multimask": True}
    status, headers, r = post(maskd, "/v1/segment", {"image_id": image_id, "prompts": [prompt]})
    assert status == 200, r
    assert headers.get("x-request-id")
    out = tmp_path / "grpc.json"
    maskctl_json(request, maskd, "segment", "--image-id", image_id, "--point", "60,30", "--point",
                 "120,100,0", "--multimask", "--out-json", str(out))
    grpc = json.loads(out.read_text())
    assert len(r["results"][0]["masks"]) == 3
    for mh, mg in zip(r["results"][0]["masks"], grpc["results"][0]["masks"]):
        assert mh["rle"] == mg["rle"]
        assert mh["area"] == mg["area"]
        assert mh["score"] == pytest.approx(mg["score"])
        m = mask_util.decode({"size": mh["rle"]["size"], "counts": mh["rle"]["counts"].encode()})
        assert int(m.sum()) == int(mh["area"])


def test_polygons_over_http(maskd, png):
    image_id = embed(maskd, png)["image_id"]
    body = {"image_id": image_id, "prompts": [{"points": [{"x": 60, "y": 30}]}]}
    _, _, rle = post(maskd, "/v1/segment", body)
    status, _, poly = post(maskd, "/v1/segment", {**body, "output_format": "OUTPUT_FORMAT_POLYGONS"})
    assert status == 200, poly
    m = rle["results"][0]["masks"][0]
    expected = mask_util.decode({"size": m["rle"]["size"], "counts": m["rle"]["counts"].encode()})
    polygons = poly["results"][0]["masks"][0]["polygons"]["polygons"]
    assert polygons
    # Rasterise: outer contours add, holes subtract (pixel-corner vertices, as pycocotools reads them).
    h, w = expected.shape
    got = np.zeros((h, w), np.int32)
    for p in polygons:
        piece = mask_util.decode(mask_util.frPyObjects([p["points"]], h, w))[:, :, 0].astype(np.int32)
        got += -piece if p["hole"] else piece
    np.testing.assert_array_equal(got.clip(0, 1), expected)
    status, _, coarse = post(maskd, "/v1/segment", {**body, "output_format": "OUTPUT_FORMAT_POLYGONS",
                                                   "polygon_tolerance": 2.0})
    assert status == 200
    n = lambda r: sum(len(p["points"]) for p in r["results"][0]["masks"][0]["polygons"]["polygons"])
    assert n(coarse) < n(poly)


def error_of(maskd, path, body=None, raw=None, method="POST"):
    status, headers, data = http(maskd, method, path, body, raw=raw)
    doc = json.loads(data)
    assert set(doc) == {"error"}, doc
    e = doc["error"]
    assert e["code"] == status
    return status, e["status"], e["message"]


def test_bad_input_gets_the_grpc_code_and_its_http_status(maskd, png):
    image_id = embed(maskd, png)["image_id"]
    click = {"points": [{"x": 5, "y": 5}]}
    cases = [
        ("not json", dict(raw=b"{nope"), 400, "INVALID_ARGUMENT", "request body is not a maskd.v1.SegmentRequest"),
        ("unknown field", dict(body={"image_id": image_id, "prompts": [click], "bogus": 1}), 400,
         "INVALID_ARGUMENT", "bogus"),
        ("no image", dict(body={"prompts": [click]}), 400, "INVALID_ARGUMENT", "image_source"),
        ("no prompts", dict(body={"image_id": image_id}), 400, "INVALID_ARGUMENT", "prompts has 0 prompts"),
        ("too many prompts", dict(body={"image_id": image_id, "prompts": [click] * 5}), 400,
         "INVALID_ARGUMENT", "expected 1 .. 4"),
        ("outside the image", dict(body={"image_id": image_id, "prompts": [{"points": [{"x": 500, "y": 5}]}]}),
         400, "INVALID_ARGUMENT", "prompts[0].points[0]"),
        ("bad tolerance", dict(body={"image_id": image_id, "prompts": [click],
                                     "output_format": "OUTPUT_FORMAT_POLYGONS", "polygon_tolerance": -1}),
         400, "INVALID_ARGUMENT", "polygon_tolerance = -1"),
        ("unknown image", dict(body={"image_id": "a" * 64, "prompts": [click]}), 404, "NOT_FOUND",
         "re-send the image bytes"),
        # The same byte limit as gRPC: --max-image-bytes 200000.
        ("image over the limit", dict(body={"image": {"encoded": base64.b64encode(b"\x89PNG" + bytes(300000)).decode()},
                                            "prompts": [click]}), 400, "INVALID_ARGUMENT", "200000"),
    ]
    for name, kw, want_status, want_code, want_text in cases:
        status, code, message = error_of(maskd, "/v1/segment", **kw)
        assert (status, code) == (want_status, want_code), (name, status, code, message)
        assert want_text in message, (name, message)
    assert error_of(maskd, "/v1/embed", body={})[:2] == (400, "INVALID_ARGUMENT")
    assert error_of(maskd, "/v1/segment", method="GET")[:2] == (405, "UNIMPLEMENTED")
    assert error_of(maskd, "/v1/nothing", method="GET")[:2] == (404, "NOT_FOUND")
    # A body over the HTTP front's own limit (derived from the request limits) never reaches the service.
    status, code, _ = error_of(maskd, "/v1/segment", raw=b" " * (8 << 20))
    assert (status, code) == (413, "RESOURCE_EXHAUSTED")


def test_info_counts_the_http_calls_and_reports_the_limits(maskd):
    status, _, data = http(maskd, "GET", "/v1/info")
    assert status == 200
    info = json.loads(data)
    assert info["model"]["demo"] is True
    assert info["limits"]["max_prompts_per_request"] == 4
    assert info["limits"]["max_image_bytes"] == "200000"
    assert int(info["calls"]) >= 1


def test_request_id_is_passed_through(maskd):
    status, headers, _ = http(maskd, "GET", "/v1/info", headers={"x-request-id": "web-test-42"})
    assert status == 200
    assert headers.get("x-request-id") == "web-test-42"


def test_page_is_served_and_self_contained(maskd):
    status, headers, data = http(maskd, "GET", "/")
    assert status == 200
    assert headers["Content-Type"].startswith("text/html")
    page = data.decode()
    for needle in ('id="overlay"', 'id="file"', "/v1/embed", "/v1/segment", "download-coco"):
        assert needle in page, needle
    # No CDN, no external script, style or font.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "import " not in page
