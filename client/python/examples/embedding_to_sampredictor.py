#!/usr/bin/env python3
"""Example: the image embedding from maskd, the mask from the original SamPredictor.

maskd computes the embedding (Embed with return_embedding: bf16 is 2 MiB instead of 4 MiB of fp32);
the original `segment_anything.SamPredictor` on the same checkpoint decodes a click from it without
running the image encoder, and the mask is compared with the one maskd's own Segment returns.

    python client/python/examples/embedding_to_sampredictor.py --server localhost:50051 \\
        --checkpoint sam_vit_b_01ec64.pth --model-type vit_b photo.jpg --point 320,240

What SamPredictor needs besides the weights is exactly what set_image would have set:
    predictor.features      = the embedding, float32 [1, 256, 64, 64]
    predictor.input_size    = (input_height, input_width): the size after the longest-side resize
    predictor.original_size = (original_height, original_width)
    predictor.is_image_set  = True

For the tiny model of maskd's golden tests (not a released shape) pass --golden-manifest
manifest.json: the model is built from its "config" as the golden README describes.
Exit status 1 when a mask's IoU with maskd's is below --min-iou.
"""
import argparse
import json
import sys
from functools import partial

import numpy as np
import torch

from maskd_client import MaskdClient


def build_sam(args):
    from segment_anything import sam_model_registry
    if not args.golden_manifest:
        return sam_model_registry[args.model_type](checkpoint=args.checkpoint).eval()
    from segment_anything.modeling import (ImageEncoderViT, MaskDecoder, PromptEncoder, Sam,
                                           TwoWayTransformer)
    with open(args.golden_manifest) as f:
        cfg = json.load(f)["config"]
    img, patch, dim = cfg["img_size"], cfg["patch_size"], cfg["prompt_embed_dim"]
    sam = Sam(
        image_encoder=ImageEncoderViT(
            depth=cfg["depth"], embed_dim=cfg["embed_dim"], img_size=img, mlp_ratio=4,
            norm_layer=partial(torch.nn.LayerNorm, eps=1e-6), num_heads=cfg["heads"],
            patch_size=patch, qkv_bias=True, use_rel_pos=True, global_attn_indexes=cfg["global_idx"],
            window_size=cfg["window_size"], out_chans=cfg["out_chans"]),
        prompt_encoder=PromptEncoder(
            embed_dim=dim, image_embedding_size=(img // patch, img // patch),
            input_image_size=(img, img), mask_in_chans=cfg["mask_in_chans"]),
        mask_decoder=MaskDecoder(
            num_multimask_outputs=3,
            transformer=TwoWayTransformer(depth=2, embedding_dim=dim, mlp_dim=2048, num_heads=8),
            transformer_dim=dim, iou_head_depth=3, iou_head_hidden_dim=256),
        pixel_mean=[123.675, 116.28, 103.53], pixel_std=[58.395, 57.12, 57.375])
    sam.load_state_dict(torch.load(args.checkpoint, map_location="cpu"))
    return sam.eval()


def iou(a, b):
    a, b = a.astype(bool), b.astype(bool)
    union = np.logical_or(a, b).sum()
    return 1.0 if union == 0 else float(np.logical_and(a, b).sum()) / float(union)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("image", help="JPEG/PNG/WebP file")
    ap.add_argument("--server", default="localhost:50051", help="maskd HOST:PORT")
    ap.add_argument("--checkpoint", required=True, help="the SAM checkpoint maskd serves")
    ap.add_argument("--model-type", default="vit_h", choices=["vit_b", "vit_l", "vit_h"])
    ap.add_argument("--golden-manifest", help="build maskd's golden tiny model from this manifest")
    ap.add_argument("--point", action="append", required=True,
                    help="x,y[,label] in image pixels (label 1 foreground, 0 background); repeatable")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"],
                    help="embedding dtype on the wire")
    ap.add_argument("--min-iou", type=float, default=0.99)
    args = ap.parse_args()

    pts = [[float(t) for t in p.split(",")] for p in args.point]
    coords = np.array([[p[0], p[1]] for p in pts], dtype=np.float32)
    labels = np.array([int(p[2]) if len(p) > 2 else 1 for p in pts], dtype=np.int64)
    data = open(args.image, "rb").read()

    with MaskdClient(args.server, timeout=300) as client:
        emb = client.embed(data, return_embedding=args.dtype)
        ours = client.segment(emb.image_id, points=[(x, y, l) for (x, y), l in zip(coords, labels)],
                              multimask=True)
    print(f"image_id {emb.image_id}: embedding {args.dtype} {emb.features.shape}, "
          f"{len(emb.response.embedding.data)} bytes, input_size {emb.input_size}, "
          f"original_size {emb.original_size}")

    from segment_anything import SamPredictor
    predictor = SamPredictor(build_sam(args))
    predictor.reset_image()
    predictor.features = torch.from_numpy(emb.features).to(predictor.device)
    predictor.input_size = emb.input_size
    predictor.original_size = emb.original_size
    predictor.is_image_set = True
    masks, scores, _ = predictor.predict(point_coords=coords, point_labels=labels, multimask_output=True)

    worst = 1.0
    for i, (m, s) in enumerate(zip(masks, scores)):
        mine = ours.prompts[0].masks[i]
        v = iou(m, mine.decode())
        worst = min(worst, v)
        print(f"mask {i}: IoU {v:.5f}, SamPredictor score {s:.4f}, maskd score {mine.score:.4f}")
    print(f"min IoU {worst:.5f} (required {args.min_iou})")
    return 0 if worst >= args.min_iou else 1


if __name__ == "__main__":
    sys.exit(main())
