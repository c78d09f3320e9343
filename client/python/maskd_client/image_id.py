"""maskd image_ids computed on the client, for the `x-maskd-image-id` affinity header.

Behind a proxy that balances on that header (deploy/envoy/envoy.yaml, ring hash), every call about
one image must carry the same value, including the first one that sends the bytes, or the embedding
is computed on one replica and looked up on another. The value is the image's image_id, which this
module computes before any call, exactly as the server does (model/io/image_id.h, the one C++
implementation; the scheme is also written at EmbedResponse.image_id in proto/maskd/v1/maskd.proto):

    lowercase hex SHA-256 over length-framed fields, each an 8-byte little-endian length followed by
    the bytes, in this order: b"maskd.image_id.v1", the model identity (GetInfoResponse.model.identity,
    UTF-8), the kind (b"encoded" or b"raw"), then for "encoded" the file's bytes exactly as sent;
    for "raw" the width and the height as 8-byte little-endian integers (not framed), then the
    framed RGB bytes.
"""
from __future__ import annotations

import hashlib
import struct
from typing import Optional

AFFINITY_HEADER = "x-maskd-image-id"
_DOMAIN = b"maskd.image_id.v1"


def _framed(h, data: bytes) -> None:
    h.update(struct.pack("<Q", len(data)))
    h.update(data)


def image_id_for_encoded(identity: str, encoded: bytes) -> str:
    """The image_id of an encoded (JPEG/PNG/WebP) file, sent as is."""
    h = hashlib.sha256()
    _framed(h, _DOMAIN)
    _framed(h, identity.encode("utf-8"))
    _framed(h, b"encoded")
    _framed(h, bytes(encoded))
    return h.hexdigest()


def image_id_for_raw(identity: str, width: int, height: int, rgb: bytes) -> str:
    """The image_id of raw RGB8 pixels (RawImage)."""
    h = hashlib.sha256()
    _framed(h, _DOMAIN)
    _framed(h, identity.encode("utf-8"))
    _framed(h, b"raw")
    h.update(struct.pack("<Q", width))
    h.update(struct.pack("<Q", height))
    _framed(h, bytes(rgb))
    return h.hexdigest()


def image_id_for_image(identity: str, image) -> Optional[str]:
    """The image_id of a maskd_pb2.Image message; None when it holds nothing or identity is empty."""
    if not identity:
        return None
    which = image.WhichOneof("source")
    if which == "encoded":
        return image_id_for_encoded(identity, image.encoded)
    if which == "raw":
        return image_id_for_raw(identity, image.raw.width, image.raw.height, image.raw.rgb)
    return None


def affinity_key(identity: str, request) -> Optional[str]:
    """The x-maskd-image-id value of a SegmentRequest or EmbedRequest: the image_id for a by-id
    request, computed for bytes (needs `identity`), None without an image."""
    if request.HasField("image"):
        return image_id_for_image(identity, request.image)
    image_id = getattr(request, "image_id", "")
    return image_id or None
