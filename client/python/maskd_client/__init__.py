"""Python client for maskd, the Segment Anything (SAM) mask server.

    from maskd_client import MaskdClient
    with MaskdClient("localhost:50051") as c:
        r = c.segment(open("cat.jpg", "rb").read(), points=[(320, 240, 1)], multimask=True)
        best = r.prompts[0].best
        mask = best.decode()          # numpy uint8 H x W (pycocotools for RLE)
        print(best.score, best.area, best.bbox)

Every Embed/Segment/SegmentStream carries `x-maskd-image-id: <image_id>` (computed on the client for
image bytes, see maskd_client.image_id) so that Envoy's ring hash keeps an image on the replica that
cached it; `MaskdClient(target, affinity_header=False)` turns that off.

Errors are grpc.RpcError with the server's status code and message (e.g. NOT_FOUND when an image_id
has been evicted: re-send the image).
"""
from .client import (Mask, MaskdClient, PromptResult, SegmentResult, SegmentSession,
                     OUTPUT_FORMATS)
from .image_id import (AFFINITY_HEADER, affinity_key, image_id_for_encoded, image_id_for_image,
                       image_id_for_raw)
from .v1 import maskd_pb2, maskd_pb2_grpc

__all__ = ["MaskdClient", "SegmentResult", "PromptResult", "Mask", "SegmentSession", "OUTPUT_FORMATS",
           "AFFINITY_HEADER", "affinity_key", "image_id_for_encoded", "image_id_for_raw",
           "image_id_for_image", "maskd_pb2", "maskd_pb2_grpc"]
