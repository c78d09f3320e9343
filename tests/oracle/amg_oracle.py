#!/usr/bin/env python3
"""Oracle for GenerateMasks: the original SamAutomaticMaskGenerator on a golden folder's model.

Builds the golden model from manifest.json's config (make_golden.build_sam), loads its checkpoint,
runs segment_anything.SamAutomaticMaskGenerator with each case's parameters on image0.png and writes
the records (uncompressed COCO RLE) with the parameters used, for tests/model_generate_test.cc:

    amg_oracle.py --golden DIR --out FILE.json

The golden model has random weights: its predicted IoUs stay below ~0.55 and stability scores below
~0.2, so the default thresholds keep nothing (the "defaults" case checks exactly that) and the other
cases use loose thresholds. The min_mask_region_area case needs OpenCV (cv2, as the original does);
without it the case is written with "skipped".
"""

import argparse
import json
import os
import sys

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import build_sam  # noqa: E402

from segment_anything import SamAutomaticMaskGenerator  # noqa: E402

LOOSE = {"pred_iou_thresh": 0.0, "stability_score_thresh": 0.05}
# box_nms_thresh 1.0 keeps every mask that passes the filters (no IoU is > 1): the random model's
# masks mostly cover the whole image, so with NMS only one would survive, which tests little.
CASES = [
    ("defaults", {}),
    ("loose_10", dict(LOOSE, points_per_side=10)),
    ("no_nms_8", dict(LOOSE, points_per_side=8, stability_score_thresh=0.03, box_nms_thresh=1.0)),
    ("offset_batch", dict(LOOSE, points_per_side=6, points_per_batch=10, stability_score_offset=0.5,
                          pred_iou_thresh=0.3, box_nms_thresh=0.95)),
    ("crop_layer_1", dict(LOOSE, points_per_side=8, crop_n_layers=1, crop_n_points_downscale_factor=2,
                          stability_score_thresh=0.03, box_nms_thresh=1.0)),
    # Every crop's masks (no NMS at all): the crop-edge filter, uncropping and crop boxes in full.
    ("crop_layer_1_all", dict(LOOSE, points_per_side=4, crop_n_layers=1, stability_score_thresh=0.03,
                              box_nms_thresh=1.0, crop_nms_thresh=1.0)),
    ("min_region_area_all", dict(LOOSE, points_per_side=6, stability_score_thresh=0.03, box_nms_thresh=1.0,
                                 min_mask_region_area=2000)),
    ("min_region_area", dict(LOOSE, points_per_side=8, stability_score_thresh=0.03, box_nms_thresh=0.95,
                             min_mask_region_area=400)),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--golden", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    with open(os.path.join(args.golden, "manifest.json")) as f:
        manifest = json.load(f)
    sam = build_sam(manifest["config"])
    sam.load_state_dict(torch.load(os.path.join(args.golden, manifest["checkpoint"]), map_location="cpu"))
    sam.eval()
    image_name = manifest["images"][0]["png"]
    image = np.array(Image.open(os.path.join(args.golden, image_name)).convert("RGB"))
    try:
        import cv2  # noqa: F401
        have_cv2 = True
    except ImportError:
        have_cv2 = False
    out = {"image": image_name, "width": int(image.shape[1]), "height": int(image.shape[0]), "cases": []}
    only = set(filter(None, args.only.split(",")))
    for name, params in CASES:
        if only and name not in only:
            continue
        case = {"name": name, "params": params}
        if params.get("min_mask_region_area", 0) > 0 and not have_cv2:
            case["skipped"] = "cv2 (OpenCV) is not importable: the original's remove_small_regions needs it"
            out["cases"].append(case)
            continue
        gen = SamAutomaticMaskGenerator(sam, output_mode="uncompressed_rle", **params)
        with torch.no_grad():
            records = gen.generate(image)
        case["records"] = [{
            "counts": [int(c) for c in r["segmentation"]["counts"]],
            "size": [int(v) for v in r["segmentation"]["size"]],
            "area": int(r["area"]),
            "bbox": [int(v) for v in r["bbox"]],
            "predicted_iou": float(r["predicted_iou"]),
            "point": [float(v) for v in r["point_coords"][0]],
            "stability_score": float(r["stability_score"]),
            "crop_box": [int(v) for v in r["crop_box"]],
        } for r in records]
        print(f"{name}: {len(records)} masks", flush=True)
        out["cases"].append(case)
    with open(args.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
