#!/usr/bin/env python3
"""Example: one click on an image, masks back as COCO RLE, an overlay PNG of the best mask.

    python client/python/examples/segment_click.py --server localhost:50051 photo.jpg --point 320,240 --out overlay.png
"""
import argparse
import io

import numpy as np
from PIL import Image

from maskd_client import MaskdClient


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("image", help="JPEG/PNG/WebP file")
    ap.add_argument("--server", default="localhost:50051", help="maskd HOST:PORT")
    ap.add_argument("--point", action="append", required=True,
                    help="x,y[,label] in image pixels (label 1 foreground, 0 background); repeatable")
    ap.add_argument("--out", help="write the image with the best mask blended in as PNG")
    ap.add_argument("--tls-ca", help="PEM CA certificate of maskd's TLS certificate (enables TLS)")
    ap.add_argument("--tls-cert", help="PEM client certificate for mutual TLS (with --tls-key)")
    ap.add_argument("--tls-key", help="PEM private key of --tls-cert")
    ap.add_argument("--token-file", help="file holding the bearer token (else $MASKD_TOKEN)")
    args = ap.parse_args()

    points = []
    for p in args.point:
        v = [float(t) for t in p.split(",")]
        points.append((v[0], v[1], int(v[2]) if len(v) > 2 else 1))
    data = open(args.image, "rb").read()
    with MaskdClient(args.server, tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key,
                     token_file=args.token_file) as client:
        r = client.segment(data, points=points, multimask=True)
    pr = r.prompts[0]
    for i, m in enumerate(pr.masks):
        star = "*" if i == pr.best_index else " "
        print(f"mask {i}{star} score {m.score:.3f} stability {m.stability_score:.3f} area {m.area} bbox {m.bbox}")
    print(f"image_id {r.image_id} ({r.width}x{r.height}); refine with mask_from={pr.result_id!r}")
    if args.out:
        rgb = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(np.float32)
        mask = pr.best.decode().astype(bool)
        rgb[mask] = 0.5 * rgb[mask] + 0.5 * np.array([30, 144, 255], dtype=np.float32)
        Image.fromarray(rgb.astype(np.uint8)).save(args.out)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
