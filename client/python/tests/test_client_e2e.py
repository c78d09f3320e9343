"""The Python client against a real maskd (CPU, the tiny golden model, loopback, ephemeral port).

Masks are checked with pycocotools: shape, area and bbox against the server's own numbers, PNG ==
RLE for the same prompt, the golden masks of the original SAM for every case, and error codes.
"""
import json
import os
import subprocess
import sys

import grpc
import numpy as np
import pytest
from pycocotools import mask as mask_utils

from maskd_client import AFFINITY_HEADER, MaskdClient, maskd_pb2_grpc


def _manifest(golden_dir):
    with open(os.path.join(golden_dir, "manifest.json")) as f:
        return json.load(f)


def _image_bytes(golden_dir, name):
    with open(os.path.join(golden_dir, f"{name}.png"), "rb") as f:
        return f.read()


def _points(case):
    return [(x, y, l) for (x, y), l in zip(case.get("points", []), case.get("labels", []))]


def _bbox_of(m):
    ys, xs = np.nonzero(m)
    if len(xs) == 0:
        return (0, 0, 0, 0)
    return (int(xs.min()), int(ys.min()), int(xs.max() - xs.min() + 1), int(ys.max() - ys.min() + 1))


def test_health_and_info(client):
    assert client.health() == "SERVING"
    info = client.info()
    assert info.model.encoder_embed_dim == 96
    assert info.model.encoder_depth == 4
    assert list(info.model.encoder_global_attn_indexes) == [1, 3]
    assert info.precision == "fp32"


def test_rle_masks_are_consistent(client, golden_dir):
    im = _manifest(golden_dir)["images"][0]
    data = _image_bytes(golden_dir, im["name"])
    case = im["cases"][0]
    r = client.segment(data, points=_points(case), multimask=True, format="rle")
    assert (r.width, r.height) == (im["width"], im["height"])
    assert len(r.image_id) == 64
    assert len(r.prompts) == 1 and len(r.prompts[0].masks) == 3
    assert r.prompts[0].best_index == int(np.argmax([m.score for m in r.prompts[0].masks]))
    for m in r.prompts[0].masks:
        assert m.rle["size"] == [im["height"], im["width"]]
        dense = mask_utils.decode(m.rle)
        assert dense.shape == (im["height"], im["width"])
        assert int(dense.sum()) == m.area
        assert int(mask_utils.area(m.rle)) == m.area
        assert _bbox_of(dense) == m.bbox
        if m.area:
            assert tuple(int(v) for v in mask_utils.toBbox(m.rle)) == m.bbox
        assert 0.0 <= m.stability_score <= 1.0
        assert np.isfinite(m.score)


def test_png_output_equals_rle_output(client, golden_dir):
    im = _manifest(golden_dir)["images"][1]
    data = _image_bytes(golden_dir, im["name"])
    case = im["cases"][3]  # background point + box, multimask
    kwargs = dict(points=_points(case), box=tuple(case["box"]), multimask=case["multimask"])
    rle = client.segment(data, format="rle", **kwargs)
    png = client.segment(data, format="png", **kwargs)
    assert png.cached  # the second call found the embedding
    for a, b in zip(rle.prompts[0].masks, png.prompts[0].masks):
        assert b.png is not None and b.png.startswith(b"\x89PNG")
        np.testing.assert_array_equal(a.decode(), b.decode())
        assert a.area == b.area and a.bbox == b.bbox


def test_polygon_output_equals_rle_output(client, golden_dir):
    # Issue #15: polygons (outer contours and holes) decode to exactly the RLE mask at tolerance 0.
    im = _manifest(golden_dir)["images"][1]
    data = _image_bytes(golden_dir, im["name"])
    case = im["cases"][3]
    kwargs = dict(points=_points(case), box=tuple(case["box"]), multimask=case["multimask"])
    rle = client.segment(data, format="rle", **kwargs)
    poly = client.segment(data, format="polygons", **kwargs)
    coarse = client.segment(data, format="polygons", polygon_tolerance=2.0, **kwargs)
    for a, b, c in zip(rle.prompts[0].masks, poly.prompts[0].masks, coarse.prompts[0].masks):
        assert b.polygons
        np.testing.assert_array_equal(a.decode(), b.decode())
        assert sum(len(p["points"]) for p in c.polygons) < sum(len(p["points"]) for p in b.polygons)


