"""Writes the fuzz targets' seed corpora (tests/fuzz/corpus/<target>/): small valid inputs of every
kind each target understands, so that libFuzzer starts from the formats' structure instead of random
bytes. Committed together with its output; rerun only to change the seeds:

  .venv/bin/python -m grpc_tools.protoc -Iproto --python_out=/tmp/pb proto/maskd/v1/maskd.proto
  PYTHONPATH=/tmp/pb .venv/bin/python tests/fuzz/make_seeds.py tests/fuzz/corpus

Needs Pillow (with WebP), torch and the generated maskd_pb2.

Not written by this script, kept beside its output: inputs that found something, as regression cases
(fuzz_checkpoint/torch_zip_reader_leak: a damaged zip on which LibTorch's reader leaks, see
RELIABILITY.md and tests/fuzz/lsan.supp; fuzz_checkpoint/zip_size_lie: state_dict.pth whose central
directory declares 2.2 GB for its version record, which LibTorch's reader allocated before reading).
"""
import io
import json
import os
import struct
import sys

import torch
from PIL import Image

from maskd.v1 import maskd_pb2 as pb

out = sys.argv[1]


def put(target, name, data):
    os.makedirs(os.path.join(out, target), exist_ok=True)
    with open(os.path.join(out, target, name), "wb") as f:
        f.write(data)


def image(mode, size=(7, 5)):
    im = Image.new("RGB", size)
    for y in range(size[1]):
        for x in range(size[0]):
            im.putpixel((x, y), (x * 30 % 256, y * 50 % 256, (x + y) * 20 % 256))
    return im.convert(mode)


def save(im, fmt, **kw):
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


# --- images: every decoder path --------------------------------------------------------------------
imgs = {
    "rgb.png": save(image("RGB"), "PNG"),
    "rgba.png": save(image("RGBA"), "PNG"),
    "grey.png": save(image("L"), "PNG"),
    "grey_alpha.png": save(image("LA"), "PNG"),
    "palette.png": save(image("P"), "PNG"),
    "bilevel.png": save(image("1"), "PNG"),
    "grey16.png": save(image("L").convert("I"), "PNG"),  # Pillow writes mode I as 16-bit grey
    "rgb_square.png": save(image("RGB", (9, 9)), "PNG"),
    "rgb.jpg": save(image("RGB"), "JPEG", quality=80),
    "grey.jpg": save(image("L"), "JPEG"),
    "cmyk.jpg": save(image("CMYK"), "JPEG"),
    "progressive.jpg": save(image("RGB"), "JPEG", progressive=True),
    "lossy.webp": save(image("RGB"), "WEBP", quality=50),
    "lossless.webp": save(image("RGBA"), "WEBP", lossless=True),
}
for orientation in (3, 6, 8):
    exif = Image.Exif()
    exif[0x0112] = orientation
    imgs[f"exif{orientation}.jpg"] = save(image("RGB"), "JPEG", exif=exif.tobytes())
for name, data in imgs.items():
    put("fuzz_image_decode", name, data)

# --- RLE: counts strings (odd first byte) and masks (even first byte) --------------------------------
for i, counts in enumerate([b"0", b"52203", b"05<0`0", b"PPYo0", b"1O1N1O1", b"Y2a0O1O1000O1N2M3"]):
    put("fuzz_rle", f"counts{i}", bytes([1, 7, 5]) + counts)
put("fuzz_rle", "mask_square", bytes([0, 7]) + bytes([1 if 2 <= x <= 4 and 1 <= y <= 3 else 0
                                                        for y in range(5) for x in range(7)]))
put("fuzz_rle", "mask_stripes", bytes([0, 3]) + bytes([(i // 2) % 2 * 255 for i in range(30)]))

# --- requests: Segment (0), a stream follow-up (1), Embed (2) ------------------------------------------
def seg(**kw):
    return pb.SegmentRequest(**kw)


small_png = save(image("RGB", (4, 3)), "PNG")
raw = pb.Image(raw=pb.RawImage(width=4, height=3, rgb=bytes(range(36))))
point = pb.Prompt(points=[pb.Point(x=1.5, y=2, label=1), pb.Point(x=0, y=0, label=pb.POINT_LABEL_BACKGROUND)], multimask=True)
box = pb.Prompt(box=pb.Box(x0=0, y0=0, x1=3, y1=2))
logits = pb.Prompt(points=[pb.Point(x=1, y=1, label=1)],
                   mask_input=pb.MaskInput(logits=pb.LowResLogits(width=256, height=256,
                                                                  values=[0.5] * 65536)))
result = pb.Prompt(points=[pb.Point(x=1, y=1, label=1)],
                   mask_input=pb.MaskInput(result_id="r" * 32, mask_index=1))
requests = {
    "segment_raw_points": (0, seg(image=raw, prompts=[point])),
    "segment_png_box": (0, seg(image=pb.Image(encoded=small_png), prompts=[box],
                              output_format=pb.OUTPUT_FORMAT_PNG)),
    "segment_id_result": (0, seg(image_id="ab" * 32, prompts=[result], request_tag="tag")),
    "segment_logits": (0, seg(image=raw, prompts=[logits], output_format=pb.OUTPUT_FORMAT_LOW_RES_LOGITS)),
    "segment_polygons": (0, seg(image=raw, prompts=[point, box], output_format=pb.OUTPUT_FORMAT_POLYGONS,
                                polygon_tolerance=1.5)),
    "stream_follow_up": (1, seg(prompts=[point])),
    "stream_image_only": (1, seg(image=raw)),
    "embed_png": (2, pb.EmbedRequest(image=pb.Image(encoded=small_png))),
    "embed_raw": (2, pb.EmbedRequest(image=raw)),
}
for name, (kind, msg) in requests.items():
    put("fuzz_request", name, bytes([kind]) + msg.SerializeToString())

# --- checkpoints: torch.save zips and safetensors -------------------------------------------------------
def torch_save(obj):
    b = io.BytesIO()
    torch.save(obj, b)
    return b.getvalue()


put("fuzz_checkpoint", "state_dict.pth", torch_save({"w": torch.arange(6, dtype=torch.float32).view(2, 3),
                                                     "b": torch.tensor([1, 2], dtype=torch.int64)}))
put("fuzz_checkpoint", "view.pth", torch_save({"v": torch.arange(8, dtype=torch.float16)[2:6]}))
put("fuzz_checkpoint", "shared.pth", torch_save({"a": (t := torch.ones(3)), "b": t}))


def safetensors(tensors):
    header, blob = {}, b""
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + blob


put("fuzz_checkpoint", "two.safetensors", safetensors({
    "w": ("F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)),
    "i": ("I64", [1], struct.pack("<q", 7)),
}))
put("fuzz_checkpoint", "meta.safetensors",
    (lambda h: struct.pack("<Q", len(h)) + h + struct.pack("<2e", 1, 2))(
        json.dumps({"__metadata__": {"format": "pt"},
                    "h": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}).encode()))
