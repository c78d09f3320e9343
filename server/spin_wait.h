// Spin-then-park for the server's worker threads (issue #13: the served click). A thread that has
// just finished work polls for new work for up to a set time before it sleeps on its condition
// variable, so work that arrives meanwhile starts without a wake-up. On the GPU host (a VM) each
// hand-over between the request's threads costs ~35 us at 1 client (run 40's queue stages: p50
// decode_queue 0.034, decoder_queue 0.033, postprocess_queue 0.040 ms), the price of waking an idle
// virtual CPU; a thread still spinning has none. Off unless --spin-wait-us is set: it trades CPU
// (at most that many microseconds a finished task) for latency.
//
// The owner (a pool or a queue) keeps its work under one mutex and tells the gate, under it,
// whether there is work (SetReady); the spinner polls that flag without the lock. Submitters ask
// NeedsNotify under the mutex after queueing: a spinner will see the work, so notify only for work
// beyond the spinning threads.
// The spinner leaves the spin under the mutex (count decremented, then the usual predicate wait),
// so a submitter that skipped the notify always has a spinner that rechecks under the lock.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <mutex>
#include <thread>

namespace maskd::server {

class SpinGate {
 public:
  explicit SpinGate(std::chrono::microseconds spin = std::chrono::microseconds(0)) : spin_(spin) {}

  // Owner, under its mutex, whenever it changes: whether there is work (or the owner is stopping).
  // Nothing to keep when the gate does not spin.
  void SetReady(bool ready) {
    if (spin_.count() > 0) ready_.store(ready, std::memory_order_release);
  }

  // Worker, with `lock` held and nothing queued, right after finishing work: polls the ready flag
  // (without the lock) until it is set or the spin time is over. Returns with `lock` held again.
  void Spin(std::unique_lock<std::mutex>& lock) {
    if (spin_.count() <= 0) return;
    ++spinning_;
    lock.unlock();
    const auto until = std::chrono::steady_clock::now() + spin_;
    while (!ready_.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < until) Relax();
    lock.lock();
    --spinning_;
  }

  // Submitter, under the owner's mutex, after queueing: whether a sleeping thread must be woken for
  // `queued` items (the spinning threads take the first of them).
  bool NeedsNotify(size_t queued) const { return queued > spinning_; }

 private:
  static void Relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    std::this_thread::yield();
#endif
  }

  const std::chrono::microseconds spin_;
  std::atomic<bool> ready_{false};  // written under the owner's mutex, read by spinners without it
  size_t spinning_ = 0;             // guarded by the owner's mutex
};

}  // namespace maskd::server
