// thread_pool.h — a fixed set of worker threads draining a FIFO of tasks.
// Used for the copy threads and the writer threads of an engine.
// Definitions: src/thread_pool.cc.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace fastckpt {

class ThreadPool {
 public:
  // nice > 0 lowers the workers' scheduling priority (Linux: per thread), so
  // background writers yield the CPU to copies the training loop waits on.
  explicit ThreadPool(size_t n, int nice = 0);
  // Runs every task already submitted, then joins the workers.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void submit(std::function<void()> task);
  size_t size() const { return workers_.size(); }

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> workers_;
  bool stop_ = false;
};

}  // namespace fastckpt
