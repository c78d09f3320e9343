#include "server/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>

#include <spdlog/spdlog.h>

#include "server/thread_name.h"

namespace maskd::server {

ThreadPool::ThreadPool(std::string name, int threads, size_t capacity, std::chrono::microseconds spin)
    : name_(std::move(name)), capacity_(capacity), spin_(spin) {
  if (threads < 1) threads = 1;
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) {
    threads_.emplace_back([this, i] {
      NameThisThread(name_ + "/" + std::to_string(i));  // "postprocess/3"
      Loop();
    });
  }
}

ThreadPool::~ThreadPool() { Stop(); }

bool ThreadPool::TrySubmit(std::function<void()> task) {
  bool notify;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return false;
    if (capacity_ > 0 && queue_.size() >= capacity_) return false;
    queue_.push_back(std::move(task));
    spin_.SetReady(true);
    notify = spin_.NeedsNotify(queue_.size());
  }
  if (notify) cv_.notify_one();
  return true;
}

void ThreadPool::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
    spin_.SetReady(true);
  }
  cv_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

size_t ThreadPool::depth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

void ThreadPool::Loop() {
  bool ran = false;  // whether this thread has just finished a task (only then it spins)
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (ran && !stopping_ && queue_.empty()) {
        spin_.Spin(lock);
      }
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      spin_.SetReady(stopping_ || !queue_.empty());
    }
    ran = true;
    // Tasks finish their own calls on errors; this is the last line so that a bug cannot take the
    // thread (and with it the pool) down.
    try {
      task();
    } catch (const std::exception& e) {
      spdlog::error("{} pool: task threw: {}", name_, e.what());
    } catch (...) {
      spdlog::error("{} pool: task threw a non-standard exception", name_);
    }
  }
}

namespace {
// RunSpread's state, shared with its helper tasks: a task that starts after every index was claimed
// touches only this (never `work`, whose captures live on the caller's stack).
struct Spread {
  size_t total = 0;
  std::function<void(size_t)> work;
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::condition_variable cv;
  size_t finished = 0;       // guarded by mu
  std::exception_ptr error;  // the first exception of any index, guarded by mu
  // Claims and runs indices until none is left; an exception is kept for the caller.
  void Run() {
    for (size_t k; (k = next.fetch_add(1)) < total;) {
      std::exception_ptr e;
      try {
        work(k);
      } catch (...) {
        e = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mu);
      if (e && !error) error = e;
      if (++finished == total) cv.notify_all();
    }
  }
};
}  // namespace

void RunSpread(ThreadPool& pool, size_t n, size_t helpers, const std::function<void(size_t)>& fn) {
  helpers = std::min(helpers, n > 0 ? n - 1 : 0);
  // With no helper this thread claims every index itself and the wait below returns at once.
  auto state = std::make_shared<Spread>();
  state->total = n;
  state->work = fn;
  for (size_t h = 0; h < helpers; ++h) (void)pool.TrySubmit([state] { state->Run(); });
  state->Run();
  // Every index is claimed; wait for those still running on helpers.
  std::unique_lock<std::mutex> lock(state->mu);
  state->cv.wait(lock, [&] { return state->finished == n; });
  if (state->error) std::rethrow_exception(state->error);
}

}  // namespace maskd::server
