#!/usr/bin/env python3
"""Differential-test oracle: a golden folder from the original segment_anything package.

Builds a SAM whose image encoder has a random configuration (the prompt encoder and mask decoder are
SAM's own), gives it seeded random weights, and records what the original SamPredictor computes on
random images and prompts, in the format of ../shared/golden (see its README and model/golden.cc):

    manifest.json  checkpoint.pth  image0.png  image0.pt  image1.png  image1.pt

The package is only imported here, at test time, as the reference; nothing of it lives in the repo.
The same seed gives the same folder (configuration, weights, images, prompts).

    make_golden.py --seed S --out DIR [--images N]
"""

import argparse
import json
import math
import os
import sys
from functools import partial

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFilter

from segment_anything import SamPredictor
from segment_anything.modeling import (ImageEncoderViT, MaskDecoder, PromptEncoder, Sam,
                                       TwoWayTransformer)
from segment_anything.modeling.common import LayerNorm2d

IMG_SIZE = 1024
PATCH = 16
PROMPT_DIM = 256
MASK_IN_CHANS = 16


def random_config(rng):
    embed_dim = int(rng.choice([32, 64, 96]))
    heads = int(rng.choice([h for h in (1, 2, 4) if embed_dim % h == 0]))
    depth = int(rng.integers(2, 5))
    window = int(rng.choice([7, 8, 14]))
    n_global = int(rng.integers(1, depth + 1))
    global_idx = sorted(int(i) for i in rng.choice(depth, size=n_global, replace=False))
    return {
        "embed_dim": embed_dim, "depth": depth, "heads": heads, "global_idx": global_idx,
        "img_size": IMG_SIZE, "patch_size": PATCH, "window_size": window, "mlp_ratio": 4,
        "out_chans": PROMPT_DIM, "prompt_embed_dim": PROMPT_DIM, "mask_in_chans": MASK_IN_CHANS,
    }


def build_sam(cfg):
    emb = IMG_SIZE // PATCH
    sam = Sam(
        image_encoder=ImageEncoderViT(
            depth=cfg["depth"], embed_dim=cfg["embed_dim"], img_size=IMG_SIZE, mlp_ratio=4,
            norm_layer=partial(torch.nn.LayerNorm, eps=1e-6), num_heads=cfg["heads"],
            patch_size=PATCH, qkv_bias=True, use_rel_pos=True, global_attn_indexes=cfg["global_idx"],
            window_size=cfg["window_size"], out_chans=PROMPT_DIM),
        prompt_encoder=PromptEncoder(
            embed_dim=PROMPT_DIM, image_embedding_size=(emb, emb), input_image_size=(IMG_SIZE, IMG_SIZE),
            mask_in_chans=MASK_IN_CHANS),
        mask_decoder=MaskDecoder(
            num_multimask_outputs=3,
            transformer=TwoWayTransformer(depth=2, embedding_dim=PROMPT_DIM, mlp_dim=2048, num_heads=8),
            transformer_dim=PROMPT_DIM, iou_head_depth=3, iou_head_hidden_dim=256),
        pixel_mean=[123.675, 116.28, 103.53],
        pixel_std=[58.395, 57.12, 57.375],
    )
    return sam.eval()


@torch.no_grad()
def randomise(sam, cfg, gen):
    """Seeded weights, non-trivial everywhere, activations O(1).

    Every entry of the state dict is set by exactly one rule below, and the function fails if one is
    left over: a tensor keeping its default (zeros for rel-pos, ones for norms) would hide a bug in
    the C++ model's use of it.
    """
    done = set()

    def normal_(t, std, mean=0.0):
        t.copy_(torch.randn(t.shape, generator=gen) * std + mean)

    prefixes = {id(m): n for n, m in sam.named_modules()}
    for mod in sam.modules():
        name = prefixes[id(mod)]
        params = []
        if isinstance(mod, torch.nn.ConvTranspose2d):
            # weight [in, out, k, k] with stride == kernel: each output sees `in` inputs.
            normal_(mod.weight, 1.0 / math.sqrt(mod.weight.shape[0]))
            params = ["weight"]
        elif isinstance(mod, (torch.nn.Linear, torch.nn.Conv2d)):
            fan_in = mod.weight[0].numel()
            normal_(mod.weight, 1.0 / math.sqrt(fan_in))
            params = ["weight"]
        elif isinstance(mod, (torch.nn.LayerNorm, LayerNorm2d)):
            normal_(mod.weight, 0.2, mean=1.0)
            params = ["weight"]
        elif isinstance(mod, torch.nn.Embedding):
            normal_(mod.weight, 0.5)
            params = ["weight"]
        if params and getattr(mod, "bias", None) is not None:
            normal_(mod.bias, 0.1)
            params.append("bias")
        for p in params:
            done.add(f"{name}.{p}" if name else p)

    enc = sam.image_encoder
    normal_(enc.pos_embed, 0.5)
    done.add("image_encoder.pos_embed")
    head_dim = cfg["embed_dim"] // cfg["heads"]
    for i, blk in enumerate(enc.blocks):
        # q . rel_pos sums head_dim terms of O(1) q: 1/sqrt(head_dim) keeps the bias O(1), on the
        # order of the q.k logits it is added to.
        for p in ("rel_pos_h", "rel_pos_w"):
            normal_(getattr(blk.attn, p), 1.0 / math.sqrt(head_dim))
            done.add(f"image_encoder.blocks.{i}.attn.{p}")
    pe = sam.prompt_encoder.pe_layer.positional_encoding_gaussian_matrix
    normal_(pe, float(torch.empty(1).uniform_(0.5, 2.0, generator=gen)))
    done.add("prompt_encoder.pe_layer.positional_encoding_gaussian_matrix")

    left = sorted(set(sam.state_dict().keys()) - done)
    if left:
        raise RuntimeError(f"state dict entries without a random init rule: {left}")


