// Decode attention over a paged KV pool (freetoken/attention.h), compiled without ISA flags: the
// two projections run the rows_dot kernels through linear_forward, the per-head norms and RoPE
// run on the calling thread (a few thousand values), and the attention core runs one task per
// (sequence, kv head - or all kv heads of a long sequence -, chunk of kAttendChunk positions) on
// the pool in its ISA variant. Sinks and windows only change which positions the tasks cover and
// how their partial sums merge, so every variant shares them.
#include "freetoken/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "freetoken/decode_common.h"

namespace freetoken {

namespace {

// (x1, x2) <- (x1 cos - x2 sin, x2 cos + x1 sin) over the first 2 * half dims.
void rotate(float* x, const float* cos, const float* sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[half + i];
    x[i] = x1 * cos[i] - x2 * sin[i];
    x[half + i] = x2 * cos[i] + x1 * sin[i];
  }
}

}  // namespace

const DecodeKernels<AttendArgs>& attend_kernels() {
  static const DecodeKernels<AttendArgs> kernels({
      {&attend_chunk_scalar, "attend_scalar", Isa::kScalar},
#if defined(__x86_64__) || defined(__i386__)
      {&attend_chunk_avx2, "attend_avx2", Isa::kAvx2},
      {&attend_chunk_avx512, "attend_avx512", Isa::kAvx512},
#endif
  });
  return kernels;
}

namespace {

// Positions [begin, end) of a sequence's slots for kv heads [kv_head, kv_head + kv_heads);
// its per-query-head partials start at row `out` of m / l / acc.
struct Task {
  int64_t seq, kv_head, kv_heads, begin, end, out;
};

// A sequence of at least this many chunks runs all kv heads in each task (whole pool rows, one
// stream); shorter ones one kv head per task, so a short context still spreads over the pool.
constexpr int64_t kWholeRowChunks = 4;

}  // namespace

void check_kv_slots(const char* op, int64_t batch, const int64_t* kv_slots,
                    const int64_t* kv_offsets, int64_t num_slots) {
  for (int64_t b = 0; b < batch; ++b) {
    if (kv_offsets[b + 1] <= kv_offsets[b]) {
      throw std::invalid_argument(std::string(op) + ": sequence " + std::to_string(b) +
                                  " has no slot for its new token");
    }
  }
  for (int64_t i = kv_offsets[0]; i < kv_offsets[batch]; ++i) {
    const int64_t s = kv_slots[i];
    if (s < 0 || s >= num_slots) {
      throw std::invalid_argument(std::string(op) + ": KV slot " + std::to_string(s) +
                                  " outside the pool's " + std::to_string(num_slots));
    }
  }
}

