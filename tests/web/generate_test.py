"""`maskctl everything` and POST /v1/generate against a real CPU maskd (demo model): a folder of images
with progress lines, and --out-coco a real COCO annotations file that pycocotools loads (JSON numbers,
images, annotations with segmentation/area/bbox/score, categories) whose masks are exactly the
server's; --format polygons exports the same masks; one bad image fails alone; the HTTP route gives
the same answer as gRPC.

Run: python -m pytest generate_test.py --maskd BUILD/server/maskd --maskctl BUILD/client/maskctl
"""
import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest
from pycocotools import mask as mask_util
from pycocotools.coco import COCO

sys.path.insert(0, os.path.dirname(__file__))
from maskd_demo import DemoMaskd, write_test_image  # noqa: E402

# The demo model's random weights give low scores: loose thresholds keep masks (the defaults keep none).
PARAMS = ["--points-per-side", "4", "--pred-iou-thresh", "0", "--stability-score-thresh", "0.02",
          "--box-nms-thresh", "1.0"]
JSON_PARAMS = {"points_per_side": 4, "pred_iou_thresh": 0, "stability_score_thresh": 0.02, "box_nms_thresh": 1.0}


@pytest.fixture(scope="module")
def maskd(request):
    with DemoMaskd(request.config.getoption("--maskd"), http=True) as m:
        yield m


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("pictures")
    write_test_image(d / "a.png", 160, 120)
    write_test_image(d / "b.png", 96, 128)
    (d / "notes.txt").write_text("not an image: skipped by extension")
    return d


def maskctl(request, maskd, *args, ok=True):
    cmd = [request.config.getoption("--maskctl"), "--server", maskd.target, "--timeout", "300", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if ok:
        assert r.returncode == 0, f"{cmd}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def test_folder_to_coco_loads_in_pycocotools(request, maskd, folder, tmp_path):
    coco_path, lines_path = tmp_path / "coco.json", tmp_path / "responses.jsonl"
    r = maskctl(request, maskd, "everything", str(folder), "--out-coco", str(coco_path),
                "--out-json", str(lines_path), *PARAMS)
    # Progress: one line per image, numbered, in name order.
    progress = [l for l in r.stdout.splitlines() if l.startswith("[")]
    assert [l.split("]")[0] + "]" for l in progress] == ["[1/2]", "[2/2]"], r.stdout
    assert "a.png" in progress[0] and "b.png" in progress[1] and "masks" in progress[0]
    doc = json.loads(coco_path.read_text())
    assert [c["id"] for c in doc["categories"]] == [1]
    assert [(i["id"], i["width"], i["height"]) for i in doc["images"]] == [(1, 160, 120), (2, 96, 128)]
    responses = [json.loads(l) for l in lines_path.read_text().splitlines()]
    assert len(responses) == 2
    assert len(doc["annotations"]) == sum(len(x.get("masks", [])) for x in responses) >= 2
    for a in doc["annotations"]:
        for key in ("id", "image_id", "category_id", "area", "iscrowd"):
            assert type(a[key]) is int, (key, a[key])  # not proto3 JSON's int64 strings
        assert all(type(v) is int for v in a["bbox"]) and len(a["bbox"]) == 4
        assert isinstance(a["score"], float) and isinstance(a["stability_score"], float)
        assert len(a["point_coords"]) == 1 and len(a["crop_box"]) == 4
    coco = COCO(str(coco_path))
    ann_id = 0
    for image_index, resp in enumerate(responses, start=1):
        assert coco.imgs[image_index]["file_name"].endswith(("a.png", "b.png"))
        for m in resp.get("masks", []):
            ann_id += 1
            ann = coco.anns[ann_id]
            assert ann["image_id"] == image_index
            server = mask_util.decode({"size": m["rle"]["size"], "counts": m["rle"]["counts"].encode()})
            np.testing.assert_array_equal(coco.annToMask(ann), server)
            assert ann["area"] == int(m["area"]) == int(server.sum())
            assert ann["bbox"] == [m["bbox"].get(k, 0) for k in ("x", "y", "width", "height")]
            assert abs(ann["score"] - m["predicted_iou"]) < 1e-6


def test_polygons_export_the_same_masks(request, maskd, folder, tmp_path):
    image = folder / "a.png"
    rle_path, poly_path = tmp_path / "rle.json", tmp_path / "poly.json"
    maskctl(request, maskd, "everything", str(image), "--out-coco", str(rle_path), *PARAMS)
    maskctl(request, maskd, "everything", str(image), "--out-coco", str(poly_path), "--format", "polygons",
            *PARAMS)
    rles, polys = COCO(str(rle_path)), COCO(str(poly_path))
    assert sorted(rles.anns) == sorted(polys.anns) and len(rles.anns) >= 2
    for i in rles.anns:
        assert isinstance(polys.anns[i]["segmentation"], (list, dict))
        np.testing.assert_array_equal(polys.annToMask(polys.anns[i]), rles.annToMask(rles.anns[i]))


def test_a_bad_image_fails_alone(request, maskd, folder, tmp_path):
    d = tmp_path / "mixed"
    d.mkdir()
    write_test_image(d / "good.png", 80, 60)
    (d / "broken.png").write_bytes(b"\x89PNG not really")
    coco_path = tmp_path / "mixed.json"
    r = maskctl(request, maskd, "everything", str(d), "--out-coco", str(coco_path), *PARAMS, ok=False)
    assert r.returncode == 1
    assert "broken.png" in r.stderr and "image.encoded" in r.stderr, r.stderr
    assert "1 of 2 images failed" in r.stderr
    doc = json.loads(coco_path.read_text())
    assert [i["file_name"].rsplit("/", 1)[-1] for i in doc["images"]] == ["good.png"]


def test_bad_parameters_name_the_field(request, maskd, folder):
    r = maskctl(request, maskd, "everything", str(folder / "a.png"), "--points-per-side", "0", ok=False)
    assert r.returncode == 1
    assert "params.points_per_side = 0" in r.stderr, r.stderr


def post(maskd, path, body):
    req = urllib.request.Request(maskd.http_base + path, method="POST", data=json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_http_generate_is_the_grpc_call(request, maskd, folder, tmp_path):
    image = folder / "a.png"
    lines_path = tmp_path / "grpc.jsonl"
    maskctl(request, maskd, "everything", str(image), "--out-json", str(lines_path), *PARAMS)
    (via_grpc,) = [json.loads(l) for l in lines_path.read_text().splitlines()]
    status, via_http = post(maskd, "/v1/generate", {"image": {"encoded": base64.b64encode(image.read_bytes()).decode()},
                                                    "params": JSON_PARAMS})
    assert status == 200, via_http
    assert via_http["image_id"] == via_grpc["image_id"] and via_http["cached"] is True
    assert [m["rle"] for m in via_http["masks"]] == [m["rle"] for m in via_grpc["masks"]]
    assert via_http["stats"]["points"] == 16
    status, err = post(maskd, "/v1/generate", {"image_id": via_http["image_id"],
                                               "params": {"crop_overlap_ratio": 1.5}})
    assert status == 400 and err["error"]["status"] == "INVALID_ARGUMENT"
    assert "params.crop_overlap_ratio = 1.5" in err["error"]["message"]
    status, err = post(maskd, "/v1/generate", {"image_id": "0" * 64})
    assert status == 404 and err["error"]["status"] == "NOT_FOUND"


def test_info_shows_the_generation_limits(request, maskd):
    r = maskctl(request, maskd, "info")
    assert "generation limits: 128 points/side, 16384 grid points, 1024 points/batch, 3 crop layers" in r.stdout, \
        r.stdout
