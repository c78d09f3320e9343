"""A Label Studio ML backend that asks maskd for Segment Anything masks.

Label Studio calls an ML backend's `predict(tasks, context)` (its documented ML-backend interface,
`label_studio_ml.model.LabelStudioMLBase`) when an annotator places a smart keypoint or rectangle:
`context["result"]` holds those regions, in percent of the image, with `original_width/height` and,
for keypoints, `is_positive`. This class turns them into one maskd Segment call (points with labels,
at most one box) and returns the best mask as Label Studio polygon regions (`polygonlabels`, points
in percent; one region per outer contour: Label Studio polygons have no holes).

The image is sent once and cached by maskd; later clicks on the same task reuse its image_id, so a
click costs the decoder only. Runs without Label Studio installed (then it is a plain class); with
`label-studio-ml` installed it derives from LabelStudioMLBase and is served by its `_wsgi.py`.

    MASKD_SERVER=localhost:50051 label-studio-ml start client/examples/label_studio
"""
from __future__ import annotations

import os
import urllib.parse
import urllib.request
from typing import Callable, Dict, List, Optional

from maskd_client import MaskdClient, NotFound

try:  # the SDK is optional: everything below also works as a plain class
    from label_studio_ml.model import LabelStudioMLBase as _Base
except ImportError:  # pragma: no cover - exercised when the SDK is absent, as in maskd's CI
    class _Base:  # type: ignore[no-redef]
        def __init__(self, *args, **kwargs):
            pass


def _read_image(url: str) -> bytes:
    """A local path, file:// URL or http(s) URL (Label Studio's own get_local_path is used when the
    SDK is there and the URL is one of Label Studio's)."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme in ("http", "https"):
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.read()
    path = urllib.parse.unquote(parsed.path) if parsed.scheme == "file" else url
    with open(path, "rb") as f:
        return f.read()


class MaskdSamBackend(_Base):
    """predict(tasks, context) -> Label Studio predictions, from maskd.

    from_name / to_name: the PolygonLabels and Image tag names of the labeling config;
    image_key: the task data field holding the image URL."""

    def __init__(self, maskd_target: Optional[str] = None, from_name: str = "label",
                 to_name: str = "image", image_key: str = "image", polygon_tolerance: float = 1.0,
                 image_reader: Optional[Callable[[str], bytes]] = None,
                 client: Optional[MaskdClient] = None, **kwargs):
        super().__init__(**kwargs)
        self.client = client or MaskdClient(maskd_target or os.environ.get("MASKD_SERVER",
                                                                           "localhost:50051"))
        self.from_name, self.to_name, self.image_key = from_name, to_name, image_key
        self.polygon_tolerance = polygon_tolerance
        self.read_image = image_reader or _read_image
        self._image_ids: Dict[str, str] = {}  # image URL -> maskd image_id (maskd caches by content)

    @staticmethod
    def prompt_from_context(context: Dict):
        """(points [(x, y, label)], box (x0, y0, x1, y1) or None, label name, width, height) in image
        pixels, from Label Studio's interactive context (values in percent)."""
        regions = context.get("result") or []
        if not regions:
            return [], None, None, 0, 0
        width, height = regions[0]["original_width"], regions[0]["original_height"]
        points, box, label = [], None, None
        for r in regions:
            v, kind = r["value"], r["type"]
            label = (v.get(kind) or [label])[0]
            x, y = v["x"] * width / 100.0, v["y"] * height / 100.0
            if kind == "keypointlabels":
                points.append((x, y, 1 if r.get("is_positive", True) else 0))
            elif kind == "rectanglelabels":
                box = (x, y, x + v["width"] * width / 100.0, y + v["height"] * height / 100.0)
        return points, box, label, width, height

    def predict(self, tasks: List[Dict], context: Optional[Dict] = None, **kwargs) -> List[Dict]:
        if not context or not context.get("result"):
            return []  # no interaction yet: nothing to segment
        points, box, label, width, height = self.prompt_from_context(context)
        if not points and box is None:
            return []
        url = tasks[0]["data"][self.image_key]
        ask = dict(points=points, box=box, multimask=box is None and len(points) == 1,
                   format="polygons", polygon_tolerance=self.polygon_tolerance)
        r = None
        if url in self._image_ids:
            try:
                r = self.client.segment(self._image_ids[url], **ask)
            except NotFound:  # evicted from maskd's cache: send the image again
                r = None
        if r is None:
            r = self.client.segment(self.read_image(url), **ask)
        self._image_ids[url] = r.image_id
        best = r.prompts[0].best
        results = []
        for i, poly in enumerate(p for p in best.polygons if not p["hole"]):
            xy = poly["points"]
            results.append({
                "id": f"maskd-{i}",
                "from_name": self.from_name, "to_name": self.to_name, "type": "polygonlabels",
                "original_width": width, "original_height": height, "image_rotation": 0,
                "value": {
                    "points": [[100.0 * xy[k] / width, 100.0 * xy[k + 1] / height]
                               for k in range(0, len(xy), 2)],
                    "closed": True,
                    "polygonlabels": [label] if label else [],
                },
                "score": float(best.score),
            })
        return [{"result": results, "score": float(best.score), "model_version": "maskd"}]
