"""maskctl segment --out-coco against a real CPU maskd (demo model): the file is a COCO annotations
JSON that pycocotools loads, with JSON numbers (not proto3-JSON int64 strings), and its masks are the
server's masks whatever the format (polygons with their holes, RLE, PNG).

Run: python -m pytest coco_export_test.py --maskd BUILD/server/maskd --maskctl BUILD/client/maskctl
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from pycocotools import mask as mask_util
from pycocotools.coco import COCO

sys.path.insert(0, os.path.dirname(__file__))
from maskd_demo import DemoMaskd, write_test_image  # noqa: E402


@pytest.fixture(scope="module")
def maskd(request):
    with DemoMaskd(request.config.getoption("--maskd")) as m:
        yield m


def maskctl(request, maskd, *args):
    cmd = [request.config.getoption("--maskctl"), "--server", maskd.target, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{cmd}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def segment(request, maskd, tmp_path, fmt, *extra):
    image = tmp_path / "picture.png"
    if not image.exists():
        write_test_image(image)
    coco = tmp_path / f"coco-{fmt}{'-'.join(extra)}.json"
    response = tmp_path / f"response-{fmt}{'-'.join(extra)}.json"
    maskctl(request, maskd, "segment", str(image), "--point", "60,30", "--point", "120,100,0",
            "--multimask", "--format", fmt, "--out-coco", str(coco), "--out-json", str(response), *extra)
    return coco, json.loads(response.read_text())


def test_coco_file_is_plain_numbers_and_complete(request, maskd, tmp_path):
    coco_path, _ = segment(request, maskd, tmp_path, "polygons")
    doc = json.loads(coco_path.read_text())
    assert [c["id"] for c in doc["categories"]] == [1]
    (image,) = doc["images"]
    assert (image["id"], image["width"], image["height"]) == (1, 160, 120)
    assert image["file_name"].endswith("picture.png")
    assert len(doc["annotations"]) == 3  # multimask: SAM's three candidates
    for a in doc["annotations"]:
        for key in ("id", "image_id", "category_id", "area", "iscrowd"):
            assert type(a[key]) is int, (key, a[key])  # proto3 JSON would write area as "123"
        assert all(type(v) is int for v in a["bbox"]) and len(a["bbox"]) == 4
        assert isinstance(a["score"], float)
        assert isinstance(a["segmentation"], (list, dict))
    assert sum(a["best"] for a in doc["annotations"]) == 1


def test_polygons_rle_and_png_give_the_same_masks_in_pycocotools(request, maskd, tmp_path):
    poly_path, poly_resp = segment(request, maskd, tmp_path, "polygons")
    rle_path, rle_resp = segment(request, maskd, tmp_path, "rle")
    png_path, _ = segment(request, maskd, tmp_path, "png")
    polys, rles, pngs = COCO(str(poly_path)), COCO(str(rle_path)), COCO(str(png_path))
    # The random demo weights give ragged masks: many pieces, holes, pieces on the image border and
    # 1-pixel features. The round trip must hold on all of them.
    holes = sum(p.get("hole", False) for m in poly_resp["results"][0]["masks"]
                for p in m["polygons"]["polygons"])
    pieces = [sum(not p.get("hole", False) for p in m["polygons"]["polygons"])
              for m in poly_resp["results"][0]["masks"]]
    assert holes > 0 and max(pieces) > 1, (holes, pieces)
    seen = {"border": False, "isolated pixel": False}
    for ann_id in polys.getAnnIds():
        a = polys.anns[ann_id]
        assert isinstance(a["segmentation"], list)  # polygon lists
        m_poly = polys.annToMask(a)
        m_rle = rles.annToMask(rles.anns[ann_id])
        m_png = pngs.annToMask(pngs.anns[ann_id])
        # The server's own RLE string, decoded by pycocotools directly.
        server = rle_resp["results"][0]["masks"][ann_id - 1]["rle"]
        m_server = mask_util.decode({"size": server["size"], "counts": server["counts"].encode()})
        np.testing.assert_array_equal(m_rle, m_server)
        np.testing.assert_array_equal(m_png, m_server)
        inter = np.logical_and(m_poly, m_server).sum()
        union = np.logical_or(m_poly, m_server).sum()
        iou = inter / union if union else 1.0
        assert iou >= 0.99, (ann_id, iou)
        assert (m_poly != m_server).sum() == 0  # tolerance 0 is exact, not merely close
        # Which hard cases these masks held: pieces cut by the image border, 1-pixel features.
        seen["border"] |= bool(m_server[0].any() or m_server[-1].any() or m_server[:, 0].any()
                               or m_server[:, -1].any())
        padded = np.pad(m_server, 1)
        neighbours = padded[:-2, 1:-1] + padded[2:, 1:-1] + padded[1:-1, :-2] + padded[1:-1, 2:]
        seen["isolated pixel"] |= bool(((m_server == 1) & (neighbours == 0)).any())
        assert a["area"] == int(m_server.sum())
        assert a["bbox"] == [int(v) for v in mask_util.toBbox(mask_util.encode(np.asfortranarray(m_server)))]
    assert all(seen.values()), seen


def test_tolerance_shrinks_the_polygons(request, maskd, tmp_path):
    _, exact = segment(request, maskd, tmp_path, "polygons")
    _, coarse = segment(request, maskd, tmp_path, "polygons", "--polygon-tolerance", "2")
    count = lambda r: sum(len(p["points"]) for m in r["results"][0]["masks"] for p in m["polygons"]["polygons"])
    assert count(coarse) < count(exact) / 2


def test_logits_cannot_be_exported(request, maskd, tmp_path):
    image = tmp_path / "p.png"
    write_test_image(image)
    r = subprocess.run([request.config.getoption("--maskctl"), "--server", maskd.target, "segment",
                        str(image), "--point", "5,5", "--format", "logits", "--out-coco",
                        str(tmp_path / "x.json")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "--out-coco needs --format rle, png or polygons" in r.stderr