void attention_decode(const DecodeAttentionProblem& p, ThreadPool& pool) {
  const int64_t B = p.batch, nh = p.num_heads, nkv = p.num_kv_heads, hd = p.head_dim;
  if (B <= 0) return;
  if (nkv <= 0 || nh % nkv != 0 || hd <= 0 || 2 * p.rotary_half > hd) {
    throw std::invalid_argument("attention_decode: bad head layout");
  }
  const int64_t nq = nh * hd, q_rows = nq * (p.gated ? 2 : 1), kv_rows = nkv * hd;
  const int64_t rows = q_rows + 2 * kv_rows, group = nh / nkv, half = p.rotary_half;
  check_kv_slots("attention_decode", B, p.kv_slots, p.kv_offsets, p.num_slots);
  const bool residual = p.input_norm != nullptr;
  NormedRows normed;
  if (residual) normed = rms_norm_rows(p.x, p.bf16, B, p.hidden, p.input_norm, p.input_eps);
  std::vector<float> qkv(B * rows);
  project(residual ? static_cast<const void*>(normed.x.data()) : p.x, p.bf16 && !residual, B,
          p.hidden, p.qkv_w, rows, p.bf16, p.isa, qkv.data(), pool);
  const auto keep = [&](float* v, int64_t n) {
    if (p.bf16) round_to_bf16(v, n);
  };
  keep(qkv.data(), B * rows);
  if (p.qkv_bias != nullptr) {
    for (int64_t b = 0; b < B; ++b) {
      float* row = qkv.data() + b * rows;
      for (int64_t i = 0; i < rows; ++i) row[i] += p.qkv_bias[i];
    }
    keep(qkv.data(), B * rows);
  }

  std::vector<float> q(B * nq);
  for (int64_t b = 0; b < B; ++b) {
    float* row = qkv.data() + b * rows;
    const float* cos = p.cos + b * half;
    const float* sin = p.sin + b * half;
    for (int64_t h = 0; h < nh + nkv; ++h) {
      float* x = h < nh ? row + h * hd : row + q_rows + (h - nh) * hd;
      if (p.q_norm != nullptr) {
        rms_norm(x, hd, h < nh ? p.q_norm : p.k_norm, p.eps, 1.0f, x);
        keep(x, hd);
      }
      rotate(x, cos, sin, half);
      keep(x, hd);
    }
    std::memcpy(q.data() + b * nq, row, sizeof(float) * nq);
    const int64_t slot = p.kv_slots[p.kv_offsets[b + 1] - 1];
    store_values(row + q_rows, kv_rows, p.pool_k, p.bf16, slot * kv_rows);
    store_values(row + q_rows + kv_rows, kv_rows, p.pool_v, p.bf16, slot * kv_rows);
  }

  std::vector<Task> tasks;
  int64_t rows_out = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = p.kv_offsets[b + 1] - p.kv_offsets[b];
    // a window's first visible slot; its chunks start there, so the no-window split is unchanged
    const int64_t first = p.window > 0 && n > p.window ? n - p.window : 0;
    const int64_t chunks = (n - first + kAttendChunk - 1) / kAttendChunk;
    const int64_t span = chunks >= kWholeRowChunks ? nkv : 1;
    for (int64_t h = 0; h < nkv; h += span) {
      for (int64_t c = first; c < n; c += kAttendChunk) {
        tasks.push_back({b, h, span, c, std::min(n, c + kAttendChunk), rows_out});
        rows_out += span * group;
      }
    }
  }
  const int64_t num_tasks = static_cast<int64_t>(tasks.size());
  std::vector<float> m(rows_out), l(rows_out), acc(rows_out * hd);
  const auto attend = attend_kernels().use(p.isa);
  pool.parallel_for(num_tasks, [&](int64_t t) {
    thread_local std::vector<float> scratch;
    const Task& task = tasks[t];
    scratch.resize(task.kv_heads * group * kAttendChunk);
    AttendArgs a;
    a.q = q.data() + task.seq * nq + task.kv_head * group * hd;
    a.group = group;
    a.kv_heads = task.kv_heads;
    a.head_dim = hd;
    const int64_t head = task.kv_head * hd;
    a.k = p.bf16 ? static_cast<const void*>(static_cast<const uint16_t*>(p.pool_k) + head)
                 : static_cast<const void*>(static_cast<const float*>(p.pool_k) + head);
    a.v = p.bf16 ? static_cast<const void*>(static_cast<const uint16_t*>(p.pool_v) + head)
                 : static_cast<const void*>(static_cast<const float*>(p.pool_v) + head);
    a.bf16 = p.bf16;
    a.slot_stride = kv_rows;
    a.slots = p.kv_slots + p.kv_offsets[task.seq] + task.begin;
    a.n = task.end - task.begin;
    a.scale = p.scale;
    a.scores = scratch.data();
    a.m = m.data() + task.out;
    a.l = l.data() + task.out;
    a.acc = acc.data() + task.out * hd;
    attend(a);
  });

  // Merge the chunks of each (sequence, query head) in chunk order: rescale to the overall
  // maximum (the sink's logit included). The tasks of one (sequence, kv head run) are
  // consecutive, in chunk order.
  std::vector<float> attn(B * nq);
  for (int64_t t0 = 0; t0 < num_tasks;) {
    int64_t t1 = t0;
    while (t1 < num_tasks && tasks[t1].seq == tasks[t0].seq &&
           tasks[t1].kv_head == tasks[t0].kv_head) {
      ++t1;
    }
    for (int64_t h = 0; h < tasks[t0].kv_heads * group; ++h) {
      const int64_t head = tasks[t0].kv_head * group + h;
      const bool sink = p.sinks != nullptr;
      float mx = m[tasks[t0].out + h];
      for (int64_t t = t0 + 1; t < t1; ++t) mx = std::max(mx, m[tasks[t].out + h]);
      if (sink) mx = std::max(mx, p.sinks[head]);
      float* dst = attn.data() + tasks[t0].seq * nq + head * hd;
      float denom = 0.0f;
      std::fill(dst, dst + hd, 0.0f);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t r = tasks[t].out + h;
        const float w = t1 - t0 == 1 && !sink ? 1.0f : std::exp(m[r] - mx);
        denom += w * l[r];
        const float* src = acc.data() + r * hd;
        for (int64_t j = 0; j < hd; ++j) dst[j] += w * src[j];
      }
      if (sink) denom += std::exp(p.sinks[head] - mx);
      const float inv = 1.0f / denom;
      for (int64_t j = 0; j < hd; ++j) dst[j] *= inv;
    }
    t0 = t1;
  }
  keep(attn.data(), B * nq);
  if (p.gated) {
    for (int64_t b = 0; b < B; ++b) {
      const float* gate = qkv.data() + b * rows + nq;
      float* a = attn.data() + b * nq;
      for (int64_t j = 0; j < nq; ++j) {
        float s = sigmoid(gate[j]);
        if (p.bf16) s = round_to_bf16(s);
        a[j] *= s;
      }
    }
    keep(attn.data(), B * nq);
  }
  project_residual(attn.data(), B, nq, p.o_w, p.hidden, p.bf16, p.isa,
                   residual ? normed.h.data() : nullptr, p.out, pool, p.o_bias);
}

}  // namespace freetoken
