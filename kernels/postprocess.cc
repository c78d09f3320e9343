#include <algorithm>
#include <climits>
#include <cstdint>
#include <vector>

#include "kernels/internal.h"
#include "kernels/kernels.h"

namespace maskd::kernels {
namespace {

using internal::CheckDim;
using internal::CheckSize;
using internal::Describe;

struct Geometry {
  int64_t input_h, input_w, orig_h, orig_w;
};

// Checks the arguments and returns the per-mask geometry on the host.
std::vector<Geometry> CheckPostprocessArgs(const at::Tensor& logits, const at::Tensor& geometry,
                                           int64_t pad_size) {
  CheckDim(logits, "logits", 3);
  const auto st = logits.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kBFloat16 || st == at::kHalf,
              "logits: expected float32, bfloat16 or float16, got ", Describe(logits));
  TORCH_CHECK(logits.size(1) > 0 && logits.size(2) > 0, "logits: expected non-empty masks, got ",
              Describe(logits));
  CheckDim(geometry, "geometry", 2);
  CheckSize(geometry, "geometry", 0, logits.size(0));
  CheckSize(geometry, "geometry", 1, 4);
  TORCH_CHECK(geometry.scalar_type() == at::kInt, "geometry: expected int32, got ",
              Describe(geometry));
  TORCH_CHECK(pad_size > 0, "pad_size: expected > 0, got ", pad_size);
  const at::Tensor g = geometry.to(at::kCPU).contiguous();
  const int32_t* p = g.data_ptr<int32_t>();
  std::vector<Geometry> out(static_cast<size_t>(g.size(0)));
  for (size_t m = 0; m < out.size(); ++m) {
    Geometry& x = out[m];
    x = {p[4 * m], p[4 * m + 1], p[4 * m + 2], p[4 * m + 3]};
    TORCH_CHECK(x.input_h >= 1 && x.input_h <= pad_size && x.input_w >= 1 &&
                    x.input_w <= pad_size,
                "geometry[", m, "]: expected input size within 1..pad_size (", pad_size,
                "), got ", x.input_h, " x ", x.input_w);
    TORCH_CHECK(x.orig_h >= 1 && x.orig_w >= 1 && x.orig_h * x.orig_w < (int64_t{1} << 31),
                "geometry[", m, "]: expected an original size of 1 .. 2^31 - 1 pixels, got ",
                x.orig_h, " x ", x.orig_w);
  }
  return out;
}

// COCO RLE of a column-major 0/1 sequence: run lengths alternating zeros, ones, starting with zeros.
void EncodeRle(const uint8_t* col_major, int64_t n, std::vector<int32_t>& counts) {
  uint8_t current = 0;
  int64_t run = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (col_major[i] != current) {
      counts.push_back(static_cast<int32_t>(run));
      current = col_major[i];
      run = 0;
    }
    ++run;
  }
  counts.push_back(static_cast<int32_t>(run));
}

MaskPostprocessOutput EmptyOutput(bool want_rle, bool want_bitmask) {
  MaskPostprocessOutput o;
  o.area = at::empty({0}, at::kLong);
  o.bbox = at::empty({0, 4}, at::kInt);
  o.stability = at::empty({0}, at::kFloat);
  if (want_rle) {
    o.rle_counts = at::empty({0}, at::kInt);
    o.rle_offsets = at::zeros({1}, at::kLong);
  }
  if (want_bitmask) {
    o.bitmask = at::empty({0}, at::kByte);
    o.bitmask_offsets = at::zeros({1}, at::kLong);
  }
  return o;
}

// x, y, width, height (width = x_max - x_min + 1, as pycocotools' toBbox) or zeros when empty.
void FillBox(int32_t* box, int64_t area, int32_t xmin, int32_t ymin, int32_t xmax, int32_t ymax) {
  if (area == 0) {
    box[0] = box[1] = box[2] = box[3] = 0;
    return;
  }
  box[0] = xmin;
  box[1] = ymin;
  box[2] = xmax - xmin + 1;
  box[3] = ymax - ymin + 1;
}

float Stability(int64_t n_hi, int64_t n_lo) {
  return n_lo == 0 ? 1.0f : static_cast<float>(n_hi) / static_cast<float>(n_lo);
}

#ifdef MASKD_WITH_CUDA
// Most runs (every pixel a boundary, plus the end slots) for which the string-only path sizes its
// scratch from the pixels instead of waiting for the device's count: a click's three masks of a
// 1024 x 1365 image; the room costs 8 bytes of device memory a run and 5 pinned chars.
constexpr int64_t kUnsyncedRunsRoom = int64_t{1} << 22;

