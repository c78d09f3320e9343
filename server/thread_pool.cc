#include "server/thread_pool.h"

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

}  // namespace maskd::server
