// Scheduling of the SwiGLU expert MLP over the pool (compiled without ISA flags).
//
// Triples are grouped by expert, so each expert's weights are read once per call however many
// tokens it serves. Phase 1 splits the I axis into chunks: a task reads gate rows [j0, j1) and up
// rows [I+j0, I+j1) of every routed expert and writes act = silu(g) * u for each triple. Phase 2
// splits the H axis: a task reads down rows [h0, h1) of every routed expert and accumulates
// w * y into out[t, h0:h1], which only it writes, so no atomics are needed and the summation order
// (experts ascending, then triple order) does not depend on the thread count.
#include "freetoken/moe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>

namespace freetoken {

namespace {

struct Group {
  int64_t expert;
  int64_t begin;  // range in the expert-sorted triple order
  int64_t end;
};

// Rows per task: enough tasks to balance the pool, few enough to amortize the per-task overhead.
int64_t chunk_rows(int64_t rows, int threads) {
  const int64_t target_tasks = 4 * static_cast<int64_t>(threads);
  int64_t chunk = (rows + target_tasks - 1) / target_tasks;
  chunk = std::max<int64_t>(16, (chunk + 3) / 4 * 4);
  return std::min(chunk, rows);
}

float bf16_bits_to_f32(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

float silu(float g) { return g / (1.0f + expf(-g)); }

// rows_dot arguments for rows [r0, r1) of expert n of bank b, whose matrices are [R, C].
RowsDotArgs expert_rows(const WeightBank& b, int64_t n, int64_t R, int64_t C, int64_t r0,
                        int64_t r1) {
  RowsDotArgs a;
  a.format = b.format;
  a.k = C;
  a.row_begin = r0;
  a.row_end = r1;
  const auto* base = static_cast<const uint8_t*>(b.values);
  switch (b.format) {
    case WeightFormat::kBf16: a.w = base + n * R * C * 2; break;
    case WeightFormat::kFp32: a.w = base + n * R * C * 4; break;
    case WeightFormat::kMxfp4:
    case WeightFormat::kQ4g: {
      const int64_t groups = R * (C / b.group);
      a.w = base + n * R * (C / 2);
      const int64_t scale_bytes = b.format == WeightFormat::kMxfp4 ? 1 : 2;
      a.scales = static_cast<const uint8_t*>(b.scales) + n * groups * scale_bytes;
      a.zeros = b.zeros ? b.zeros + n * groups : nullptr;
      a.group = b.group;
      break;
    }
  }
  return a;
}

}  // namespace

void validate_routing(const MoeProblem& p) {
  const size_t n = p.token_ids.size();
  if (p.expert_ids.size() != n || p.weights.size() != n) {
    throw std::invalid_argument("token_ids, expert_ids and weights must have the same length");
  }
  for (size_t i = 0; i < n; ++i) {
    if (p.token_ids[i] < 0 || p.token_ids[i] >= p.num_tokens) {
      throw std::invalid_argument("token_ids[" + std::to_string(i) + "] = " +
                                  std::to_string(p.token_ids[i]) + " is outside [0, " +
                                  std::to_string(p.num_tokens) + ")");
    }
    if (p.expert_ids[i] < -1 || p.expert_ids[i] >= p.num_experts) {
      throw std::invalid_argument("expert_ids[" + std::to_string(i) + "] = " +
                                  std::to_string(p.expert_ids[i]) + " is outside [0, " +
                                  std::to_string(p.num_experts) + ") and is not -1 (skip)");
    }
  }
}

void moe_forward(const MoeProblem& p, ThreadPool& pool) {
  const int64_t T = p.num_tokens, H = p.hidden, I = p.intermediate;
  std::fill(p.out, p.out + T * H, 0.0f);

  std::vector<int64_t> order;  // triple indices sorted by (expert, position)
  for (int64_t i = 0; i < static_cast<int64_t>(p.expert_ids.size()); ++i) {
    if (p.expert_ids[i] >= 0) order.push_back(i);
  }
  if (order.empty() || T == 0 || H == 0) return;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return p.expert_ids[a] < p.expert_ids[b]; });
  std::vector<Group> groups;
  for (int64_t s = 0; s < static_cast<int64_t>(order.size()); ++s) {
    const int64_t e = p.expert_ids[order[s]];
    if (groups.empty() || groups.back().expert != e) groups.push_back({e, s, s});
    groups.back().end = s + 1;
  }

