"""A friendly wrapper over maskd's generated v1 stub.

Coordinates are original image pixels. Points are (x, y) or (x, y, label) with label 1 = foreground
(default), 0 = background, as in SAM. Masks come back as `Mask` objects holding the server's data in
the requested format; `Mask.decode()` turns COCO RLE (via pycocotools), PNG (via Pillow) or polygons
(via pycocotools) into a numpy uint8 array of shape (height, width).

Affinity: by default every Embed, Segment and SegmentStream call carries the gRPC metadata
`x-maskd-image-id: <image_id>` (see maskd_client.image_id), so that a proxy balancing on it
(deploy/envoy/envoy.yaml) sends all calls about one image to the replica that cached its embedding.
By-id calls send the id; calls with bytes send the id computed here, which needs the model identity:
the client asks GetInfo once, on the first call with bytes, and keeps it. Without an identity (GetInfo
failed, or the server reports none) calls go out without the header: behind a proxy that is only a
cache miss, never an error. `MaskdClient(..., affinity_header=False)` turns it off.
"""
from __future__ import annotations

import io
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import grpc
import numpy as np

from . import errors as _errors
from . import image_id as _image_id
from .v1 import maskd_pb2, maskd_pb2_grpc

OUTPUT_FORMATS = {
    "rle": maskd_pb2.OUTPUT_FORMAT_COCO_RLE,
    "png": maskd_pb2.OUTPUT_FORMAT_PNG,
    "logits": maskd_pb2.OUTPUT_FORMAT_LOW_RES_LOGITS,
    "polygons": maskd_pb2.OUTPUT_FORMAT_POLYGONS,
}

# Embed's return_embedding: name -> maskd_pb2.EmbeddingDtype.
EMBEDDING_DTYPES = {
    "fp32": maskd_pb2.EMBEDDING_DTYPE_FP32,
    "bf16": maskd_pb2.EMBEDDING_DTYPE_BF16,
    "fp16": maskd_pb2.EMBEDDING_DTYPE_FP16,
}

PointLike = Union[Tuple[float, float], Tuple[float, float, int]]
BoxLike = Tuple[float, float, float, float]


def embedding_to_numpy(e: "maskd_pb2.ImageEmbedding") -> np.ndarray:
    """The values of an ImageEmbedding as float32 of its shape (bf16 and fp16 widened exactly).

    Layout (maskd.proto): little-endian values in C order; bf16 is the upper half of a float32."""
    shape = tuple(int(d) for d in e.shape)
    if e.dtype == maskd_pb2.EMBEDDING_DTYPE_FP32:
        flat = np.frombuffer(e.data, dtype="<f4")
    elif e.dtype == maskd_pb2.EMBEDDING_DTYPE_FP16:
        flat = np.frombuffer(e.data, dtype="<f2").astype(np.float32)
    elif e.dtype == maskd_pb2.EMBEDDING_DTYPE_BF16:
        flat = (np.frombuffer(e.data, dtype="<u2").astype("<u4") << 16).view("<f4")
    else:
        raise ValueError(f"embedding dtype {e.dtype} is not one of fp32, bf16, fp16")
    if flat.size != int(np.prod(shape)):
        raise ValueError(f"embedding data holds {flat.size} values, its shape {shape} needs "
                         f"{int(np.prod(shape))}")
    return flat.astype(np.float32, copy=True).reshape(shape)


@dataclass
class Embedding:
    """What embed(..., return_embedding=...) returns: the embedding as SamPredictor holds it."""
    image_id: str
    cached: bool
    features: np.ndarray             # float32 (1, 256, 64, 64): SamPredictor.features
    input_size: Tuple[int, int]      # (h, w) after the longest-side resize: SamPredictor.input_size
    original_size: Tuple[int, int]   # (h, w) of the image: SamPredictor.original_size
    dtype: str                       # what came over the wire: fp32 | bf16 | fp16
    response: "maskd_pb2.EmbedResponse"

    @staticmethod
    def from_proto(r: "maskd_pb2.EmbedResponse") -> "Embedding":
        e = r.embedding
        names = {v: k for k, v in EMBEDDING_DTYPES.items()}
        return Embedding(image_id=r.image_id, cached=r.cached, features=embedding_to_numpy(e),
                         input_size=(e.input_height, e.input_width),
                         original_size=(e.original_height, e.original_width),
                         dtype=names.get(e.dtype, "?"), response=r)


