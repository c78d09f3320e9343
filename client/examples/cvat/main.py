"""A CVAT interactor (serverless function, nuclio's Python handler interface) that asks maskd.

CVAT's interactors call the function with a JSON body: the frame as base64 `image`, the clicks as
`pos_points` and `neg_points` ([[x, y], ...] in image pixels) and, from newer CVAT, optionally
`obj_bbox` ([[x0, y0], [x1, y1]]). The answer is JSON `{"points": [[x, y], ...], "mask": [[0|255,
...], ...]}`: the largest outer contour of maskd's best mask, and the mask itself at the image size,
as CVAT's SAM interactor returns them.

nuclio calls init_context(context) once (the maskd client goes into context.user_data) and
handler(context, event) per request. maskd caches the frame's embedding by content, so later clicks
on the same frame cost the decoder only (the bytes still travel; see README for the image_id route).
"""
import base64
import json
import os

import numpy as np

from maskd_client import MaskdClient


def init_context(context):
    context.user_data.client = MaskdClient(os.environ.get("MASKD_SERVER", "localhost:50051"),
                                           timeout=float(os.environ.get("MASKD_TIMEOUT", "30")))


def interact(client, body):
    """The request -> maskd -> result conversion, without nuclio: returns the response dict."""
    image = base64.b64decode(body["image"])
    points = [(float(x), float(y), 1) for x, y in body.get("pos_points", [])]
    points += [(float(x), float(y), 0) for x, y in body.get("neg_points", [])]
    box = None
    if body.get("obj_bbox"):
        (x0, y0), (x1, y1) = body["obj_bbox"]
        box = (float(x0), float(y0), float(x1), float(y1))
    if not points and box is None:
        raise ValueError("pos_points, neg_points or obj_bbox is required")
    r = client.segment(image, points=points, box=box, multimask=box is None and len(points) == 1,
                       format="polygons", polygon_tolerance=float(body.get("tolerance", 1.0)))
    best = r.prompts[0].best
    outers = [p["points"] for p in best.polygons if not p["hole"]]
    largest = max(outers, key=_area, default=[])
    mask = best.decode().astype(np.uint8) * 255
    return {"points": [[largest[k], largest[k + 1]] for k in range(0, len(largest), 2)],
            "mask": mask.tolist(), "score": float(best.score), "image_id": r.image_id}


def _area(xy):
    x, y = np.asarray(xy[0::2], dtype=np.float64), np.asarray(xy[1::2], dtype=np.float64)
    return 0.5 * abs(float(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1))))


def handler(context, event):
    body = event.body if isinstance(event.body, dict) else json.loads(event.body)
    try:
        result = interact(context.user_data.client, body)
    except (ValueError, KeyError) as e:
        return context.Response(body=json.dumps({"error": str(e)}), headers={},
                                content_type="application/json", status_code=400)
    return context.Response(body=json.dumps(result), headers={}, content_type="application/json",
                            status_code=200)
