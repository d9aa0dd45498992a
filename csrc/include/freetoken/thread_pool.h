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

// A fork-join pool for blocking parallel-for loops. The calling thread runs tasks too, so a pool
// of size n starts n - 1 workers. Between loops a worker spins for up to a millisecond
// (kSpinMicros) before it sleeps on a condition variable: the phases of one call, and the kernel
// calls of a decode step (a few hundred microseconds of Python apart), then start without a
// futex wake-up per worker (measured on the 2-core dev machine, small qwen3_moe preset: a decode
// step 11-11.5 ms spinning 1 ms against 12.6-13 ms spinning 50 us).
// Rows per task when `rows` rows are split over a pool of `threads`: enough tasks (4 per thread)
// to balance the pool and to let a thread that the OS delays hand its share to the others, few
// enough to amortize the per-task overhead; a multiple of `align`, at most `rows`.
int64_t chunk_rows(int64_t rows, int threads, int64_t align);

class ThreadPool {
 public:
  // A pool of num_threads threads (at least 1): the caller of parallel_for and num_threads - 1
  // workers, which sleep between loops.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(task) for task in [0, num_tasks) on the caller and the workers and returns when all
  // finished. Tasks are handed out dynamically. The first exception thrown by a task is rethrown
  // here (the tasks not yet started are skipped). Not reentrant: one loop at a time (callers
  // serialize). num_tasks must be below 2^32.
  void parallel_for(int64_t num_tasks, const std::function<void(int64_t)>& fn);

  // Lets the workers sleep now instead of spinning for the next loop: for a caller that knows
  // no loop follows soon (a whole decode step ended; the engine's Python and the server's
  // streaming run next and need the cores). The next parallel_for wakes them.
  void rest();

 private:
  static constexpr uint32_t kClosed = 0xFFFFFFFFu;
  static constexpr int kSpinMicros = 1000;

  void worker_loop();
  // Claims and runs tasks of loop `gen` until none is left (or the loop is closed).
  void run_tasks(uint32_t gen);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;  // workers: a new loop or stop
  std::condition_variable done_;  // caller: the last task finished
  // (loop generation << 32) | next task index. A task is claimed by a compare-exchange on the
  // whole word, so a worker that wakes late can never run a task of a later loop with an earlier
  // loop's function; the caller sets the index to kClosed before it reuses fn_ / num_tasks_.
  std::atomic<uint64_t> ticket_{0};
  uint32_t generation_ = 0;  // caller-side copy of the current generation
  std::atomic<const std::function<void(int64_t)>*> fn_{nullptr};
  std::atomic<int64_t> num_tasks_{0};
  std::atomic<int64_t> finished_{0};
  std::atomic<bool> failed_{false};
  std::atomic<bool> stop_{false};
  std::atomic<bool> resting_{false};  // rest() until the next parallel_for
  std::exception_ptr error_;  // guarded by mu_
};

}  // namespace freetoken
