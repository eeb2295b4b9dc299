// thread_pool.h — a fixed set of worker threads draining a FIFO of tasks.
// Used for the copy threads and the writer threads of an engine.
#pragma once
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <condition_variable>
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
  explicit ThreadPool(size_t n, int nice = 0) {
    if (n == 0) n = 1;
    for (size_t i = 0; i < n; ++i)
      workers_.emplace_back([this, nice] {
        if (nice > 0) ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), nice);
        run();
      });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void submit(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }
  size_t size() const { return workers_.size(); }

 private:
  void run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [this] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) return;  // stop_ and drained
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> workers_;
  bool stop_ = false;
};

}  // namespace fastckpt
