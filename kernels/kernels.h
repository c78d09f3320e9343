// maskd's CUDA kernels behind host functions that take LibTorch tensors and an explicit stream.
//
// Every function here has a plain-LibTorch reference (the *Reference functions, also the CPU path)
// that tests compare the kernel against; on CPU tensors, or in a build without CUDA, the public
// function runs the reference. Every kernel launch is checked; a failure throws c10::Error with the
// kernel's name and the CUDA error string (the engine turns it into a Status).
//
// Internal to libmaskd_model: this header includes torch and must not reach server/client code.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace maskd::kernels {

// True when this build contains the CUDA kernels (MASKD_WITH_CUDA).
bool BuiltWithCuda();

// The CUDA stream handle as an opaque pointer, so this header stays free of cuda_runtime.h.
// nullptr = the current LibTorch stream of the tensors' device.
using Stream = void*;

// ---------------------------------------------------------------------------------------------------
// Attention with SAM's decomposed relative position bias, fused (flash-attention style: the
// B x H x N x N score matrix and bias are never materialised).
//
//   out[b, n, h, :] = sum_j softmax_j( scale * q[b,h,n,:] . k[b,h,j,:]
//                                      + rel_h[b,h,n, j / grid_w] + rel_w[b,h,n, j % grid_w] ) v[b,h,j,:]
//
// q, k, v: [B, H, N, D] with the last dimension contiguous (other strides arbitrary, so views of the
//   qkv projection work without copies); bf16 or fp16; N = grid_h * grid_w (queries and keys share
//   the grid, as in SAM's windowed and global attention); D in {64, 80} on CUDA (any on CPU).
// rel_h: [B, H, N, grid_h], rel_w: [B, H, N, grid_w]: q . R_h and q . R_w of the UNSCALED q, as in
//   SAM's add_decomposed_rel_pos; last dimension contiguous; float32 or q's dtype.
// Returns [B, N, H, D] contiguous in q's dtype (ready for the output projection as [B, N, H*D]).
at::Tensor RelPosAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& rel_h, const at::Tensor& rel_w, int64_t grid_h,
                           int64_t grid_w, double scale, Stream stream = nullptr);
// The same function in plain LibTorch (fp32 accumulation), any device and dtype.
at::Tensor RelPosAttentionReference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& rel_h, const at::Tensor& rel_w,
                                    int64_t grid_h, int64_t grid_w, double scale);

// ---------------------------------------------------------------------------------------------------
// Image pre-processing on the device: Pillow-exact antialiased bilinear resize of uint8 RGB (the
// coefficients of model/pil_resize.h, integer arithmetic, so the result is bit-identical to the CPU
// resize), then (x - mean) / std per channel and zero padding to pad_size x pad_size.
//
// rgb: [H, W, 3] uint8 contiguous. out_h/out_w: the resized size (<= pad_size).
// Returns [3, pad_size, pad_size] of out_dtype (float32, bf16 or fp16).
at::Tensor ResizeNormalizePad(const at::Tensor& rgb, int64_t out_h, int64_t out_w, int64_t pad_size,
                              const std::vector<float>& mean, const std::vector<float>& std,
                              at::ScalarType out_dtype, Stream stream = nullptr);
// Reference: model/pil_resize.h on the CPU, then the same normalisation in LibTorch.
at::Tensor ResizeNormalizePadReference(const at::Tensor& rgb, int64_t out_h, int64_t out_w,
                                       int64_t pad_size, const std::vector<float>& mean,
                                       const std::vector<float>& std, at::ScalarType out_dtype);

// ---------------------------------------------------------------------------------------------------
// Mask post-processing, SAM's postprocess_masks fused with thresholding and encoding:
//   low-res logits (256 x 256) --bilinear, align_corners=False--> pad_size x pad_size
//   --crop--> input_h x input_w --bilinear--> orig_h x orig_w --> mask = logit > 0
// without materialising any full-size float tensor; per mask also the area, the tight bbox and SAM's
// stability score (count(logit > +1) / count(logit > -1), 1 when both are 0... see below).
//
// logits: [M, 256, 256] float32/bf16/fp16 contiguous. geometry: [M, 4] int32 (input_h, input_w,
//   orig_h, orig_w) per mask, on the logits' device.
struct MaskPostprocessOutput {
  // [M] int64: pixels with logit > 0.
  at::Tensor area;
  // [M, 4] int32: x, y, width, height of the tight box (all 0 for an empty mask).
  at::Tensor bbox;
  // [M] float32: |logit > 1| / |logit > -1| (1.0 when the latter is 0, i.e. an empty mask).
  at::Tensor stability;
  // want_rle: COCO RLE counts (column-major, first run counts zeros, possibly 0), all masks
  //   concatenated, int32 [total]; rle_offsets [M + 1] int64 into it. On the host (CPU tensors).
  at::Tensor rle_counts;
  at::Tensor rle_offsets;
  // want_bitmask: [sum(orig_h * orig_w)] uint8 (0/1), each mask row-major at bitmask_offsets[m]
  //   ([M + 1] int64). On the host.
  at::Tensor bitmask;
  at::Tensor bitmask_offsets;
};
MaskPostprocessOutput MaskPostprocess(const at::Tensor& logits, const at::Tensor& geometry,
                                      int64_t pad_size, bool want_rle, bool want_bitmask,
                                      Stream stream = nullptr);
// Reference: the original's two F.interpolate calls (upsample_bilinear2d) and a CPU encoder.
MaskPostprocessOutput MaskPostprocessReference(const at::Tensor& logits, const at::Tensor& geometry,
                                               int64_t pad_size, bool want_rle, bool want_bitmask);

// ---------------------------------------------------------------------------------------------------
// int8 dynamic quantisation of a linear layer.
//
// QuantizePerToken: x [M, K] (bf16/fp16/fp32) -> xq [M, K] int8 = round(x / s), s [M] float32 =
//   max|x[m, :]| / 127 (s = 1 where the row is all zero). One fused kernel (absmax + scale + round).
struct QuantizedActivations {
  at::Tensor values;  // int8 [M, K]
  at::Tensor scales;  // float32 [M]
};
QuantizedActivations QuantizePerToken(const at::Tensor& x, Stream stream = nullptr);
QuantizedActivations QuantizePerTokenReference(const at::Tensor& x);

// Weights quantised once at load: w [N, K] -> wq_t [K, N] int8 (column-major for the int8 GEMM, i.e.
// the transpose of the per-channel quantised weight), scales [N] float32 = max|w[n, :]| / 127.
struct QuantizedWeight {
  at::Tensor values_t;  // int8 [K, N]
  at::Tensor scales;    // float32 [N]
};
QuantizedWeight QuantizeWeightPerChannel(const at::Tensor& w);

// y [M, N] (out_dtype) = (xq @ wq_t) * x_scales[m] * w_scales[n] + bias[n]: the int8 tensor-core GEMM
// (at::_int_mm, int32 accumulation) followed by one fused dequantise + bias kernel.
// Requirements of the int8 GEMM: M > 16, K and N multiples of 8.
at::Tensor Int8Linear(const QuantizedActivations& x, const QuantizedWeight& w,
                      const at::Tensor& bias, at::ScalarType out_dtype, Stream stream = nullptr);
at::Tensor Int8LinearReference(const QuantizedActivations& x, const QuantizedWeight& w,
                               const at::Tensor& bias, at::ScalarType out_dtype);

}  // namespace maskd::kernels