def test_logits_output(client, golden_dir):
    im = _manifest(golden_dir)["images"][0]
    r = client.segment(_image_bytes(golden_dir, im["name"]), points=[(100, 100, 1)], format="logits")
    m = r.prompts[0].masks[0]
    assert m.low_res_logits.shape == (256, 256)
    assert m.rle is None and m.png is None
    with pytest.raises(ValueError):
        m.decode()


def test_masks_match_golden(client, golden_dir):
    """Every prompt case of every golden image, through gRPC, against the original SAM's masks."""
    torch = pytest.importorskip("torch")
    for im in _manifest(golden_dir)["images"]:
        ref = torch.load(os.path.join(golden_dir, im["tensors"]), weights_only=True)
        data = _image_bytes(golden_dir, im["name"])
        image_id = client.embed(data).image_id
        results = []
        for k, case in enumerate(im["cases"]):
            mask_from = results[case["mask_from"]].result_id if "mask_from" in case else None
            r = client.segment(image_id, points=_points(case), box=tuple(case["box"]) if "box" in case else None,
                               mask_from=mask_from, multimask=case["multimask"], format="rle")
            pr = r.prompts[0]
            results.append(pr)
            want_masks = ref[f"case{k}.masks"].numpy()
            want_iou = ref[f"case{k}.iou_predictions"].numpy()
            assert len(pr.masks) == want_masks.shape[0], (im["name"], k)
            for j, m in enumerate(pr.masks):
                got = m.decode()
                differing = float(np.mean(got != want_masks[j]))
                assert differing <= 1e-3, f"{im['name']} case{k} mask{j}: {differing:.4%} pixels differ"
                assert abs(m.score - float(want_iou[j])) <= 1e-4, (im["name"], k, j, m.score, want_iou[j])


def test_session_keeps_the_image(client, golden_dir):
    im = _manifest(golden_dir)["images"][2]
    with client.session() as s:
        first = s.send(_image_bytes(golden_dir, im["name"]), points=[(50, 50, 1)], multimask=True)
        second = s.send(None, points=[(700, 100, 1)], mask_from=first.prompts[0].result_id)
        assert second.image_id == first.image_id
        assert second.cached
        with pytest.raises(s.StreamError) as e:
            s.send(None, points=[(1e6, 1, 1)])
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        third = s.send(None, points=[(10, 10, 1)])  # the stream survived the bad message
        assert len(third.prompts) == 1