def random_image(rng, height, width):
    """Smooth gradients, a low-frequency wave, then soft-edged shapes: image-like, not noise."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    xn, yn = x / max(width - 1, 1), y / max(height - 1, 1)
    img = np.empty((height, width, 3))
    theta = rng.uniform(0, math.pi)
    wave = np.sin(2 * math.pi * rng.uniform(0.5, 3) * (xn * math.cos(theta) + yn * math.sin(theta)))
    for c in range(3):
        a, b, d, e = rng.uniform(0, 255), rng.uniform(-120, 120), rng.uniform(-120, 120), rng.uniform(0, 40)
        img[..., c] = a + b * xn + d * yn + e * wave
    pil = Image.fromarray(np.clip(img, 0, 255).round().astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(pil)
    for _ in range(int(rng.integers(3, 9))):
        x0, x1 = sorted(rng.uniform(-0.1, 1.1, 2) * width)
        y0, y1 = sorted(rng.uniform(-0.1, 1.1, 2) * height)
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        kind = rng.integers(0, 3)
        if kind == 0:
            draw.ellipse([x0, y0, x1, y1], fill=colour)
        elif kind == 1:
            draw.rectangle([x0, y0, x1, y1], fill=colour)
        else:
            pts = [(float(rng.uniform(0, width)), float(rng.uniform(0, height))) for _ in range(3)]
            draw.polygon(pts, fill=colour)
    return pil.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.5, 3.0))))


def f32(v):
    """A float32-exact coordinate: the manifest's JSON and the C++ reader's float then agree bit for
    bit with the float64 array the original transforms."""
    return float(np.float32(v))


def random_point(rng, w, h):
    return [f32(rng.uniform(0, w)), f32(rng.uniform(0, h))]


def random_box(rng, w, h, min_frac=0.02):
    while True:
        x0, x1 = sorted(rng.uniform(0, w, 2))
        y0, y1 = sorted(rng.uniform(0, h, 2))
        if x1 - x0 >= min_frac * w and y1 - y0 >= min_frac * h:
            return [f32(x0), f32(y0), f32(x1), f32(y1)]


def random_cases(rng, w, h):
    """Prompt cases in manifest form; together they cover every prompt kind the engine accepts."""
    def points(n, labels=None):
        pts = [random_point(rng, w, h) for _ in range(n)]
        lab = labels if labels is not None else [int(v) for v in rng.integers(0, 2, n)]
        return {"points": pts, "labels": lab}

    mm = lambda: bool(rng.integers(0, 2))
    cases = [
        {**points(1, [1]), "multimask": True},
        {**points(int(rng.integers(2, 7))), "multimask": False},
        {"box": random_box(rng, w, h), "multimask": mm()},
        {**points(int(rng.integers(1, 4))), "box": random_box(rng, w, h), "multimask": mm()},
        # Points on the image border (the engine accepts 0 <= x <= width) and a whole-image box.
        {"points": [[0.0, 0.0], [f32(w), f32(h)], [f32(w), 0.0]], "labels": [1, 0, int(rng.integers(0, 2))],
         "box": [0.0, 0.0, f32(w), f32(h)], "multimask": mm()},
    ]
    # Mask feedback: from a random earlier case, then chained from that feedback case itself.
    cases.append({**points(int(rng.integers(1, 3))), "mask_from": int(rng.integers(0, len(cases))),
                  "multimask": False})
    cases.append({**points(1), "box": random_box(rng, w, h), "mask_from": len(cases) - 1, "multimask": mm()})
    return cases


def run_case(predictor, case, results):
    kw = {"multimask_output": case["multimask"]}
    if "points" in case:
        kw["point_coords"] = np.array(case["points"], dtype=np.float64)
        kw["point_labels"] = np.array(case["labels"], dtype=np.int64)
    if "box" in case:
        kw["box"] = np.array(case["box"], dtype=np.float64)
    if "mask_from" in case:
        src = results[case["mask_from"]]
        kw["mask_input"] = src["low_res"][np.argmax(src["iou"])][None, :, :]
    masks, iou, low_res = predictor.predict(**kw)
    return {"masks": masks, "iou": iou, "low_res": low_res}


def t(a, dtype=None):
    """A standalone contiguous tensor (no view of a larger storage) for torch.save."""
    x = torch.as_tensor(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a
    x = x.detach().clone().contiguous()
    return x.to(dtype) if dtype is not None else x


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--images", type=int, default=2)
    ap.add_argument("--min-side", type=int, default=200)
    ap.add_argument("--max-side", type=int, default=1300)
    args = ap.parse_args()

    # The machine is shared; the result does not depend on the thread count at these tolerances.
    torch.set_num_threads(min(2, torch.get_num_threads()))
    rng = np.random.default_rng(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    cfg = random_config(rng)
    sam = build_sam(cfg)
    randomise(sam, cfg, gen)
    predictor = SamPredictor(sam)

    os.makedirs(args.out, exist_ok=True)
    ckpt = "checkpoint.pth"
    torch.save(sam.state_dict(), os.path.join(args.out, ckpt))

    import segment_anything
    import torchvision
    import PIL
    manifest = {
        "config": cfg,
        "generator": {
            "script": "tests/oracle/make_golden.py", "seed": args.seed,
            "torch": torch.__version__, "torchvision": torchvision.__version__, "pillow": PIL.__version__,
            "segment_anything": getattr(segment_anything, "__version__", "1.0"),
        },
        "checkpoint": ckpt,
        "images": [],
    }
    print(f"seed {args.seed}: encoder embed_dim {cfg['embed_dim']}, depth {cfg['depth']}, heads {cfg['heads']}, "
          f"window {cfg['window_size']}, global attention at {cfg['global_idx']}", flush=True)

    with torch.no_grad():
        for n in range(args.images):
            name = f"image{n}"
            h, w = (int(v) for v in rng.integers(args.min_side, args.max_side + 1, 2))
            png = f"{name}.png"
            random_image(rng, h, w).save(os.path.join(args.out, png))
            # What the C++ side decodes: the PNG read back, not the array before saving.
            image = np.array(Image.open(os.path.join(args.out, png)).convert("RGB"))
            assert image.shape == (h, w, 3)

            predictor.set_image(image, image_format="RGB")
            tensors = {
                "input_resized": t(predictor.transform.apply_image(image)),
                "input_size": torch.tensor(list(predictor.input_size), dtype=torch.int64),
                "original_size": torch.tensor(list(predictor.original_size), dtype=torch.int64),
                "embedding": t(predictor.get_image_embedding(), torch.float32),
            }
            cases = random_cases(rng, w, h)
            results = []
            for k, case in enumerate(cases):
                r = run_case(predictor, case, results)
                results.append(r)
                tensors[f"case{k}.masks"] = t(r["masks"].astype(np.uint8))
                tensors[f"case{k}.iou_predictions"] = t(r["iou"], torch.float32)
                tensors[f"case{k}.low_res_logits"] = t(r["low_res"], torch.float32)

            boxes = np.array([random_box(rng, w, h) for _ in range(int(rng.integers(2, 5)))], dtype=np.float32)
            tb = torch.as_tensor(boxes)
            masks, iou, low_res = predictor.predict_torch(
                point_coords=None, point_labels=None,
                boxes=predictor.transform.apply_boxes_torch(tb, image.shape[:2]), multimask_output=True)
            tensors["batch.boxes"] = t(tb)
            tensors["batch.masks"] = t(masks.to(torch.uint8))
            tensors["batch.iou_predictions"] = t(iou, torch.float32)
            tensors["batch.low_res_logits"] = t(low_res, torch.float32)

            pt = f"{name}.pt"
            torch.save(tensors, os.path.join(args.out, pt))
            manifest["images"].append({
                "name": name, "png": png, "tensors": pt, "height": h, "width": w, "cases": cases,
                "batch_boxes": [[float(v) for v in b] for b in boxes],
            })
            print(f"  {name}: {w}x{h} -> {tensors['input_resized'].shape[1]}x{tensors['input_resized'].shape[0]}, "
                  f"{len(cases)} cases + batch of {len(boxes)} boxes", flush=True)

    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
