// Scheduling of the SwiGLU expert MLP over the pool (compiled without ISA flags).
//
// Triples are grouped by expert, so each expert's weights are read once per call however many
// tokens it serves. Phase 1 splits the I axis into chunks: a task reads gate rows [j0, j1) and up
// rows [I+j0, I+j1) of every routed expert and writes act = silu(g) * u for each triple. Phase 2
// splits the H axis: a task reads down rows [h0, h1) of every routed expert and accumulates
// w * y into out[t, h0:h1], which only it writes, so no atomics are needed and the summation order
// (experts ascending, then triple order) does not depend on the thread count. With at least two
// routed experts per thread (decode) one task per expert runs both phases for that expert
// instead, bit-identical (see moe_forward).
// The vectors each ISA variant reads are packed into its VecLayout once per call: x before
// phase 1, and act by the phase-1 task that computes it (I-chunks start at multiples of 16, so a
// chunk packs on its own), so no variant permutes a vector per weight row.
// With Activations::kQ8 the vectors are quantised to int8 blocks of 32 columns instead
// (freetoken/q8.h): x once per call, act by the phase-1 task that computes it (I-chunks are then
// multiples of 32). With Activations::kBf16 the packed vectors are rounded to bf16 values first.
// gpt-oss's biases and clamped activation (moe.h) are applied in fp32 where silu(g) * u is
// computed (gate/up biases) and to each expert's down output before its gate weight (down
// bias), identically in both schedules; without them those code paths are not entered, so the
// results stay bit-identical to the plain SwiGLU.
#include "freetoken/moe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>

#include "freetoken/fp8.h"
#include "freetoken/q8.h"

namespace freetoken {

namespace {

struct Group {
  int64_t expert;
  int64_t begin;  // range in the expert-sorted triple order
  int64_t end;
};

bool is_4bit(WeightFormat f) { return f == WeightFormat::kMxfp4 || f == WeightFormat::kQ4g; }

float silu(float g) { return g / (1.0f + expf(-g)); }

// gpt-oss's activation (transformers GptOssExperts._apply_gate) of one gate / up pair. The
// comparisons let a NaN through unchanged, as torch.clamp does.
float clamped_glu(float g, float u, float limit, float alpha) {
  g = g > limit ? limit : g;
  u = u > limit ? limit : (u < -limit ? -limit : u);
  return (u + 1.0f) * (g / (1.0f + expf(-alpha * g)));
}

// y [n, nh] += bias [nh] on every row (bias null: nothing to add).
void add_row_bias(float* y, int64_t n, int64_t nh, const float* bias) {
  if (bias == nullptr) return;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < nh; ++h) y[i * nh + h] += bias[h];
  }
}

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
    case WeightFormat::kFp8:
      a.w = base + n * R * C;
      a.scales = static_cast<const float*>(b.scales) +
                 n * ceil_div(R, b.block_rows) * ceil_div(C, b.block_cols);
      a.block_rows = b.block_rows;
      a.block_cols = b.block_cols;
      break;
    case WeightFormat::kNvfp4:
      a.w = base + n * R * (C / 2);
      a.scales = static_cast<const uint8_t*>(b.scales) + n * R * (C / 16);
      a.row_scales = b.row_scales + n * R;
      a.group = 16;
      break;
  }
  return a;
}

