"""Embed's return_embedding through the Python client against a real maskd (CPU fp32, the tiny
golden model): fp32 matches the original SAM's embedding within the golden tolerance and is what the
engine computed, bf16 and fp16 are exactly its round-to-nearest-even (torch's and numpy's own
conversions), a cached image returns it too, bad dtypes are refused; plus the decoding unit."""
import os

import grpc
import numpy as np
import pytest
import torch

from maskd_client import Embedding, InvalidArgument, embedding_to_numpy, maskd_pb2, maskd_pb2_grpc


def _golden(golden_dir):
    with open(os.path.join(golden_dir, "image0.png"), "rb") as f:
        png = f.read()
    tensors = torch.load(os.path.join(golden_dir, "image0.pt"), weights_only=False)
    return png, tensors


def test_embedding_dtypes_against_the_original_and_each_other(client, golden_dir):
    png, t = _golden(golden_dir)
    f32 = client.embed(png, return_embedding="fp32")
    assert isinstance(f32, Embedding)
    assert f32.features.dtype == np.float32 and f32.features.shape == (1, 256, 64, 64)
    assert f32.dtype == "fp32"
    golden = t["embedding"].numpy()
    assert np.abs(f32.features - golden).max() <= 1e-3  # the golden README's tolerance
    assert f32.input_size == tuple(int(v) for v in t["input_size"])
    assert f32.original_size == tuple(int(v) for v in t["original_size"])
    assert len(f32.response.embedding.data) == 4 * 256 * 64 * 64

    bf16 = client.embed(png, return_embedding="bf16")
    assert bf16.cached and bf16.image_id == f32.image_id
    assert len(bf16.response.embedding.data) == 2 * 256 * 64 * 64
    want_bf16 = torch.from_numpy(f32.features).to(torch.bfloat16).to(torch.float32).numpy()
    assert np.array_equal(bf16.features.view(np.uint32), want_bf16.view(np.uint32))

    fp16 = client.embed(png, return_embedding="fp16")
    want_fp16 = f32.features.astype(np.float16).astype(np.float32)
    assert np.array_equal(fp16.features.view(np.uint32), want_fp16.view(np.uint32))
    assert fp16.input_size == f32.input_size

    plain = client.embed(png)
    assert isinstance(plain, maskd_pb2.EmbedResponse) and not plain.HasField("embedding")


def test_bad_dtypes_are_refused(client, golden_dir):
    png, _ = _golden(golden_dir)
    with pytest.raises(ValueError, match="int8"):
        client.embed(png, return_embedding="int8")
    # A number outside the enum reaches the server (proto3 keeps it) and is refused by name.
    req = maskd_pb2.EmbedRequest(image=maskd_pb2.Image(encoded=png), return_embedding=7)
    with pytest.raises(InvalidArgument) as e:
        client._call(client.stub.Embed, req)
    assert "return_embedding = 7" in e.value.details()


def test_embedding_to_numpy_layout():
    vals = np.array([1.0, -2.0, 3.140625, 65504.0], dtype=np.float32)
    e = maskd_pb2.ImageEmbedding(dtype=maskd_pb2.EMBEDDING_DTYPE_FP16, shape=[1, 2, 2],
                                 data=vals.astype("<f2").tobytes())
    assert np.array_equal(embedding_to_numpy(e), vals.reshape(1, 2, 2))
    bf = (vals.view("<u4") >> 16).astype("<u2").tobytes()  # these values are exact in bf16 ...
    e = maskd_pb2.ImageEmbedding(dtype=maskd_pb2.EMBEDDING_DTYPE_BF16, shape=[4], data=bf)
    assert np.array_equal(embedding_to_numpy(e)[:3], vals[:3])  # ... except 65504 (truncated here)
    e = maskd_pb2.ImageEmbedding(dtype=maskd_pb2.EMBEDDING_DTYPE_FP32, shape=[2, 2],
                                 data=vals.astype("<f4").tobytes())
    assert np.array_equal(embedding_to_numpy(e), vals.reshape(2, 2))
    with pytest.raises(ValueError, match="needs 8"):
        embedding_to_numpy(maskd_pb2.ImageEmbedding(dtype=maskd_pb2.EMBEDDING_DTYPE_FP32,
                                                    shape=[2, 4], data=b"\0" * 4))


def test_maskctl_out_embedding_is_a_numpy_file(request, client, maskd_target, golden_dir, tmp_path):
    """maskctl writes .npy without numpy; numpy reads it back as the same values."""
    import subprocess
    maskd = request.config.getoption("--maskd")
    maskctl = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(maskd))), "client", "maskctl")
    if not os.access(maskctl, os.X_OK):
        pytest.skip(f"maskctl not found next to maskd ({maskctl})")
    out = tmp_path / "emb.npy"
    r = subprocess.run([maskctl, "--server", maskd_target, "embed", os.path.join(golden_dir, "image0.png"),
                        "--return-embedding", "fp16", "--out-embedding", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    arr = np.load(out)
    assert arr.dtype == np.float32 and arr.shape == (1, 256, 64, 64)
    png, _ = _golden(golden_dir)
    want = client.embed(png, return_embedding="fp16").features
    assert np.array_equal(arr, want)
