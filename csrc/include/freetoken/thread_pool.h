// A persistent pool of worker threads running blocking parallel-for loops.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace freetoken {

// Number of physical cores this process may run on (distinct core ids among the CPUs in its
// affinity mask); falls back to std::thread::hardware_concurrency().
int physical_core_count();

class ThreadPool {
 public:
  // Starts num_threads workers (at least 1); they sleep between loops.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()); }

  // Runs fn(task) for task in [0, num_tasks) on the workers and returns when all finished.
  // Tasks are handed out dynamically. The first exception thrown by a task is rethrown here
  // (the remaining tasks are skipped). Not reentrant: one loop at a time (callers serialize).
  void parallel_for(int64_t num_tasks, const std::function<void(int64_t)>& fn);

 private:
  void worker_loop();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t num_tasks_ = 0;
  std::atomic<int64_t> next_{0};
  int active_ = 0;          // workers still inside the current loop
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace freetoken
