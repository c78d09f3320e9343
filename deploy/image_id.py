#!/usr/bin/env python3
"""Computes a maskd image_id on the client, before any call, for the x-maskd-image-id header.

Behind a proxy that balances on that header (deploy/envoy/envoy.yaml), every call about one image
must carry the same value, including the first one that sends the bytes, or the embedding is
computed on one replica and looked up on another. The image_id itself is that value: it is what a
client has for by-id calls anyway, and this computes it from the bytes before the first call.

It reimplements model/io/image_id.cc (ImageIdForEncoded / ImageIdForRaw, shared by the server and
maskd_client; maskd_client.image_id in client/python is the Python client's copy): lowercase hex SHA-256
over length-framed fields (8-byte little-endian length, then the bytes) in this order: the domain
"maskd.image_id.v1", the model identity (GetInfoResponse.model.identity), the kind ("encoded" or
"raw"), then the content (the encoded file's bytes as sent; for raw: width and height as 8-byte
little-endian integers, then the framed RGB bytes); written out at EmbedResponse.image_id in
proto/maskd/v1/maskd.proto. If the server changes that scheme this file must follow;
deploy/validate.py compares it with a live maskd when one is given, and
client/python/tests/test_client_affinity.py compares it with the Python client's copy.

Usage:
  image_id.py --identity IDENTITY IMAGE_FILE          # encoded JPEG/PNG/WebP file
  image_id.py --identity IDENTITY --raw W H RGB_FILE   # raw RGB8 pixels
The identity: `maskctl info` (line "identity ...") or GetInfo's model.identity. Replicas behind one
proxy must serve the same checkpoint, precision and optimisations, or their identities (and so
their image_ids) differ.
"""
import argparse
import hashlib
import struct
import sys

DOMAIN = b"maskd.image_id.v1"


def _framed(h, data: bytes) -> None:
    h.update(struct.pack("<Q", len(data)))
    h.update(data)


def image_id_for_encoded(identity: str, encoded: bytes) -> str:
    h = hashlib.sha256()
    _framed(h, DOMAIN)
    _framed(h, identity.encode())
    _framed(h, b"encoded")
    _framed(h, encoded)
    return h.hexdigest()


def image_id_for_raw(identity: str, width: int, height: int, rgb: bytes) -> str:
    h = hashlib.sha256()
    _framed(h, DOMAIN)
    _framed(h, identity.encode())
    _framed(h, b"raw")
    h.update(struct.pack("<Q", width))
    h.update(struct.pack("<Q", height))
    _framed(h, rgb)
    return h.hexdigest()


def main(argv) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--identity", required=True, help="GetInfoResponse.model.identity of the servers")
    p.add_argument("--raw", nargs=2, type=int, metavar=("WIDTH", "HEIGHT"),
                   help="the file holds raw RGB8 pixels of this size")
    p.add_argument("file")
    a = p.parse_args(argv)
    with open(a.file, "rb") as f:
        data = f.read()
    if a.raw:
        w, h = a.raw
        if len(data) != w * h * 3:
            print(f"{a.file}: {len(data)} bytes, expected width*height*3 = {w * h * 3}",
                  file=sys.stderr)
            return 2
        print(image_id_for_raw(a.identity, w, h, data))
    else:
        print(image_id_for_encoded(a.identity, data))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