@dataclass
class Mask:
    """One mask of a prompt result."""
    score: float
    stability_score: float
    bbox: Tuple[int, int, int, int]  # x, y, width, height (COCO)
    area: int
    height: int
    width: int
    rle: Optional[dict] = None        # {"size": [h, w], "counts": bytes}: pycocotools' form
    png: Optional[bytes] = None
    low_res_logits: Optional[np.ndarray] = None  # 256 x 256 float32
    # format="polygons": [{"points": [x1, y1, x2, y2, ...], "hole": bool, "parent": int}, ...] in
    # pixel-corner coordinates (see maskd.proto's Polygon); holes name their outer contour.
    polygons: Optional[List[dict]] = None

    def decode(self) -> np.ndarray:
        """The mask at the original image size, uint8 0/1, shape (height, width)."""
        if self.rle is not None:
            from pycocotools import mask as mask_utils
            return np.ascontiguousarray(mask_utils.decode(self.rle))
        if self.png is not None:
            from PIL import Image
            return (np.asarray(Image.open(io.BytesIO(self.png)).convert("L")) > 0).astype(np.uint8)
        if self.polygons is not None:
            from pycocotools import mask as mask_utils
            # Outer contours add and holes subtract (an island in a hole is an outer contour again).
            acc = np.zeros((self.height, self.width), np.int32)
            for p in self.polygons:
                rle = mask_utils.frPyObjects([list(p["points"])], self.height, self.width)
                piece = mask_utils.decode(rle)[:, :, 0].astype(np.int32)
                acc += -piece if p["hole"] else piece
            return (acc > 0).astype(np.uint8)
        raise ValueError("this result holds only 256x256 low-res logits; ask for format='rle', 'png' "
                         "or 'polygons'")


@dataclass
class PromptResult:
    result_id: str
    best_index: int
    masks: List[Mask] = field(default_factory=list)

    @property
    def best(self) -> Mask:
        return self.masks[self.best_index]


@dataclass
class SegmentResult:
    image_id: str
    width: int
    height: int
    cached: bool
    prompts: List[PromptResult]
    request_tag: str
    response: maskd_pb2.SegmentResponse  # the raw message (timing etc.)


def _mask_from_proto(m: maskd_pb2.MaskResult, width: int, height: int) -> Mask:
    out = Mask(score=m.score, stability_score=m.stability_score,
               bbox=(m.bbox.x, m.bbox.y, m.bbox.width, m.bbox.height), area=m.area,
               height=height, width=width)
    which = m.WhichOneof("data")
    if which == "rle":
        out.rle = {"size": [int(m.rle.size[0]), int(m.rle.size[1])], "counts": m.rle.counts.encode("ascii")}
    elif which == "png":
        out.png = bytes(m.png)
    elif which == "low_res_logits":
        lr = m.low_res_logits
        out.low_res_logits = np.asarray(lr.values, dtype=np.float32).reshape(lr.height, lr.width)
    elif which == "polygons":
        out.polygons = [{"points": list(p.points), "hole": p.hole, "parent": p.parent}
                        for p in m.polygons.polygons]
    return out


def _result_from_proto(r: maskd_pb2.SegmentResponse) -> SegmentResult:
    prompts = [PromptResult(result_id=p.result_id, best_index=p.best_index,
                            masks=[_mask_from_proto(m, r.width, r.height) for m in p.masks])
               for p in r.results]
    return SegmentResult(image_id=r.image_id, width=r.width, height=r.height, cached=r.cached,
                         prompts=prompts, request_tag=r.request_tag, response=r)


# GenerateMasks' parameters (the original SamAutomaticMaskGenerator's keyword arguments).
GENERATION_PARAMS = ("points_per_side", "points_per_batch", "pred_iou_thresh", "stability_score_thresh",
                     "stability_score_offset", "box_nms_thresh", "crop_n_layers", "crop_nms_thresh",
                     "crop_overlap_ratio", "crop_n_points_downscale_factor", "min_mask_region_area")


