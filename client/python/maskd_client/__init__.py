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

Errors are typed (maskd_client.errors): MaskdError and one subclass per status code, e.g.
maskd_client.NotFound when an image_id has been evicted (re-send the image), each with the code,
the server's message and the call's request id. They are grpc.RpcError too (code(), details()).

The .proto files the stubs were generated from ship with the package: maskd_client.proto_dir().
"""
import os as _os

from .client import (EMBEDDING_DTYPES, Embedding, GENERATION_PARAMS, GenerateResult, GeneratedMask, Mask,
                     MaskdClient, PromptResult, SegmentResult, SegmentSession, OUTPUT_FORMATS,
                     build_generate_request, embedding_to_numpy)
from .image_id import (AFFINITY_HEADER, affinity_key, image_id_for_encoded, image_id_for_image,
                       image_id_for_raw)
from .errors import (Cancelled, DeadlineExceeded, FailedPrecondition, Internal, InvalidArgument,
                     MaskdError, NotFound, ResourceExhausted, Unavailable, Unimplemented)
from .v1 import maskd_pb2, maskd_pb2_grpc


def proto_dir() -> str:
    """The folder holding maskd/v1/maskd.proto (e.g. for grpcurl -import-path or protoc -I)."""
    return _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "proto")

__all__ = ["MaskdClient", "Embedding", "EMBEDDING_DTYPES", "embedding_to_numpy", "SegmentResult", "PromptResult", "Mask", "SegmentSession", "OUTPUT_FORMATS",
           "GenerateResult", "GeneratedMask", "GENERATION_PARAMS", "build_generate_request",
           "AFFINITY_HEADER", "affinity_key", "image_id_for_encoded", "image_id_for_raw",
           "image_id_for_image", "maskd_pb2", "maskd_pb2_grpc", "proto_dir", "MaskdError",
           "Cancelled", "DeadlineExceeded", "FailedPrecondition", "Internal", "InvalidArgument",
           "NotFound", "ResourceExhausted", "Unavailable", "Unimplemented"]
