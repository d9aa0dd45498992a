#include "freetoken/thread_pool.h"

#include <fstream>
#include <set>
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

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads < 1) num_threads = 1;
  workers_.reserve(num_threads);
  for (int i = 0; i < num_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::parallel_for(int64_t num_tasks, const std::function<void(int64_t)>& fn) {
  if (num_tasks <= 0) return;
  std::unique_lock<std::mutex> lock(mu_);
  fn_ = &fn;
  num_tasks_ = num_tasks;
  next_.store(0);
  error_ = nullptr;
  active_ = size();
  ++generation_;
  wake_.notify_all();
  done_.wait(lock, [this] { return active_ == 0; });
  fn_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t)>* fn;
    int64_t n;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      fn = fn_;
      n = num_tasks_;
    }
    for (int64_t task = next_.fetch_add(1); task < n; task = next_.fetch_add(1)) {
      try {
        (*fn)(task);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
        next_.store(n);  // skip the rest
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (--active_ == 0) done_.notify_one();
  }
}

}  // namespace freetoken