@dataclass
class GeneratedMask(Mask):
    """One mask of GenerateMasks: the original's record fields. `score` is its predicted IoU;
    bbox is the original's XYWH; point_coords [[x, y]] and crop_box (x, y, w, h) in pixels."""
    predicted_iou: float = 0.0
    point_coords: List[Tuple[float, float]] = field(default_factory=list)
    crop_box: Tuple[int, int, int, int] = (0, 0, 0, 0)

    def record(self) -> dict:
        """The original generator's output record (output_mode='binary_mask': a bool array)."""
        return {"segmentation": self.decode().astype(bool), "area": self.area, "bbox": list(self.bbox),
                "predicted_iou": self.predicted_iou, "point_coords": [list(p) for p in self.point_coords],
                "stability_score": self.stability_score, "crop_box": list(self.crop_box)}


@dataclass
class GenerateResult:
    image_id: str
    width: int
    height: int
    cached: bool
    masks: List[GeneratedMask]
    request_tag: str
    response: maskd_pb2.GenerateMasksResponse  # the raw message (timing, stats)


def _generated_from_proto(r: maskd_pb2.GenerateMasksResponse) -> GenerateResult:
    masks = []
    for m in r.masks:
        g = GeneratedMask(score=m.predicted_iou, stability_score=m.stability_score,
                          bbox=(m.bbox.x, m.bbox.y, m.bbox.width, m.bbox.height), area=m.area,
                          height=r.height, width=r.width, predicted_iou=m.predicted_iou,
                          point_coords=[(p.x, p.y) for p in m.point_coords],
                          crop_box=(m.crop_box.x, m.crop_box.y, m.crop_box.width, m.crop_box.height))
        which = m.WhichOneof("segmentation")
        if which == "rle":
            g.rle = {"size": [int(m.rle.size[0]), int(m.rle.size[1])], "counts": m.rle.counts.encode("ascii")}
        elif which == "png":
            g.png = bytes(m.png)
        elif which == "polygons":
            g.polygons = [{"points": list(p.points), "hole": p.hole, "parent": p.parent}
                          for p in m.polygons.polygons]
        masks.append(g)
    return GenerateResult(image_id=r.image_id, width=r.width, height=r.height, cached=r.cached,
                          masks=masks, request_tag=r.request_tag, response=r)


def build_generate_request(image: Union[bytes, str], format: str = "rle", request_tag: str = "",
                           polygon_tolerance: float = 0.0, point_grids=None,
                           **params) -> maskd_pb2.GenerateMasksRequest:
    """A GenerateMasksRequest; `params` are the original generator's keyword arguments (those not
    given keep its defaults on the server); point_grids: a list of [(x, y), ...] in [0, 1]."""
    unknown = sorted(set(params) - set(GENERATION_PARAMS))
    if unknown:
        raise ValueError(f"unknown generation parameter(s) {', '.join(unknown)}: expected "
                         f"{', '.join(GENERATION_PARAMS)} or point_grids")
    if format not in ("rle", "png", "polygons"):
        raise ValueError(f"format={format!r}: expected rle, png or polygons")
    req = maskd_pb2.GenerateMasksRequest(output_format=OUTPUT_FORMATS[format], request_tag=request_tag,
                                         polygon_tolerance=polygon_tolerance)
    if isinstance(image, (bytes, bytearray)):
        req.image.encoded = bytes(image)
    else:
        req.image_id = image
    for name, value in params.items():
        if value is not None:
            setattr(req.params, name, value)
    for grid in point_grids or []:
        g = req.params.point_grids.add()
        for x, y in grid:
            g.points.add(x=x, y=y)
    return req


def build_prompt(points: Sequence[PointLike] = (), box: Optional[BoxLike] = None,
                 mask_from: Optional[str] = None, mask_index: Optional[int] = None,
                 multimask: bool = False) -> maskd_pb2.Prompt:
    """One Prompt message. Points: (x, y) or (x, y, label) with label 1 (foreground) / 0 (background)."""
    p = maskd_pb2.Prompt(multimask=multimask)
    for pt in points:
        if len(pt) not in (2, 3):
            raise ValueError(f"point {pt!r}: expected (x, y) or (x, y, label)")
        label = int(pt[2]) if len(pt) == 3 else 1
        if label not in (0, 1):
            raise ValueError(f"point {pt!r}: label must be 1 (foreground) or 0 (background)")
        p.points.add(x=float(pt[0]), y=float(pt[1]),
                     label=maskd_pb2.POINT_LABEL_FOREGROUND if label == 1 else maskd_pb2.POINT_LABEL_BACKGROUND)
    if box is not None:
        if len(box) != 4:
            raise ValueError(f"box {box!r}: expected (x0, y0, x1, y1)")
        p.box.x0, p.box.y0, p.box.x1, p.box.y1 = (float(v) for v in box)
    if mask_from:
        p.mask_input.result_id = mask_from
        if mask_index is not None:
            p.mask_input.mask_index = mask_index
    return p


