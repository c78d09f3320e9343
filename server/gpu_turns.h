// Encoder and decoder batches of one device taking turns on the GPU (--gpu-turns).
//
// Without it the encoder batcher and the decoder batcher each run on their own thread and CUDA
// stream, so an eager decoder batch's hundreds of small kernels compete with an encoder batch's big
// GEMMs for the SMs: measured on the H200 (run 14) a ~181-prompt decoder batch took ~154 ms while an
// encoder batch ran, against 14 ms on an idle GPU. With turns, a batch starts only when the other
// batcher's batch has finished (Engine calls return after their stream is synchronised), in the
// order they asked (a FIFO ticket lock, so neither side can take two turns while the other waits):
// the GPU runs one kind of work at a time, as the offline benchmark does. The price is that a click
// can wait for the encoder batch in progress, so it is a switch, off by default until it has been
// measured both ways on a GPU (BENCHMARKS.md says where that stands).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace maskd::server {

class GpuTurns {
 public:
  // The caller's turn until destruction (or a no-op when `turns` is null).
  class Turn {
   public:
    explicit Turn(GpuTurns* turns) : turns_(turns) {
      if (turns_) ticket_ = turns_->Wait();
    }
    ~Turn() {
      if (turns_) turns_->Done(ticket_);
    }
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;

   private:
    GpuTurns* turns_;
    uint64_t ticket_ = 0;
  };

  // Turns handed out so far (tests and GetInfo-style counters).
  uint64_t turns_taken() const {
    std::lock_guard<std::mutex> lock(mu_);
    return next_;
  }

 private:
  uint64_t Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t mine = next_++;
    cv_.wait(lock, [&] { return serving_ == mine; });
    return mine;
  }
  void Done(uint64_t ticket) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Only the holder releases, and tickets are served in order.
      if (serving_ == ticket) ++serving_;
    }
    cv_.notify_all();
  }

  // Locking: mu_ guards next_ and serving_; cv_ wakes the waiters when serving_ moves.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_ = 0, serving_ = 0;
};

}  // namespace maskd::server