// Most chars of COCO's string for one value of magnitude <= limit: 5 bits a char, the last char's
// high bit the sign.
int64_t MaxRleStringChars(int64_t limit) {
  int64_t n = 1;
  while (n < 13 && (int64_t{1} << (5 * n - 1)) <= limit) ++n;
  return n;
}

// The device's address of pinned host memory (cudaHostAlloc'd memory is mapped under unified
// addressing), or null when it has none.
void* MappedDevicePointer(void* host) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, host) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return attr.type == cudaMemoryTypeHost ? attr.devicePointer : nullptr;
}

MaskPostprocessOutput MaskPostprocessCuda(const at::Tensor& logits_in, const at::Tensor& geometry,
                                          int64_t pad_size, bool want_rle, bool want_bitmask,
                                          Stream stream, bool want_rle_string, bool want_rle_counts) {
  internal::StreamScope scope(stream, logits_in.device());
  const std::vector<Geometry> geo = CheckPostprocessArgs(logits_in, geometry, pad_size);
  const int64_t M = static_cast<int64_t>(geo.size());
  if (M == 0) return EmptyOutput(want_rle, want_bitmask);
  TORCH_CHECK(M < (int64_t{1} << 31), "logits: expected fewer than 2^31 masks, got ", M);
  const at::Tensor logits = logits_in.contiguous();
  const auto dev = logits.options();
  const auto pinned = [](at::ScalarType t) {
    return at::TensorOptions().dtype(t).pinned_memory(true);
  };

  // Per-mask table (geometry + offsets) in one pinned upload.
  at::Tensor table_host = at::empty({M, detail::kMaskTableCols}, pinned(at::kLong));
  int64_t* tp = table_host.data_ptr<int64_t>();
  int64_t words_total = 0, pixels_total = 0, max_groups = 0;
  for (int64_t m = 0; m < M; ++m) {
    const Geometry& g = geo[m];
    int64_t* row = tp + m * detail::kMaskTableCols;
    row[detail::kColInputH] = g.input_h;
    row[detail::kColInputW] = g.input_w;
    row[detail::kColOrigH] = g.orig_h;
    row[detail::kColOrigW] = g.orig_w;
    row[detail::kColWordOffset] = words_total;
    row[detail::kColBitmaskOffset] = pixels_total;
    words_total += g.orig_w * ((g.orig_h + 31) / 32);
    pixels_total += g.orig_h * g.orig_w;
    max_groups = std::max<int64_t>(
        max_groups, (g.orig_w + detail::kMaskColumnsPerBlock - 1) / detail::kMaskColumnsPerBlock);
  }
  TORCH_CHECK(max_groups <= 65535, "geometry: expected original widths up to ",
              65535 * detail::kMaskColumnsPerBlock, " pixels");
  const at::Tensor table = table_host.to(logits.device(), /*non_blocking=*/true);

  // Device scratch in one allocation, in int64 units (int32 arrays take half a unit per value).
  const int64_t G = max_groups;
  const int64_t S = detail::kRleStringSegments;
  const auto half = [](int64_t n) { return (n + 1) / 2; };
  int64_t units = 0;
  const auto take = [&units](int64_t n) {
    const int64_t begin = units;
    units += n;
    return begin;
  };
  const int64_t u_counts = take(M * 3), u_extent = take(M * 2), u_words = take(half(words_total));
  int64_t u_block_counts = 0, u_base = 0, u_offsets = 0, u_seg_chars = 0, u_seg_base = 0, u_string_offsets = 0;
  if (want_rle) {
    u_block_counts = take(half(M * G));
    u_base = take(M * G);
    u_offsets = take(M + 1);
    u_seg_chars = take(half(M * S));
    u_seg_base = take(M * S);
    u_string_offsets = take(M + 1);
  }
  const at::Tensor scratch = at::empty({units}, dev.dtype(at::kLong));
  int64_t* const sp = scratch.data_ptr<int64_t>();
  const auto i32 = [sp](int64_t u) { return reinterpret_cast<int32_t*>(sp + u); };
  // Host results, one pinned allocation: per-mask statistics, the regions' and strings' offsets.
  const at::Tensor host = at::empty({M * 5 + 2 * (M + 1)}, pinned(at::kLong));
  const at::Tensor counts_host = host.narrow(0, 0, M * 3);
  const at::Tensor extent_host = host.narrow(0, M * 3, M * 2).view(at::kInt);
  const at::Tensor offsets_host = host.narrow(0, M * 5, M + 1);
  const at::Tensor string_offsets_host = host.narrow(0, M * 6 + 1, M + 1);
  const auto to_host = [&scope](const at::Tensor& dst, const void* src) {
    internal::CheckLaunch(cudaMemcpyAsync(dst.data_ptr(), src, dst.nbytes(), cudaMemcpyDeviceToHost, scope.get()),
                          "cudaMemcpyAsync (to the host)");
  };
  const auto wait_for_device = [&scope] {
    const cudaError_t sync = cudaStreamSynchronize(scope.get());
    TORCH_CHECK(sync == cudaSuccess, "MaskPostprocess: cudaStreamSynchronize: ", cudaGetErrorString(sync));
  };
  at::Tensor bitmask_dev;
  if (want_bitmask) bitmask_dev = at::empty({pixels_total}, dev.dtype(at::kByte));

  detail::MaskEvalArgs ea;
  ea.logits = logits.data_ptr();
  ea.num_masks = static_cast<int>(M);
  ea.low_h = static_cast<int>(logits.size(1));
  ea.low_w = static_cast<int>(logits.size(2));
  ea.pad = static_cast<int>(pad_size);
  ea.table = table.data_ptr<int64_t>();
  ea.max_groups = static_cast<int>(max_groups);
  ea.words = reinterpret_cast<uint32_t*>(i32(u_words));
  ea.counts = reinterpret_cast<unsigned long long*>(sp + u_counts);
  ea.extent = i32(u_extent);
  ea.bitmask = want_bitmask ? bitmask_dev.data_ptr<uint8_t>() : nullptr;
  internal::CheckLaunch(detail::LaunchMaskStatsInit(ea.counts, ea.extent, ea.num_masks, scope.get()),
                        "MaskStatsInitKernel");
  internal::CheckLaunch(
      detail::LaunchMaskEval(ea, internal::ToDType(logits.scalar_type(), "logits"), scope.get()),
      "MaskEvalColumnsKernel");

  MaskPostprocessOutput out;
  at::Tensor chars_host;  // the strings' room (pinned); out.rle_string is its used part
  if (want_rle) {
    detail::MaskRleArgs ra;
    ra.words = ea.words;
    ra.table = ea.table;
    ra.num_masks = ea.num_masks;
    ra.max_groups = ea.max_groups;
    ra.block_counts = i32(u_block_counts);
    internal::CheckLaunch(detail::LaunchMaskRleCount(ra, scope.get()), "MaskRleKernel<count>");
    // Mask m's region holds its boundaries then one slot for the end: base(m, g) = boundaries
    // before (m, g) in mask-major, column-group order + m end slots.
    int64_t* const offsets = sp + u_offsets;
    internal::CheckLaunch(detail::LaunchGroupScan(ra.block_counts, ea.num_masks, ea.max_groups, /*extra=*/1,
                                                  sp + u_base, offsets, scope.get()),
                          "GroupScanKernel<runs>");
    to_host(offsets_host, offsets);
    // Room for the runs: with the string alone and few pixels, every pixel's worth (no wait for the
    // device: a click's three masks go through with one synchronisation); else the exact total,
    // which costs one synchronisation here.
    const bool want_counts = want_rle_counts || !want_rle_string;
    int64_t runs_room = pixels_total + M;
    const bool bounded = !want_counts && runs_room <= kUnsyncedRunsRoom;
    if (!bounded) {
      wait_for_device();
      runs_room = offsets_host.data_ptr<int64_t>()[M];
    }
    const at::Tensor runs = at::empty({2 * runs_room}, dev.dtype(at::kInt));
    int32_t* const positions = runs.data_ptr<int32_t>();
    int32_t* const rle_dev = positions + runs_room;
    ra.block_base = sp + u_base;
    ra.positions = positions;
    internal::CheckLaunch(detail::LaunchMaskRleWrite(ra, scope.get()), "MaskRleKernel<write>");
    internal::CheckLaunch(
        detail::LaunchMaskRleDiff(positions, offsets, ea.table, ea.num_masks, rle_dev, scope.get()),
        "MaskRleDiffKernel");
    if (want_counts) {
      out.rle_counts = at::empty({runs_room}, pinned(at::kInt));
      to_host(out.rle_counts, rle_dev);
    }
    out.rle_offsets = offsets_host;

    if (want_rle_string) {
      // COCO's string too, so that the host only copies bytes (a noisy 1024 x 768 mask has ~5 x 10^4
      // runs: ~0.3-0.6 ms of CPU per mask in RleCountsToString), ending in pinned host memory: its
      // room is each run's most chars, and only the used part is read.
      int32_t* const seg_chars = i32(u_seg_chars);
      int64_t* const string_offsets = sp + u_string_offsets;
      internal::CheckLaunch(
          detail::LaunchRleStringSegmentChars(rle_dev, offsets, ea.num_masks, seg_chars, scope.get()),
          "RleStringSegmentKernel<chars>");
      internal::CheckLaunch(detail::LaunchGroupScan(seg_chars, ea.num_masks, static_cast<int>(S), /*extra=*/0,
                                                    sp + u_seg_base, string_offsets, scope.get()),
                            "GroupScanKernel<chars>");
      to_host(string_offsets_host, string_offsets);
      const int64_t* const oh = offsets_host.data_ptr<int64_t>();
      int64_t chars_room = 0;
      for (int64_t m = 0; m < M; ++m) {
        const int64_t hw = geo[m].orig_h * geo[m].orig_w;
        chars_room += (bounded ? hw + 1 : oh[m + 1] - oh[m]) * MaxRleStringChars(hw);
      }
      chars_host = at::empty({chars_room}, pinned(at::kByte));
      // The strings are written in device memory (each thread's few chars at scattered offsets),
      // then the used bytes go to the pinned buffer through its device mapping in 16-byte stores:
      // run 26 (H100) had the writer store straight into the mapping at 0.52 ms for 64 masks, its
      // narrow writes crossing the bus one by one. Without a mapping, the whole room is copied.
      const at::Tensor chars_dev = at::empty({chars_room}, dev.dtype(at::kByte));
      internal::CheckLaunch(detail::LaunchRleStringSegmentWrite(rle_dev, offsets, ea.num_masks, sp + u_seg_base,
                                                                chars_dev.data_ptr<uint8_t>(), scope.get()),
                            "RleStringSegmentKernel<write>");
      if (auto* mapped = static_cast<uint8_t*>(MappedDevicePointer(chars_host.data_ptr()))) {
        internal::CheckLaunch(detail::LaunchCopyCountedBytes(chars_dev.data_ptr<uint8_t>(), mapped,
                                                             string_offsets + M,
                                                             internal::MultiProcessors(logits_in.device()),
                                                             scope.get()),
                              "CopyCountedBytesKernel");
      } else {
        to_host(chars_host, chars_dev.data_ptr());
      }
    }
  }
  to_host(counts_host, sp + u_counts);
  to_host(extent_host, i32(u_extent));
  if (want_bitmask) {
    out.bitmask = at::empty({pixels_total}, pinned(at::kByte));
    out.bitmask.copy_(bitmask_dev, /*non_blocking=*/true);
    out.bitmask_offsets = at::empty({M + 1}, at::kLong);
    int64_t* bo = out.bitmask_offsets.data_ptr<int64_t>();
    for (int64_t m = 0; m < M; ++m) bo[m] = tp[m * detail::kMaskTableCols + detail::kColBitmaskOffset];
    bo[M] = pixels_total;
  }
  wait_for_device();
  if (want_rle && want_rle_string) {
    out.rle_string_offsets = string_offsets_host;
    const int64_t used = string_offsets_host.data_ptr<int64_t>()[M];
    TORCH_CHECK(used <= chars_host.numel(), "MaskPostprocess: the RLE strings took ", used,
                " chars, more than their room of ", chars_host.numel());
    out.rle_string = chars_host.narrow(0, 0, used);
  }

  out.area = at::empty({M}, at::kLong);
  out.bbox = at::empty({M, 4}, at::kInt);
  out.stability = at::empty({M}, at::kFloat);
  const int64_t* c = counts_host.data_ptr<int64_t>();
  const int32_t* e = extent_host.data_ptr<int32_t>();
  for (int64_t m = 0; m < M; ++m) {
    out.area.data_ptr<int64_t>()[m] = c[3 * m];
    FillBox(out.bbox.data_ptr<int32_t>() + 4 * m, c[3 * m], e[4 * m], e[4 * m + 1], e[4 * m + 2],
            e[4 * m + 3]);
    out.stability.data_ptr<float>()[m] = Stability(c[3 * m + 1], c[3 * m + 2]);
  }
  return out;
}
#endif

}  // namespace