def build_segment_request(image: Union[bytes, str, None], prompts: Sequence[maskd_pb2.Prompt],
                          format: str = "rle", request_tag: str = "",
                          polygon_tolerance: float = 0.0) -> maskd_pb2.SegmentRequest:
    """`image`: encoded bytes (JPEG/PNG/WebP), an image_id string, or None (SegmentStream: keep the
    stream's current image). `polygon_tolerance`: format="polygons" only, Douglas-Peucker pixels."""
    if format not in OUTPUT_FORMATS:
        raise ValueError(f"format {format!r}: expected one of {sorted(OUTPUT_FORMATS)}")
    req = maskd_pb2.SegmentRequest(output_format=OUTPUT_FORMATS[format], request_tag=request_tag,
                                   polygon_tolerance=polygon_tolerance)
    if isinstance(image, (bytes, bytearray, memoryview)):
        req.image.encoded = bytes(image)
    elif isinstance(image, str):
        req.image_id = image
    elif image is not None:
        raise TypeError(f"image: expected bytes or an image_id str, got {type(image).__name__}")
    req.prompts.extend(prompts)
    return req


def _read_flag_file(flag: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{flag} = {path!r} cannot be read (expected a readable file): "
                         f"{e.strerror}") from None


def _channel_credentials(tls, tls_ca, tls_cert, tls_key, token, token_file):
    """grpc.ChannelCredentials for the security options, or None for plaintext."""
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("tls_cert and tls_key go together (expected both or neither)")
    if token and token_file:
        raise ValueError(f"token and token_file = {token_file!r} both given (expected one)")
    if token_file:
        lines = [l.strip() for l in _read_flag_file("token_file", token_file).decode().splitlines()]
        token = next((l for l in lines if l), "")
        if not token:
            raise ValueError(f"token_file = {token_file!r} holds no token (expected it on the first "
                             "non-empty line)")
    elif not token:
        token = os.environ.get("MASKD_TOKEN", "").strip() or None
    tls = tls or bool(tls_ca) or bool(tls_cert)
    if not tls:
        if token:
            # The token itself is never part of a message.
            raise ValueError("a bearer token (token, token_file or $MASKD_TOKEN) without TLS "
                             "(expected tls=True or tls_ca: tokens are sent over TLS only)")
        return None
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read_flag_file("tls_ca", tls_ca) if tls_ca else None,
        private_key=_read_flag_file("tls_key", tls_key) if tls_key else None,
        certificate_chain=_read_flag_file("tls_cert", tls_cert) if tls_cert else None)
    if token:
        # access_token_call_credentials sends "authorization: Bearer <token>".
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.access_token_call_credentials(token))
    return credentials