  std::vector<float> x_f32;  // bf16 inputs are widened once
  const float* x = static_cast<const float*>(p.x);
  if (p.x_is_bf16) {
    const auto* xb = static_cast<const uint16_t*>(p.x);
    x_f32.resize(T * H);
    for (int64_t i = 0; i < T * H; ++i) x_f32[i] = bf16_bits_to_f32(xb[i]);
    x = x_f32.data();
  }
  const int64_t P = static_cast<int64_t>(order.size());
  std::vector<const float*> x_rows(P), act_rows(P);
  std::vector<float> act(P * I);  // [P, I] in sorted order
  for (int64_t s = 0; s < P; ++s) {
    x_rows[s] = x + p.token_ids[order[s]] * H;
    act_rows[s] = act.data() + s * I;
  }
  const RowsDotFn dot_gate_up = rows_dot_for(p.isa, p.gate_up.format);
  const RowsDotFn dot_down = rows_dot_for(p.isa, p.down.format);
  const int threads = pool.size();

  if (I > 0) {
    const int64_t ci = chunk_rows(I, threads);
    pool.parallel_for((I + ci - 1) / ci, [&](int64_t task) {
      const int64_t j0 = task * ci, j1 = std::min(I, j0 + ci), nj = j1 - j0;
      std::vector<float> g, u;
      for (const Group& grp : groups) {
        const int64_t n = grp.end - grp.begin;
        g.resize(n * nj);
        u.resize(n * nj);
        for (int half = 0; half < 2; ++half) {  // gate rows [j0, j1), then up rows [I+j0, I+j1)
          RowsDotArgs a = expert_rows(p.gate_up, grp.expert, 2 * I, H, half * I + j0,
                                      half * I + j1);
          a.vecs = x_rows.data() + grp.begin;
          a.num_vecs = n;
          a.out = half ? u.data() : g.data();
          a.out_stride = nj;
          dot_gate_up(a);
        }
        for (int64_t i = 0; i < n; ++i) {
          float* a = act.data() + (grp.begin + i) * I + j0;
          for (int64_t j = 0; j < nj; ++j) a[j] = silu(g[i * nj + j]) * u[i * nj + j];
        }
      }
    });
  }

  const int64_t ch = chunk_rows(H, threads);
  pool.parallel_for((H + ch - 1) / ch, [&](int64_t task) {
    const int64_t h0 = task * ch, h1 = std::min(H, h0 + ch), nh = h1 - h0;
    std::vector<float> y;
    for (const Group& grp : groups) {
      const int64_t n = grp.end - grp.begin;
      y.resize(n * nh);
      if (I > 0) {
        RowsDotArgs a = expert_rows(p.down, grp.expert, H, I, h0, h1);
        a.vecs = act_rows.data() + grp.begin;
        a.num_vecs = n;
        a.out = y.data();
        a.out_stride = nh;
        dot_down(a);
      } else {
        std::fill(y.begin(), y.end(), 0.0f);
      }
      for (int64_t i = 0; i < n; ++i) {
        const int64_t triple = order[grp.begin + i];
        const float wt = p.weights[triple];
        float* o = p.out + p.token_ids[triple] * H + h0;
        for (int64_t h = 0; h < nh; ++h) o[h] += wt * y[i * nh + h];
      }
    }
  });
}

MoeRunner::MoeRunner(int num_threads)
    : pool_(num_threads), dispatcher_([this] { dispatch_loop(); }) {}

MoeRunner::~MoeRunner() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  dispatcher_.join();
}

MoeTicket MoeRunner::submit(MoeProblem p) {
  auto job = std::make_unique<Job>();
  job->problem = std::move(p);
  job->seconds = std::make_shared<double>(-1.0);
  MoeTicket ticket{job->done.get_future().share(), job->seconds};
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
  return ticket;
}

void MoeRunner::dispatch_loop() {
  for (;;) {
    std::unique_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ with nothing left: pending work always finishes
      job = std::move(queue_.front());
      queue_.erase(queue_.begin());
    }
    const auto start = std::chrono::steady_clock::now();
    std::exception_ptr error;
    try {
      moe_forward(job->problem, pool_);
    } catch (...) {
      error = std::current_exception();
    }
    *job->seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (error) {
      job->done.set_exception(error);
    } else {
      job->done.set_value();
    }
  }
}

}  // namespace freetoken
