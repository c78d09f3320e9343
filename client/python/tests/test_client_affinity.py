"""The affinity header (x-maskd-image-id) against an in-process gRPC fake that records what arrived
on the wire. That the value equals a real maskd's image_id is checked in test_client_e2e.py."""
import os
import sys
import threading
from concurrent import futures

import grpc
import pytest

from maskd_client import (AFFINITY_HEADER, MaskdClient, image_id_for_encoded, image_id_for_raw,
                          maskd_pb2, maskd_pb2_grpc)
from maskd_client.image_id import affinity_key

IDENTITY = "fake-model-identity"
PNG = b"\x89PNG\r\n\x1a\nnot really a picture, the fake does not decode"


def test_image_ids_match_the_servers_pinned_values():
    # The same two values tests/server_cache_test.cc pins for model/io/image_id.cc (the server's and
    # the C++ client's implementation): a change of scheme on either side fails a test.
    assert image_id_for_encoded("model-1", b"bytes") == \
        "af36684893d54e81145bab43c7c0c21c187cb972722361bb50a564cc62373c10"
    assert image_id_for_raw("m", 2, 1, bytes(range(6))) == \
        "dc2deb7c7aa88f6dd46f88656ab584bbc389fc99ec26fec9caff3c6d42f6a404"


def test_deploy_image_id_script_agrees():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "deploy"))
    try:
        import image_id as deploy_image_id
    finally:
        sys.path.pop(0)
    assert deploy_image_id.image_id_for_encoded(IDENTITY, PNG) == image_id_for_encoded(IDENTITY, PNG)
    assert deploy_image_id.image_id_for_raw(IDENTITY, 2, 1, bytes(6)) == image_id_for_raw(IDENTITY, 2, 1, bytes(6))


def test_affinity_key_forms():
    by_id = maskd_pb2.SegmentRequest(image_id="abc")
    assert affinity_key("", by_id) == "abc"
    raw = maskd_pb2.SegmentRequest(image=maskd_pb2.Image(raw=maskd_pb2.RawImage(width=2, height=1, rgb=bytes(6))))
    assert affinity_key(IDENTITY, raw) == image_id_for_raw(IDENTITY, 2, 1, bytes(6))
    assert affinity_key("", raw) is None  # bytes need the identity
    assert affinity_key(IDENTITY, maskd_pb2.SegmentRequest()) is None
    embed = maskd_pb2.EmbedRequest(image=maskd_pb2.Image(encoded=PNG))
    assert affinity_key(IDENTITY, embed) == image_id_for_encoded(IDENTITY, PNG)


class _Recorder(maskd_pb2_grpc.MaskServiceServicer):
    """Answers with the image_id the request names or that the test says bytes have; records the
    affinity header of every call."""

    def __init__(self):
        self.lock = threading.Lock()
        self.calls = []  # (method, header or None)
        self.infos = 0
        self.identity = IDENTITY
        self.ids = {}  # encoded bytes -> the id this fake answers for them

    def _note(self, method, context):
        md = dict(context.invocation_metadata())
        with self.lock:
            self.calls.append((method, md.get(AFFINITY_HEADER)))

    def _id(self, req):
        return self.ids[req.image.encoded] if req.HasField("image") else req.image_id

    def last(self, method):
        with self.lock:
            return [h for m, h in self.calls if m == method][-1]

    def GetInfo(self, request, context):
        with self.lock:
            self.infos += 1
        return maskd_pb2.GetInfoResponse(model=maskd_pb2.ModelInfo(identity=self.identity))

    def Embed(self, request, context):
        self._note("Embed", context)
        return maskd_pb2.EmbedResponse(image_id=self._id(request))

    def Segment(self, request, context):
        self._note("Segment", context)
        return maskd_pb2.SegmentResponse(image_id=self._id(request))

    def SegmentStream(self, request_iterator, context):
        self._note("SegmentStream", context)
        current = ""
        for req in request_iterator:
            if req.HasField("image") or req.image_id:
                current = self._id(req)
            yield maskd_pb2.SegmentResponse(image_id=current)


@pytest.fixture()
def fake():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    rec = _Recorder()
    rec.ids[PNG] = image_id_for_encoded(IDENTITY, PNG)
    maskd_pb2_grpc.add_MaskServiceServicer_to_server(rec, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield rec, f"127.0.0.1:{port}"
    server.stop(None)


def test_header_on_every_call_kind(fake):
    rec, target = fake
    want = image_id_for_encoded(IDENTITY, PNG)
    with MaskdClient(target, timeout=10) as c:
        assert c.affinity_header  # on by default
        assert c.embed(PNG).image_id == want
        assert rec.last("Embed") == want
        c.segment(want, points=[(1, 1)])
        assert rec.last("Segment") == want
        c.segment(PNG, points=[(1, 1)])
        assert rec.last("Segment") == want
        with c.session() as s:
            assert s.send(PNG, points=[(1, 1)]).image_id == want
            s.send(None, points=[(2, 2)])
        assert rec.last("SegmentStream") == want
        with c.session() as s:
            s.send("by-id", points=[(1, 1)])
        assert rec.last("SegmentStream") == "by-id"
        with c.session():
            pass  # never sent: no stream opened
        assert [m for m, _ in rec.calls].count("SegmentStream") == 2
    assert rec.infos == 1  # one GetInfo for the identity, however many calls with bytes


def test_no_header_when_off_or_without_identity(fake):
    rec, target = fake
    with MaskdClient(target, timeout=10, affinity_header=False) as c:
        c.embed(PNG)
        c.segment("some-id", points=[(1, 1)])
        with c.session() as s:
            s.send(PNG, points=[(1, 1)])
    assert [h for _, h in rec.calls] == [None, None, None]
    assert rec.infos == 0

    rec.identity = ""  # a server that reports no identity
    with MaskdClient(target, timeout=10) as c:
        c.segment(PNG, points=[(1, 1)])
        assert rec.last("Segment") is None
        c.segment("some-id", points=[(1, 1)])
        assert rec.last("Segment") == "some-id"  # ids need no identity
        c.embed(PNG)
        assert rec.last("Embed") is None
    assert rec.infos == 1  # the empty identity was kept


def test_failed_identity_lookup_is_not_repeated_at_once():
    with MaskdClient("127.0.0.1:1", timeout=0.3) as c:
        assert c.model_identity() is None
        assert c._identity_failed_at is not None
        failed_at = c._identity_failed_at
        assert c.model_identity() is None
        assert c._identity_failed_at == failed_at  # not asked again within identity_retry
        assert c.affinity_key(maskd_pb2.SegmentRequest(image_id="abc")) == "abc"
        assert c.affinity_key(maskd_pb2.SegmentRequest(image=maskd_pb2.Image(encoded=PNG))) is None
