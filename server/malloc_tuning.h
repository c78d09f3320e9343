// glibc malloc settings for a process that allocates and frees buffers of tens to hundreds of
// kilobytes per call (responses, RLE strings, gRPC slices): maskd, and maskload that measures it.
//
// With glibc's defaults the heap's top is given back to the kernel whenever more than 128 KiB of it
// is free (M_TRIM_THRESHOLD), and blocks from 128 KiB up are mmap'd, so every call's buffers come
// back as fresh pages: page faults and brk/madvise calls in each call. On a 165 KB SegmentResponse
// (a click's three random-weight RLE masks) over loopback gRPC, keeping freed memory cut the round
// trip's p50 from 312-338 to 232-237 us on the idle CI host, and from 123-162 to 90-95 us with
// another process keeping its cores awake (2026-12-06; bench/results/2026-12-06-cpu-malloc). The
// trim threshold is what matters; the mmap threshold alone changes nothing.
// The price is resident memory: up to the trim threshold of free heap stays mapped per arena.
#pragma once

#include <malloc.h>

#include <cstddef>

namespace maskd::server {

// Freed memory is kept up to 256 MiB at a heap's top, and blocks below 32 MiB come from the heap.
// True when glibc took both settings (false on other C libraries, where this does nothing).
inline bool TuneMallocForServing() {
#ifdef __GLIBC__
  constexpr int kTrimThreshold = 256 << 20;
  constexpr int kMmapThreshold = 32 << 20;
  return mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1 && mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1;
#else
  return false;
#endif
}

}  // namespace maskd::server