class MaskdClient:
    """A connection to one maskd server (or a proxy in front of several). Thread-safe.

    affinity_header: send x-maskd-image-id on Embed/Segment/SegmentStream (see the module's doc).
    identity_retry: after a failed GetInfo for the model identity, seconds during which calls with
    bytes go without the header before the identity is asked for again.

    Security (the same options as maskctl's --tls/--tls-ca/--tls-cert/--tls-key/--tls-server-name/
    --token/--token-file): tls=True, or any of tls_ca (PEM file of the CA that signed maskd's
    certificate; None: the system's roots), tls_cert+tls_key (PEM files for mutual TLS), connects
    with TLS. token (or the first non-empty line of token_file, or $MASKD_TOKEN) is sent on every
    call as "authorization: Bearer <token>"; TLS only (ValueError otherwise), because maskd accepts
    tokens over TLS only and gRPC does not attach call credentials to a plaintext channel.
    """

    def __init__(self, target: str = "localhost:50051", timeout: float = 30.0,
                 max_message_bytes: int = 512 << 20, affinity_header: bool = True,
                 identity_retry: float = 10.0, *, tls: bool = False, tls_ca: Optional[str] = None,
                 tls_cert: Optional[str] = None, tls_key: Optional[str] = None,
                 tls_server_name: Optional[str] = None, token: Optional[str] = None,
                 token_file: Optional[str] = None):
        self.target = target
        self.timeout = timeout
        self.affinity_header = affinity_header
        self.identity_retry = identity_retry
        # Held across the one GetInfo that fills _identity, so that concurrent first callers make one
        # call; by-id calls never take it.
        self._identity_lock = threading.Lock()
        self._identity: Optional[str] = None
        self._identity_failed_at: Optional[float] = None
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]
        credentials = _channel_credentials(tls, tls_ca, tls_cert, tls_key, token, token_file)
        if credentials is None:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            if tls_server_name:
                options.append(("grpc.ssl_target_name_override", tls_server_name))
            self._channel = grpc.secure_channel(target, credentials, options=options)
        self.stub = maskd_pb2_grpc.MaskServiceStub(self._channel)

    def __enter__(self) -> "MaskdClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Blocks until connected; grpc.FutureTimeoutError after `timeout` seconds."""
        grpc.channel_ready_future(self._channel).result(timeout=timeout)

    def model_identity(self) -> Optional[str]:
        """GetInfoResponse.model.identity from one GetInfo, asked for on first use and kept; None
        while unavailable (a failed GetInfo is retried after identity_retry seconds)."""
        with self._identity_lock:
            if self._identity is not None:
                return self._identity
            if (self._identity_failed_at is not None
                    and time.monotonic() - self._identity_failed_at < self.identity_retry):
                return None
            try:
                info = self.info()
            except grpc.RpcError:
                self._identity_failed_at = time.monotonic()
                return None
            # An empty identity (a server that reports none) is kept too: asking again won't help.
            self._identity = info.model.identity
            self._identity_failed_at = None
            return self._identity

    def affinity_key(self, request) -> Optional[str]:
        """The x-maskd-image-id value this client sends with `request` (a SegmentRequest or
        EmbedRequest); None: no header."""
        if not self.affinity_header:
            return None
        if not request.HasField("image"):
            return _image_id.affinity_key("", request)  # by id: no identity needed
        identity = self.model_identity()
        return _image_id.affinity_key(identity, request) if identity else None

    def _metadata(self, request):
        key = self.affinity_key(request)
        return [(_image_id.AFFINITY_HEADER, key)] if key else None

    def _call(self, method, request, metadata=None):
        """One unary call; a failure raises the typed maskd_client.errors class of its code."""
        try:
            return method(request, timeout=self.timeout, metadata=metadata)
        except grpc.RpcError as e:
            if isinstance(e, _errors.MaskdError):
                raise
            raise _errors.from_rpc_error(e) from e

    def embed(self, image: bytes, return_embedding: Optional[str] = None
              ) -> Union[maskd_pb2.EmbedResponse, Embedding]:
        """Embeds (or finds cached) an encoded image. Returns the EmbedResponse; with
        return_embedding='bf16' | 'fp16' | 'fp32' an Embedding whose .features is the image
        embedding as float32 numpy (bf16/fp16: 2 MiB on the wire, fp32: 4 MiB)."""
        req = maskd_pb2.EmbedRequest(image=maskd_pb2.Image(encoded=image))
        if return_embedding is not None:
            if return_embedding not in EMBEDDING_DTYPES:
                raise ValueError(f"return_embedding={return_embedding!r}: expected one of "
                                 f"{', '.join(EMBEDDING_DTYPES)}")
            req.return_embedding = EMBEDDING_DTYPES[return_embedding]
        r = self._call(self.stub.Embed, req, self._metadata(req))
        return Embedding.from_proto(r) if return_embedding is not None else r

    def segment(self, image: Union[bytes, str], points: Sequence[PointLike] = (),
                box: Optional[BoxLike] = None, mask_from: Optional[str] = None,
                mask_index: Optional[int] = None, multimask: bool = False, format: str = "rle",
                request_tag: str = "", polygon_tolerance: float = 0.0) -> SegmentResult:
        """One prompt on one image (encoded bytes, or the image_id of an earlier call)."""
        prompt = build_prompt(points, box, mask_from, mask_index, multimask)
        return self.segment_prompts(image, [prompt], format=format, request_tag=request_tag,
                                    polygon_tolerance=polygon_tolerance)

    def segment_prompts(self, image: Union[bytes, str], prompts: Sequence[maskd_pb2.Prompt],
                        format: str = "rle", request_tag: str = "",
                        polygon_tolerance: float = 0.0) -> SegmentResult:
        """Several prompts (see build_prompt) on one image in one call."""
        req = build_segment_request(image, prompts, format, request_tag, polygon_tolerance)
        md = self._metadata(req)
        return _result_from_proto(self._call(self.stub.Segment, req, md))

    def generate(self, image: Union[bytes, str], format: str = "rle", request_tag: str = "",
                 polygon_tolerance: float = 0.0, point_grids=None, **params) -> GenerateResult:
        """Automatic mask generation ("segment everything") on one image (encoded bytes, or the
        image_id of an earlier call), with the original SamAutomaticMaskGenerator's keyword
        arguments (points_per_side=32, pred_iou_thresh=0.88, ...; unset ones take its defaults)."""
        req = build_generate_request(image, format, request_tag, polygon_tolerance, point_grids, **params)
        return _generated_from_proto(self._call(self.stub.GenerateMasks, req, self._metadata(req)))

    def info(self) -> maskd_pb2.GetInfoResponse:
        return self._call(self.stub.GetInfo, maskd_pb2.GetInfoRequest())

    def health(self, service: str = "maskd.v1.MaskService") -> str:
        """'SERVING', 'NOT_SERVING', ... from grpc.health.v1 (grpcio-health-checking)."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        stub = health_pb2_grpc.HealthStub(self._channel)
        r = self._call(stub.Check, health_pb2.HealthCheckRequest(service=service))
        return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)

    def session(self) -> "SegmentSession":
        """An interactive SegmentStream: send() one request, get its one response. The stream opens
        at the first send(), with the affinity header of that request's image (a stream stays on
        the replica chosen when it opens)."""
        return SegmentSession(self.stub, self.affinity_key if self.affinity_header else None)


class SegmentSession:
    """SegmentStream as request/response pairs. A response carrying `error` raises StreamError."""

    class StreamError(Exception):
        """One message's error; the stream goes on. `.code` (grpc.StatusCode), `.message`, and
        `.error`: the same failure as the typed maskd_client.errors class of its code."""

        def __init__(self, code: grpc.StatusCode, message: str):
            super().__init__(f"{code.name}: {message}")
            self.code = code
            self.message = message
            self.error = _errors.error_for(code, message)

    def __init__(self, stub: maskd_pb2_grpc.MaskServiceStub, affinity_key=None):
        """affinity_key: request -> x-maskd-image-id value or None (None: never send the header)."""
        import queue
        self._stub = stub
        self._affinity_key = affinity_key
        self._queue: "queue.Queue[Optional[maskd_pb2.SegmentRequest]]" = queue.Queue()
        self._responses: Optional[Iterator[maskd_pb2.SegmentResponse]] = None

    def _open(self, first: maskd_pb2.SegmentRequest) -> None:
        # Metadata goes out when the stream opens, so it opens here, keyed by its first image.
        key = self._affinity_key(first) if self._affinity_key else None
        md = [(_image_id.AFFINITY_HEADER, key)] if key else None
        self._responses = self._stub.SegmentStream(self._requests(), metadata=md)

    def _requests(self) -> Iterable[maskd_pb2.SegmentRequest]:
        while True:
            req = self._queue.get()
            if req is None:
                return
            yield req

    def send(self, image: Union[bytes, str, None], points: Sequence[PointLike] = (),
             box: Optional[BoxLike] = None, mask_from: Optional[str] = None,
             mask_index: Optional[int] = None, multimask: bool = False,
             format: str = "rle") -> SegmentResult:
        prompt = build_prompt(points, box, mask_from, mask_index, multimask)
        req = build_segment_request(image, [prompt], format)
        if self._responses is None:
            self._open(req)
        self._queue.put(req)
        r = next(self._responses)
        if r.HasField("error"):
            raise SegmentSession.StreamError(grpc.StatusCode(_code_tuple(r.error.code)), r.error.message)
        return _result_from_proto(r)

    def close(self) -> None:
        if self._responses is None:
            return  # never opened: nothing was sent
        self._queue.put(None)
        for _ in self._responses:
            pass
        self._responses = iter(())

    def __enter__(self) -> "SegmentSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _code_tuple(code: int):
    for c in grpc.StatusCode:
        if c.value[0] == code:
            return c.value
    return grpc.StatusCode.UNKNOWN.value
