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
  // name (at most 15 characters) is what top -H, py-spy and /proc/<pid>/task/*/comm
  // show for each worker.
  explicit ThreadPool(size_t n, int nice = 0, const char* name = "fastckpt-pool");
  // Runs every task already submitted, then joins the workers.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues a task; starts the workers again after park().
  void submit(std::function<void()> task);
  // Runs every task already submitted, then ends the workers: an idle pool holds no thread.
  // Called with nothing in flight and never from one of its own tasks.
  void park();
  size_t size() const { return n_; }

 private:
  void start_workers();  // under life_
  void end_workers();    // under life_
  void run();

  const size_t n_;
  const int nice_;
  const char* const name_;
  std::mutex life_;  // starting and ending the workers: a submit never meets them half ended
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> workers_;
  bool stop_ = false;
};

}  // namespace fastckpt
