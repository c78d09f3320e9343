#include "server/thread_pool.h"

#include <spdlog/spdlog.h>

namespace maskd::server {

ThreadPool::ThreadPool(std::string name, int threads, size_t capacity)
    : name_(std::move(name)), capacity_(capacity) {
  if (threads < 1) threads = 1;
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

ThreadPool::~ThreadPool() { Stop(); }

bool ThreadPool::TrySubmit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return false;
    if (capacity_ > 0 && queue_.size() >= capacity_) return false;
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return true;
}

void ThreadPool::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
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
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
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

}  // namespace maskd::server