// Prefetches the first rows (one row block of the ISA tiles, at most 4) of rows [r0, r1) of
// expert n of bank b, scales and zero points included, so that the rows_dot call that reads them
// next does not begin with a row of cold misses; later rows are prefetched inside rows_dot.
void prefetch_first_rows(const WeightBank& b, int64_t n, int64_t R, int64_t C, int64_t r0,
                         int64_t r1) {
  const int64_t rows = std::min<int64_t>(r1 - r0, 4);
  if (rows <= 0) return;
  const RowsDotArgs a = expert_rows(b, n, R, C, r0, r1);
  const auto range = [](const void* base, int64_t offset, int64_t bytes) {
    const char* p = static_cast<const char*>(base) + offset;
    for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 3);
  };
  switch (b.format) {
    case WeightFormat::kBf16: range(a.w, r0 * C * 2, rows * C * 2); break;
    case WeightFormat::kFp32: range(a.w, r0 * C * 4, rows * C * 4); break;
    case WeightFormat::kMxfp4:
    case WeightFormat::kQ4g: {
      const int64_t groups = C / b.group, scale_bytes = b.format == WeightFormat::kMxfp4 ? 1 : 2;
      range(a.w, r0 * (C / 2), rows * (C / 2));
      range(a.scales, r0 * groups * scale_bytes, rows * groups * scale_bytes);
      if (a.zeros != nullptr) range(a.zeros, r0 * groups, rows * groups);
      break;
    }
    case WeightFormat::kFp8: {
      const int64_t blocks = ceil_div(C, b.block_cols);
      range(a.w, r0 * C, rows * C);
      range(a.scales, (r0 / b.block_rows) * blocks * 4, blocks * 4);
      break;
    }
    case WeightFormat::kNvfp4:
      range(a.w, r0 * (C / 2), rows * (C / 2));
      range(a.scales, r0 * (C / 16), rows * (C / 16));
      range(a.row_scales, r0 * 4, rows * 4);
      break;
  }
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
  const bool q8 = p.activations == Activations::kQ8;
  const bool bf16_act = p.activations == Activations::kBf16;
  if (q8 && !(is_4bit(p.gate_up.format) && is_4bit(p.down.format))) {
    throw std::invalid_argument("q8 activations need 4-bit expert banks (mxfp4 or q4g)");
  }
  if (p.swiglu_clamp && !(p.swiglu_limit > 0.0f)) {
    throw std::invalid_argument("swiglu_limit must be > 0, got " +
                                std::to_string(p.swiglu_limit));
  }
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

  const RowsKernel& gate_up_kernel = rows_kernel_for(p.isa, p.gate_up.format, p.activations);
  const RowsKernel& down_kernel = rows_kernel_for(p.isa, p.down.format, p.activations);
  note_kernel_use(gate_up_kernel);
  if (down_kernel.id != gate_up_kernel.id) note_kernel_use(down_kernel);
  const VecLayout x_layout = gate_up_kernel.layout;
  const VecLayout act_layout = down_kernel.layout;
  std::vector<float> x_packed;  // bf16 inputs widened, and x in x_layout, once
  const float* x = static_cast<const float*>(p.x);
  const Q8Layout q8_layout = q8_layout_for(p.isa);
  Q8Rows x_q, act_q;  // q8: x quantised once; act quantised by phase 1
  std::vector<float> row(p.x_is_bf16 ? H : 0);
  const auto x_row = [&](int64_t t) -> const float* {  // token t as fp32 (bf16 widened)
    if (!p.x_is_bf16) return x + t * H;
    widen_bf16(static_cast<const uint16_t*>(p.x) + t * H, row.data(), H);
    return row.data();
  };
  if (q8) {
    x_q = Q8Rows(q8_layout, T, H);
    for (int64_t t = 0; t < T; ++t) x_q.quantize(t, x_row(t), 0, H);
  } else if (p.x_is_bf16 || bf16_act || x_layout != VecLayout::kNatural) {
    x_packed.resize(T * H);
    for (int64_t t = 0; t < T; ++t) {
      pack_vector(x_layout, x_row(t), x_packed.data() + t * H, H);
      if (bf16_act && !p.x_is_bf16) round_to_bf16(x_packed.data() + t * H, H);
    }
    x = x_packed.data();
  }
  const int64_t P = static_cast<int64_t>(order.size());
  std::vector<const float*> x_rows(q8 ? 0 : P), act_rows(q8 ? 0 : P);
  std::vector<float> act(q8 ? 0 : P * I);  // [P, I] in sorted order, each row in act_layout
  std::vector<Q8Vec> x_qrows(q8 ? P : 0), act_qrows(q8 ? P : 0);
  if (q8) {
    act_q = Q8Rows(q8_layout, P, I);
    for (int64_t s = 0; s < P; ++s) {
      x_qrows[s] = x_q.vec(p.token_ids[order[s]]);
      act_qrows[s] = act_q.vec(s);
    }
  } else {
    for (int64_t s = 0; s < P; ++s) {
      x_rows[s] = x + p.token_ids[order[s]] * H;
      act_rows[s] = act.data() + s * I;
    }
  }
  const RowsDotFn dot_gate_up = gate_up_kernel.fn;
  const RowsDotFn dot_down = down_kernel.fn;
  const int threads = pool.size();

  // Gate rows [j0, j1) and up rows [I+j0, I+j1) of group gi's expert for its tokens, then
  // act(g, u) of those columns (biases added first), rounded / quantised / packed as the down
  // kernel reads it.
  // `prefetch` warms the first rows of the next call (this expert's up rows, or the next
  // expert's gate rows) while one runs. g, u, a_row: scratch.
  const auto gate_up_act = [&](size_t gi, int64_t j0, int64_t j1, bool prefetch,
                               std::vector<float>& g, std::vector<float>& u,
                               std::vector<float>& a_row) {
    const Group& grp = groups[gi];
    const int64_t n = grp.end - grp.begin, nj = j1 - j0;
    g.resize(n * nj);
    u.resize(n * nj);
    a_row.resize(nj);
    for (int half = 0; half < 2; ++half) {
      if (prefetch && half == 0) {
        prefetch_first_rows(p.gate_up, grp.expert, 2 * I, H, I + j0, I + j1);
      } else if (prefetch && gi + 1 < groups.size()) {
        prefetch_first_rows(p.gate_up, groups[gi + 1].expert, 2 * I, H, j0, j1);
      }
      RowsDotArgs a = expert_rows(p.gate_up, grp.expert, 2 * I, H, half * I + j0, half * I + j1);
      if (q8) {
        a.qvecs = x_qrows.data() + grp.begin;
      } else {
        a.vecs = x_rows.data() + grp.begin;
      }
      a.num_vecs = n;
      a.out = half ? u.data() : g.data();
      a.out_stride = nj;
      dot_gate_up(a);
    }
    if (p.gate_up_bias != nullptr) {
      const float* bias = p.gate_up_bias + grp.expert * 2 * I;
      add_row_bias(g.data(), n, nj, bias + j0);
      add_row_bias(u.data(), n, nj, bias + I + j0);
    }
    for (int64_t i = 0; i < n; ++i) {
      const float* gi = g.data() + i * nj;
      const float* ui = u.data() + i * nj;
      if (p.swiglu_clamp) {
        for (int64_t j = 0; j < nj; ++j) {
          a_row[j] = clamped_glu(gi[j], ui[j], p.swiglu_limit, p.swiglu_alpha);
        }
      } else {
        for (int64_t j = 0; j < nj; ++j) a_row[j] = silu(gi[j]) * ui[j];
      }
      if (bf16_act) round_to_bf16(a_row.data(), nj);
      if (q8) {
        act_q.quantize(grp.begin + i, a_row.data(), j0, j1);
      } else {
        pack_vector(act_layout, a_row.data(), act.data() + (grp.begin + i) * I + j0, nj);
      }
    }
  };

  // With at least two routed experts per thread (decode), one task per expert reads its gate/up
  // rows and then its down rows front to back (two long streams instead of many short ones) and
  // keeps its outputs apart; they add into out in sorted triple order, the order phase 2 adds
  // in, and every row's dot product is the same as in the chunked phases (chunks start on
  // multiples of the row tile), so the two schedules give bit-identical results.
  if (groups.size() >= static_cast<size_t>(2 * threads)) {
    std::vector<float> y_all(P * H);
    pool.parallel_for(static_cast<int64_t>(groups.size()), [&](int64_t gi) {
      const Group& grp = groups[gi];
      const int64_t n = grp.end - grp.begin;
      if (I > 0) {
        std::vector<float> g, u, a_row;
        gate_up_act(gi, 0, I, false, g, u, a_row);
        RowsDotArgs d = expert_rows(p.down, grp.expert, H, I, 0, H);
        if (q8) {
          d.qvecs = act_qrows.data() + grp.begin;
        } else {
          d.vecs = act_rows.data() + grp.begin;
        }
        d.num_vecs = n;
        d.out = y_all.data() + grp.begin * H;
        d.out_stride = H;
        dot_down(d);
      } else {
        std::fill(y_all.begin() + grp.begin * H, y_all.begin() + grp.end * H, 0.0f);
      }
      if (p.down_bias != nullptr) {
        add_row_bias(y_all.data() + grp.begin * H, n, H, p.down_bias + grp.expert * H);
      }
    });
    for (int64_t s = 0; s < P; ++s) {
      const int64_t triple = order[s];
      const float wt = p.weights[triple];
      float* o = p.out + p.token_ids[triple] * H;
      const float* y = y_all.data() + s * H;
      for (int64_t h = 0; h < H; ++h) o[h] += wt * y[h];
    }
    return;
  }

  if (I > 0) {
    // I-chunks start on a block of the act layout, so each task packs its segment on its own.
    const int64_t align =
        q8 ? kQ8Block : std::max<int64_t>(16, vec_layout_block(act_layout));
    const int64_t ci = chunk_rows(I, threads, align);
    pool.parallel_for((I + ci - 1) / ci, [&](int64_t task) {
      const int64_t j0 = task * ci, j1 = std::min(I, j0 + ci);
      std::vector<float> g, u, a_row;
      for (size_t gi = 0; gi < groups.size(); ++gi) gate_up_act(gi, j0, j1, true, g, u, a_row);
    });
  }

  const int64_t ch = chunk_rows(H, threads, 16);
  pool.parallel_for((H + ch - 1) / ch, [&](int64_t task) {
    const int64_t h0 = task * ch, h1 = std::min(H, h0 + ch), nh = h1 - h0;
    std::vector<float> y;
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      const Group& grp = groups[gi];
      const int64_t n = grp.end - grp.begin;
      y.resize(n * nh);
      if (I > 0 && gi + 1 < groups.size()) {
        prefetch_first_rows(p.down, groups[gi + 1].expert, H, I, h0, h1);
      }
      if (I > 0) {
        RowsDotArgs a = expert_rows(p.down, grp.expert, H, I, h0, h1);
        if (q8) {
          a.qvecs = act_qrows.data() + grp.begin;
        } else {
          a.vecs = act_rows.data() + grp.begin;
        }
        a.num_vecs = n;
        a.out = y.data();
        a.out_stride = nh;
        dot_down(a);
      } else {
        std::fill(y.begin(), y.end(), 0.0f);
      }
      if (p.down_bias != nullptr) {
        add_row_bias(y.data(), n, nh, p.down_bias + grp.expert * H + h0);
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
  return submit_work([p = std::move(p)](ThreadPool& pool) { moe_forward(p, pool); });
}

MoeTicket MoeRunner::submit_work(std::function<void(ThreadPool&)> work) {
  auto job = std::make_unique<Job>();
  job->work = std::move(work);
  job->seconds = std::make_shared<double>(-1.0);
  MoeTicket ticket{job->done.get_future().share(), job->seconds, 0};
  {
    std::lock_guard<std::mutex> lock(mu_);
    job->id = ticket.id = next_id_++;
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
  return ticket;
}

void MoeRunner::wait(const MoeTicket& t) {
  std::unique_ptr<Job> job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!busy_ && !queue_.empty() && queue_.front()->id == t.id) {
      job = std::move(queue_.front());
      queue_.erase(queue_.begin());
      busy_ = true;
    }
  }
  if (job) run_job(std::move(job));
  t.done.wait();
}

void MoeRunner::run_job(std::unique_ptr<Job> job) {
  const auto start = std::chrono::steady_clock::now();
  std::exception_ptr error;
  try {
    job->work(pool_);
  } catch (...) {
    error = std::current_exception();
  }
  *job->seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
  }
  cv_.notify_one();  // the dispatcher may start the next queued job
  if (error) {
    job->done.set_exception(error);
  } else {
    job->done.set_value();
  }
}

void MoeRunner::dispatch_loop() {
  for (;;) {
    std::unique_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return !busy_ && (stop_ || !queue_.empty()); });
      if (queue_.empty()) return;  // stop_ with nothing left: pending work always finishes
      job = std::move(queue_.front());
      queue_.erase(queue_.begin());
      busy_ = true;
    }
    run_job(std::move(job));
  }
}

}  // namespace freetoken