class _HeaderRecorder(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Records the metadata each call leaves the client with."""

    def __init__(self):
        self.calls = []  # (method, x-maskd-image-id or None)

    def _note(self, details):
        md = dict(details.metadata or ())
        self.calls.append((details.method.rsplit("/", 1)[-1], md.get(AFFINITY_HEADER)))

    def intercept_unary_unary(self, continuation, details, request):
        self._note(details)
        return continuation(details, request)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        self._note(details)
        return continuation(details, request_iterator)


def test_affinity_header_is_the_servers_image_id(maskd_target, golden_dir):
    im = _manifest(golden_dir)["images"][1]
    data = _image_bytes(golden_dir, im["name"])
    rec = _HeaderRecorder()
    with MaskdClient(maskd_target, timeout=120) as c:
        c.stub = maskd_pb2_grpc.MaskServiceStub(grpc.intercept_channel(c._channel, rec))
        e = c.embed(data)
        assert rec.calls[-1] == ("Embed", e.image_id)
        assert rec.calls[-2] == ("GetInfo", None)  # the identity, asked for once
        r = c.segment(e.image_id, points=[(10, 10, 1)])
        assert rec.calls[-1] == ("Segment", r.image_id) and r.image_id == e.image_id
        other = _image_bytes(golden_dir, _manifest(golden_dir)["images"][2]["name"])
        r = c.segment(other, points=[(10, 10, 1)])  # other bytes: another id
        assert rec.calls[-1] == ("Segment", r.image_id) and r.image_id != e.image_id
        with c.session() as s:
            first = s.send(data, points=[(5, 5, 1)])
        assert rec.calls[-1] == ("SegmentStream", first.image_id) and first.image_id == e.image_id
        assert [m for m, _ in rec.calls].count("GetInfo") == 1


@pytest.mark.parametrize("what", ["unknown_image_id", "unknown_result_id", "point_outside", "no_prompt",
                                  "not_an_image"])
def test_errors_have_the_right_code(client, golden_dir, what):
    im = _manifest(golden_dir)["images"][0]
    data = _image_bytes(golden_dir, im["name"])
    with pytest.raises(grpc.RpcError) as e:
        if what == "unknown_image_id":
            client.segment("0" * 64, points=[(1, 1, 1)])
        elif what == "unknown_result_id":
            client.segment(data, points=[(1, 1, 1)], mask_from="no-such-result")
        elif what == "point_outside":
            client.segment(data, points=[(im["width"] + 50, 1, 1)])
        elif what == "no_prompt":
            client.segment_prompts(data, [])
        elif what == "not_an_image":
            client.embed(b"definitely not an image")
    want = {"unknown_image_id": grpc.StatusCode.NOT_FOUND, "unknown_result_id": grpc.StatusCode.NOT_FOUND,
            "point_outside": grpc.StatusCode.INVALID_ARGUMENT, "no_prompt": grpc.StatusCode.INVALID_ARGUMENT,
            "not_an_image": grpc.StatusCode.INVALID_ARGUMENT}[what]
    assert e.value.code() == want, e.value.details()
    assert e.value.details()  # a message that says what is wrong


def test_example_script(maskd_target, golden_dir, tmp_path):
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "segment_click.py")
    out = tmp_path / "overlay.png"
    r = subprocess.run([sys.executable, example, "--server", maskd_target,
                        os.path.join(golden_dir, "image0.png"), "--point", "157,266", "--out", str(out)],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": os.path.join(os.path.dirname(__file__), "..")})
    assert r.returncode == 0, r.stderr
    assert "score" in r.stdout
    assert out.read_bytes().startswith(b"\x89PNG")


def test_generate_everything(client, golden_dir):
    """GenerateMasks through the Python client: records with the original generator's fields, masks
    that decode to their area and bbox (the original's XYWH: x1 - x0 of the inclusive corners), the
    same masks by image_id and as polygons, and errors as typed exceptions."""
    from maskd_client import FailedPrecondition, InvalidArgument, NotFound

    im = _manifest(golden_dir)["images"][0]
    data = _image_bytes(golden_dir, im["name"])
    params = dict(points_per_side=8, pred_iou_thresh=0.0, stability_score_thresh=0.03, box_nms_thresh=1.0)
    r = client.generate(data, request_tag="py", **params)
    assert (r.width, r.height) == (im["width"], im["height"]) and r.request_tag == "py"
    assert len(r.masks) >= 2 and r.response.stats.points == 64
    for g in r.masks:
        rec = g.record()
        assert set(rec) == {"segmentation", "area", "bbox", "predicted_iou", "point_coords",
                            "stability_score", "crop_box"}
        m = rec["segmentation"]
        assert m.shape == (im["height"], im["width"]) and m.dtype == bool
        assert int(m.sum()) == rec["area"]
        x, y, w, h = _bbox_of(m)
        assert rec["bbox"] == [x, y, w - 1, h - 1]
        assert rec["crop_box"] == [0, 0, im["width"], im["height"]]
        (px, py), = rec["point_coords"]
        assert 0 <= px <= im["width"] and 0 <= py <= im["height"]
    by_id = client.generate(r.image_id, **params)
    assert by_id.cached
    assert [g.rle for g in by_id.masks] == [g.rle for g in r.masks]
    polys = client.generate(r.image_id, format="polygons", **params)
    for a, b in zip(polys.masks, r.masks):
        np.testing.assert_array_equal(a.decode(), b.decode())
    with pytest.raises(InvalidArgument, match="params.points_per_side = 0"):
        client.generate(r.image_id, points_per_side=0)
    with pytest.raises(FailedPrecondition, match="params.crop_n_layers"):
        client.generate(r.image_id, crop_n_layers=1)
    with pytest.raises(NotFound):
        client.generate("f" * 64)
    with pytest.raises(ValueError, match="unknown generation parameter"):
        client.generate(r.image_id, points_per_sid=4)
