// thread_pool.cc — the definitions of thread_pool.h: the workers' loop and their priority.
#include "fastckpt/thread_pool.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <utility>

namespace fastckpt {

ThreadPool::ThreadPool(size_t n, int nice, const char* name) : n_(n == 0 ? 1 : n), nice_(nice), name_(name) {
  std::lock_guard<std::mutex> life(life_);
  start_workers();
}

ThreadPool::~ThreadPool() {
  std::lock_guard<std::mutex> life(life_);
  end_workers();
}

void ThreadPool::start_workers() {
  for (size_t i = 0; i < n_; ++i)
    workers_.emplace_back([this] {
      ::pthread_setname_np(::pthread_self(), name_);  // best effort: a longer name is refused, not cut
      if (nice_ > 0) ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), nice_);
      run();
    });
}

void ThreadPool::end_workers() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
  std::lock_guard<std::mutex> lk(mu_);
  stop_ = false;
}

void ThreadPool::park() {
  std::lock_guard<std::mutex> life(life_);
  end_workers();
}

void ThreadPool::submit(std::function<void()> task) {
  std::lock_guard<std::mutex> life(life_);
  if (workers_.empty()) start_workers();
  {
    std::lock_guard<std::mutex> lk(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void ThreadPool::run() {
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

}  // namespace fastckpt
