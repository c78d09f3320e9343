"""The Python client's pure parts: prompt building, request building, mask decoding."""
import io

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as mask_utils

from maskd_client import maskd_pb2
from maskd_client.client import _mask_from_proto, build_prompt, build_segment_request


def test_build_prompt_labels_box_and_mask_input():
    p = build_prompt([(1, 2), (3, 4, 0)], box=(0, 1, 5, 6), mask_from="r1", mask_index=2, multimask=True)
    assert [pt.label for pt in p.points] == [maskd_pb2.POINT_LABEL_FOREGROUND, maskd_pb2.POINT_LABEL_BACKGROUND]
    assert (p.box.x0, p.box.y0, p.box.x1, p.box.y1) == (0, 1, 5, 6)
    assert p.mask_input.result_id == "r1" and p.mask_input.HasField("mask_index")
    assert p.multimask
    q = build_prompt([(1, 2)])
    assert not q.HasField("box") and not q.HasField("mask_input")


@pytest.mark.parametrize("bad", [dict(points=[(1,)]), dict(points=[(1, 2, 5)]), dict(box=(1, 2, 3))])
def test_build_prompt_rejects_bad_input(bad):
    with pytest.raises(ValueError):
        build_prompt(**bad)


def test_build_segment_request_image_forms():
    assert build_segment_request(b"\xff\xd8", []).image.encoded == b"\xff\xd8"
    assert build_segment_request("abc", []).image_id == "abc"
    assert build_segment_request(None, []).WhichOneof("image_source") is None
    assert build_segment_request("abc", [], format="png").output_format == maskd_pb2.OUTPUT_FORMAT_PNG
    with pytest.raises(ValueError):
        build_segment_request("abc", [], format="jpeg")
    with pytest.raises(TypeError):
        build_segment_request(3, [])


def test_mask_decoding_rle_and_png_agree():
    h, w = 30, 40
    dense = np.zeros((h, w), dtype=np.uint8)
    dense[5:20, 7:33] = 1
    dense[25, 0] = 1
    rle = mask_utils.encode(np.asfortranarray(dense))
    m = maskd_pb2.MaskResult(score=0.9, area=int(dense.sum()))
    m.rle.size.extend([h, w])
    m.rle.counts = rle["counts"].decode("ascii")
    buf = io.BytesIO()
    Image.fromarray(dense * 255).convert("1").save(buf, format="PNG")
    n = maskd_pb2.MaskResult(score=0.9, area=int(dense.sum()), png=buf.getvalue())
    a, b = _mask_from_proto(m, w, h), _mask_from_proto(n, w, h)
    np.testing.assert_array_equal(a.decode(), dense)
    np.testing.assert_array_equal(b.decode(), dense)
