#include "freetoken/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>

#if defined(__linux__)
#include <sched.h>
#endif

namespace freetoken {

int physical_core_count() {
  const int fallback = static_cast<int>(std::thread::hardware_concurrency());
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return fallback > 0 ? fallback : 1;
  std::set<std::pair<std::string, std::string>> cores;  // (package id, core id)
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream pkg(dir + "physical_package_id"), core(dir + "core_id");
    std::string p, c;
    if (!(pkg >> p) || !(core >> c)) {
      p = "cpu";
      c = std::to_string(cpu);  // no topology: count logical CPUs
    }
    cores.emplace(p, c);
  }
  if (!cores.empty()) return static_cast<int>(cores.size());
#endif
  return fallback > 0 ? fallback : 1;
}

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Polls ready() for up to `micros` microseconds; returns its last value.
template <typename Ready>
bool spin_until(const Ready& ready, int micros) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(micros);
  for (uint32_t i = 1;; ++i) {
    if (ready()) return true;
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= deadline) return ready();
    cpu_relax();
  }
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads < 1) num_threads = 1;
  workers_.reserve(num_threads - 1);
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_release);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::parallel_for(int64_t num_tasks, const std::function<void(int64_t)>& fn) {
  if (num_tasks <= 0) return;
  if (workers_.empty() || num_tasks == 1) {
    for (int64_t task = 0; task < num_tasks; ++task) fn(task);
    return;
  }
  if (num_tasks >= static_cast<int64_t>(kClosed)) {
    throw std::invalid_argument("ThreadPool::parallel_for: too many tasks (" +
                                std::to_string(num_tasks) + ")");
  }
  fn_.store(&fn, std::memory_order_relaxed);
  num_tasks_.store(num_tasks, std::memory_order_relaxed);
  finished_.store(0, std::memory_order_relaxed);
  failed_.store(false, std::memory_order_relaxed);
  resting_.store(false, std::memory_order_relaxed);
  uint32_t gen;
  {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = nullptr;
    gen = ++generation_;
    ticket_.store(static_cast<uint64_t>(gen) << 32, std::memory_order_release);
  }
  wake_.notify_all();
  run_tasks(gen);
  const auto all_done = [&] {
    return finished_.load(std::memory_order_acquire) == num_tasks;
  };
  if (!spin_until(all_done, kSpinMicros)) {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, all_done);
  }
  ticket_.store((static_cast<uint64_t>(gen) << 32) | kClosed, std::memory_order_release);
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::swap(error, error_);
  }
  if (error) std::rethrow_exception(error);
}

void ThreadPool::run_tasks(uint32_t gen) {
  uint64_t t = ticket_.load(std::memory_order_acquire);
  for (;;) {
    if (static_cast<uint32_t>(t >> 32) != gen) return;
    const int64_t n = num_tasks_.load(std::memory_order_relaxed);
    const uint32_t task = static_cast<uint32_t>(t);
    if (task >= n) return;  // all claimed, or kClosed
    if (!ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
      continue;  // t holds the current ticket
    }
    if (!failed_.load(std::memory_order_relaxed)) {
      try {
        (*fn_.load(std::memory_order_relaxed))(task);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
        failed_.store(true, std::memory_order_relaxed);
      }
    }
    if (finished_.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
      std::lock_guard<std::mutex> lock(mu_);
      done_.notify_one();
    }
    t = ticket_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_loop() {
  uint32_t seen = 0;
  const auto ready = [&] {
    return stop_.load(std::memory_order_acquire) ||
           static_cast<uint32_t>(ticket_.load(std::memory_order_acquire) >> 32) != seen;
  };
  const auto ready_or_resting = [&] {
    return ready() || resting_.load(std::memory_order_relaxed);
  };
  for (;;) {
    if (!spin_until(ready_or_resting, kSpinMicros) || !ready()) {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, ready);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = static_cast<uint32_t>(ticket_.load(std::memory_order_acquire) >> 32);
    run_tasks(seen);
  }
}

void ThreadPool::rest() { resting_.store(true, std::memory_order_relaxed); }

int64_t chunk_rows(int64_t rows, int threads, int64_t align) {
  constexpr int64_t kTasksPerThread = 4;
  const int64_t target_tasks = kTasksPerThread * static_cast<int64_t>(threads);
  int64_t chunk = (rows + target_tasks - 1) / target_tasks;
  chunk = std::max<int64_t>(align, (chunk + align - 1) / align * align);
  return std::min(chunk, rows);
}

}  // namespace freetoken
