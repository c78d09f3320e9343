"""client/examples/label_studio and client/examples/cvat without the tools themselves: their
request -> maskd -> result conversion against a CPU maskd on the built-in demo model, checked
against maskd's own answer to the same prompt made directly."""
import base64
import importlib.util
import io
import json
import os

import numpy as np
import pytest
from PIL import Image

from maskd_client import MaskdClient

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def demo_target(request):
    from maskd_server import MaskdProcess, wait_serving
    binary = request.config.getoption("--maskd")
    if not binary or not os.access(binary, os.X_OK):
        if os.environ.get("CI") == "true":
            pytest.fail("maskd binary not found (required under CI=true)")
        pytest.skip("maskd binary not found (pass --maskd)")
    env_ckpt = os.environ.pop("MASKD_CHECKPOINT", None)
    try:
        with MaskdProcess(binary, None, extra_args=("--models-dir", "/nonexistent-maskd-models")) as s:
            with MaskdClient(s.target, timeout=120) as c:
                wait_serving(c)
            yield s.target
    finally:
        if env_ckpt is not None:
            os.environ["MASKD_CHECKPOINT"] = env_ckpt


@pytest.fixture()
def demo_client(demo_target):
    with MaskdClient(demo_target, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def picture(tmp_path_factory):
    """A 320x240 picture with a few shapes (the demo model's masks are meaningless but not empty)."""
    rng = np.random.default_rng(3)
    a = (rng.random((240, 320, 3)) * 60).astype(np.uint8)
    a[60:180, 80:220] = (200, 40, 40)
    a[100:140, 230:300] = (30, 200, 90)
    path = tmp_path_factory.mktemp("img") / "pic.png"
    Image.fromarray(a).save(path)
    return str(path)


def test_label_studio_backend_turns_percent_context_into_maskd_polygons(demo_client, picture):
    ls = _load("maskd_backend", "label_studio/maskd_backend.py")
    backend = ls.MaskdSamBackend(client=demo_client, from_name="label", to_name="image")
    assert backend.predict([{"data": {"image": picture}}], context=None) == []
    w, h = 320, 240
    # (The demo model's masks are speckled; this prompt's best mask has polygons at 1 px.)
    context = {"result": [
        {"type": "keypointlabels", "original_width": w, "original_height": h, "is_positive": True,
         "value": {"x": 12.5, "y": 25.0, "width": 0.5, "keypointlabels": ["Object"]}},
        {"type": "keypointlabels", "original_width": w, "original_height": h, "is_positive": False,
         "value": {"x": 80.0, "y": 50.0, "width": 0.5, "keypointlabels": ["Object"]}},
        {"type": "rectanglelabels", "original_width": w, "original_height": h,
         "value": {"x": 3.125, "y": 5.0, "width": 90.625, "height": 90.0, "rectanglelabels": ["Object"]}},
    ]}
    points, box, label, _, _ = backend.prompt_from_context(context)
    assert points == [(40.0, 60.0, 1), (256.0, 120.0, 0)]
    assert box == (10.0, 12.0, 300.0, 228.0) and label == "Object"

    preds = backend.predict([{"data": {"image": picture}}], context=context)
    assert len(preds) == 1 and preds[0]["model_version"] == "maskd"
    results = preds[0]["result"]

    direct = demo_client.segment(open(picture, "rb").read(), points=points, box=box,
                                 format="polygons", polygon_tolerance=1.0).prompts[0].best
    outers = [p["points"] for p in direct.polygons if not p["hole"]]
    assert len(results) == len(outers) and len(results) > 0
    for r, xy in zip(results, outers):
        assert r["type"] == "polygonlabels" and r["from_name"] == "label" and r["to_name"] == "image"
        assert r["value"]["polygonlabels"] == ["Object"] and r["value"]["closed"]
        assert r["original_width"] == w and r["original_height"] == h
        back = [c for x, y in r["value"]["points"] for c in (x * w / 100.0, y * h / 100.0)]
        assert np.allclose(back, xy, atol=1e-3)
        assert all(0 <= x <= 100 and 0 <= y <= 100 for x, y in r["value"]["points"])
    assert preds[0]["score"] == pytest.approx(direct.score)

    # A second click on the task goes by image_id (maskd already holds the embedding).
    assert picture in backend._image_ids
    again = backend.predict([{"data": {"image": picture}}], context=context)
    assert again[0]["result"] == results


class _Ctx:
    class user_data:  # noqa: N801 - nuclio's attribute name
        pass

    class Response:
        def __init__(self, body, headers, content_type, status_code):
            self.body, self.headers, self.content_type, self.status_code = (body, headers,
                                                                            content_type, status_code)


class _Event:
    def __init__(self, body):
        self.body = body


def test_cvat_interactor_returns_maskd_points_and_mask(demo_target, demo_client, picture):
    cvat = _load("cvat_main", "cvat/main.py")
    ctx = _Ctx()
    os.environ["MASKD_SERVER"] = demo_target
    try:
        cvat.init_context(ctx)
    finally:
        del os.environ["MASKD_SERVER"]
    png = open(picture, "rb").read()
    b64 = base64.b64encode(png).decode()
    # (The demo model's masks are speckled; with this box the best mask has polygons at 1 px.)
    body = {"image": b64, "pos_points": [[40, 40]], "neg_points": [],
            "obj_bbox": [[10, 10], [300, 230]]}
    resp = cvat.handler(ctx, _Event(json.dumps(body)))
    assert resp.status_code == 200 and resp.content_type == "application/json"
    out = json.loads(resp.body)

    direct = demo_client.segment(png, points=[(40, 40, 1)], box=(10, 10, 300, 230),
                                 format="polygons", polygon_tolerance=1.0).prompts[0].best
    mask = np.array(out["mask"], dtype=np.uint8)
    assert mask.shape == (240, 320)
    assert np.array_equal(mask, direct.decode().astype(np.uint8) * 255)
    outers = [p["points"] for p in direct.polygons if not p["hole"]]
    assert outers, "the prompt was chosen for a mask with polygons"
    largest = max(outers, key=cvat._area)
    assert out["points"] == [[largest[k], largest[k + 1]] for k in range(0, len(largest), 2)]
    assert len(out["points"]) >= 3
    assert out["score"] == pytest.approx(direct.score)

    # Points only (older CVAT, a dict body as nuclio may hand it): the mask is maskd's.
    clicks = cvat.handler(ctx, _Event({"image": b64, "pos_points": [[150, 110], [170, 130]],
                                       "neg_points": [[260, 120]]}))
    assert clicks.status_code == 200
    direct = demo_client.segment(png, points=[(150, 110, 1), (170, 130, 1), (260, 120, 0)],
                                 format="polygons", polygon_tolerance=1.0).prompts[0].best
    assert np.array_equal(np.array(json.loads(clicks.body)["mask"], dtype=np.uint8),
                          direct.decode().astype(np.uint8) * 255)
    # A body without prompts: 400 with the reason.
    bad = cvat.handler(ctx, _Event({"image": b64}))
    assert bad.status_code == 400 and "pos_points" in json.loads(bad.body)["error"]