MaskPostprocessOutput MaskPostprocessReference(const at::Tensor& logits, const at::Tensor& geometry,
                                               int64_t pad_size, bool want_rle,
                                               bool want_bitmask) {
  const std::vector<Geometry> geo = CheckPostprocessArgs(logits, geometry, pad_size);
  const int64_t M = static_cast<int64_t>(geo.size());
  if (M == 0) return EmptyOutput(want_rle, want_bitmask);
  MaskPostprocessOutput out;
  out.area = at::empty({M}, at::kLong);
  out.bbox = at::empty({M, 4}, at::kInt);
  out.stability = at::empty({M}, at::kFloat);
  std::vector<int32_t> rle;
  std::vector<int64_t> rle_offsets{0};
  std::vector<uint8_t> bitmask;
  std::vector<int64_t> bitmask_offsets{0};
  // Runs of masks with one geometry go through LibTorch together, on the logits' device (the plain
  // path of a CUDA engine runs there, like the original); only what is returned comes to the host.
  for (int64_t first = 0; first < M;) {
    const Geometry& g = geo[first];
    int64_t last = first + 1;
    while (last < M && geo[last].input_h == g.input_h && geo[last].input_w == g.input_w &&
           geo[last].orig_h == g.orig_h && geo[last].orig_w == g.orig_w)
      ++last;
    const int64_t n = last - first;
    // SAM's postprocess_masks: interpolate to the padded input size, crop, interpolate to the
    // original size (bilinear, align_corners=False), then `> mask_threshold` (0).
    const at::Tensor low = logits.slice(0, first, last).unsqueeze(1);
    const at::Tensor up = at::upsample_bilinear2d(low, {pad_size, pad_size}, false);
    const at::Tensor crop = up.slice(2, 0, g.input_h).slice(3, 0, g.input_w);
    const at::Tensor full = at::upsample_bilinear2d(crop, {g.orig_h, g.orig_w}, false).squeeze(1);
    const at::Tensor mask = full > 0;  // [n, H, W]
    // Tight box from the rows and columns that hold a mask pixel.
    const at::Tensor rows = mask.any(2).to(at::kInt), cols = mask.any(1).to(at::kInt);
    const at::Tensor ymin = rows.argmax(1), ymax = g.orig_h - 1 - rows.flip(1).argmax(1);
    const at::Tensor xmin = cols.argmax(1), xmax = g.orig_w - 1 - cols.flip(1).argmax(1);
    const at::Tensor stats =
        at::stack({mask.sum({1, 2}), (full > 1).sum({1, 2}), (full > -1).sum({1, 2}), xmin, ymin, xmax, ymax}, 1)
            .to(at::kCPU, at::kLong)
            .contiguous();
    const int64_t* st = stats.data_ptr<int64_t>();
    at::Tensor mask_cpu;
    if (want_rle || want_bitmask) mask_cpu = mask.to(at::kCPU).to(at::kByte).contiguous();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t m = first + i;
      const int64_t* r = st + 7 * i;
      out.area.data_ptr<int64_t>()[m] = r[0];
      out.stability.data_ptr<float>()[m] = Stability(r[1], r[2]);
      FillBox(out.bbox.data_ptr<int32_t>() + 4 * m, r[0], static_cast<int32_t>(r[3]), static_cast<int32_t>(r[4]),
              static_cast<int32_t>(r[5]), static_cast<int32_t>(r[6]));
      if (want_rle) {
        const at::Tensor col_major = mask_cpu[i].t().contiguous();
        EncodeRle(col_major.data_ptr<uint8_t>(), col_major.numel(), rle);
        rle_offsets.push_back(static_cast<int64_t>(rle.size()));
      }
      if (want_bitmask) {
        const uint8_t* px = mask_cpu[i].data_ptr<uint8_t>();
        bitmask.insert(bitmask.end(), px, px + g.orig_h * g.orig_w);
        bitmask_offsets.push_back(static_cast<int64_t>(bitmask.size()));
      }
    }
    first = last;
  }
  if (want_rle) {
    out.rle_counts = at::tensor(at::ArrayRef<int32_t>(rle), at::kInt);
    out.rle_offsets = at::tensor(at::ArrayRef<int64_t>(rle_offsets), at::kLong);
  }
  if (want_bitmask) {
    out.bitmask = at::tensor(at::ArrayRef<uint8_t>(bitmask), at::kByte);
    out.bitmask_offsets = at::tensor(at::ArrayRef<int64_t>(bitmask_offsets), at::kLong);
  }
  return out;
}

MaskPostprocessOutput MaskPostprocess(const at::Tensor& logits, const at::Tensor& geometry,
                                      int64_t pad_size, bool want_rle, bool want_bitmask,
                                      Stream stream, bool want_rle_string, bool want_rle_counts) {
#ifdef MASKD_WITH_CUDA
  if (logits.is_cuda()) {
    return MaskPostprocessCuda(logits, geometry, pad_size, want_rle, want_bitmask, stream,
                               want_rle_string, want_rle_counts);
  }
#endif
  (void)stream;
  (void)want_rle_string;
  (void)want_rle_counts;
  return MaskPostprocessReference(logits, geometry, pad_size, want_rle, want_bitmask);
}

}  // namespace maskd::kernels
