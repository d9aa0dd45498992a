// Decode attention over a paged KV pool (freetoken/attention.h), compiled without ISA flags: the
// two projections run the rows_dot kernels through linear_forward, the per-head norms and RoPE
// run on the calling thread (a few thousand values), and the attention core runs one task per
// (sequence, kv head, chunk of kAttendChunk positions) on the pool in its ISA variant.
#include "freetoken/attention.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "freetoken/linear.h"
#include "freetoken/residual.h"

namespace freetoken {

namespace {

std::array<std::atomic<uint64_t>, 3> g_attend_uses{};

// The variant `isa` runs (the best one this build has at or below it).
const AttendKernel& attend_for(Isa isa) {
  const auto& all = all_attend_kernels();
  const AttendKernel* best = &all[0];
  for (const AttendKernel& k : all) {
    if (static_cast<int>(k.needs) <= static_cast<int>(isa)) best = &k;
  }
  return *best;
}

// x [n] <- x * rsqrt(mean(x^2) + eps) * w (F.rms_norm in fp32).
void rms_norm(float* x, int64_t n, const float* w, float eps) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * r * w[i];
}

// (x1, x2) <- (x1 cos - x2 sin, x2 cos + x1 sin) over the first 2 * half dims.
void rotate(float* x, const float* cos, const float* sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[half + i];
    x[i] = x1 * cos[i] - x2 * sin[i];
    x[half + i] = x2 * cos[i] + x1 * sin[i];
  }
}

void store_row(void* base, bool bf16, int64_t at, const float* src, int64_t n) {
  if (!bf16) {
    std::memcpy(static_cast<float*>(base) + at, src, sizeof(float) * n);
    return;
  }
  uint16_t* dst = static_cast<uint16_t*>(base) + at;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, src + i, sizeof(u));  // already a bf16 value: the top half is exact
    dst[i] = static_cast<uint16_t>(u >> 16);
  }
}

}  // namespace

const std::vector<AttendKernel>& all_attend_kernels() {
  static const std::vector<AttendKernel> kernels = {
      {0, &attend_chunk_scalar, "attend_scalar", Isa::kScalar},
#if defined(__x86_64__) || defined(__i386__)
      {1, &attend_chunk_avx2, "attend_avx2", Isa::kAvx2},
      {2, &attend_chunk_avx512, "attend_avx512", Isa::kAvx512},
#endif
  };
  return kernels;
}

std::vector<uint64_t> attend_use_counts() {
  std::vector<uint64_t> out;
  for (const AttendKernel& k : all_attend_kernels()) {
    out.push_back(g_attend_uses[k.id].load(std::memory_order_relaxed));
  }
  return out;
}

namespace {

struct Task {
  int64_t seq, kv_head, begin, end;  // positions [begin, end) of the sequence's slots
};

}  // namespace

void attention_decode(const DecodeAttentionProblem& p, ThreadPool& pool) {
  const int64_t B = p.batch, nh = p.num_heads, nkv = p.num_kv_heads, hd = p.head_dim;
  if (B <= 0) return;
  if (nkv <= 0 || nh % nkv != 0 || hd <= 0 || 2 * p.rotary_half > hd) {
    throw std::invalid_argument("attention_decode: bad head layout");
  }
  const int64_t nq = nh * hd, q_rows = nq * (p.gated ? 2 : 1), kv_rows = nkv * hd;
  const int64_t rows = q_rows + 2 * kv_rows, group = nh / nkv, half = p.rotary_half;
  for (int64_t b = 0; b < B; ++b) {
    if (p.kv_offsets[b + 1] <= p.kv_offsets[b]) {
      throw std::invalid_argument("attention_decode: sequence " + std::to_string(b) +
                                  " has no slot for its new token");
    }
  }
  const int64_t total = p.kv_offsets[B] - p.kv_offsets[0];
  for (int64_t i = 0; i < total; ++i) {
    const int64_t s = p.kv_slots[p.kv_offsets[0] + i];
    if (s < 0 || s >= p.num_slots) {
      throw std::invalid_argument("attention_decode: KV slot " + std::to_string(s) +
                                  " outside the pool's " + std::to_string(p.num_slots));
    }
  }
  const WeightFormat format = p.bf16 ? WeightFormat::kBf16 : WeightFormat::kFp32;
  NormedRows normed;
  if (p.input_norm != nullptr) {
    normed = rms_norm_rows(p.x, p.bf16, B, p.hidden, p.input_norm, p.input_eps);
  }
  std::vector<float> qkv(B * rows);
  LinearProblem proj;
  proj.x = p.input_norm != nullptr ? static_cast<const void*>(normed.x.data()) : p.x;
  proj.x_is_bf16 = p.bf16 && p.input_norm == nullptr;
  proj.rows = B;
  proj.in = p.hidden;
  proj.out_features = rows;
  proj.format = format;
  proj.w = p.qkv_w;
  proj.out = qkv.data();
  proj.isa = p.isa;
  linear_forward(proj, pool);
  const auto keep = [&](float* v, int64_t n) {
    if (p.bf16) round_to_bf16(v, n);
  };
  keep(qkv.data(), B * rows);

  std::vector<float> q(B * nq);
  for (int64_t b = 0; b < B; ++b) {
    float* row = qkv.data() + b * rows;
    const float* cos = p.cos + b * half;
    const float* sin = p.sin + b * half;
    for (int64_t h = 0; h < nh + nkv; ++h) {
      float* x = h < nh ? row + h * hd : row + q_rows + (h - nh) * hd;
      rms_norm(x, hd, h < nh ? p.q_norm : p.k_norm, p.eps);
      keep(x, hd);
      rotate(x, cos, sin, half);
      keep(x, hd);
    }
    std::memcpy(q.data() + b * nq, row, sizeof(float) * nq);
    const int64_t slot = p.kv_slots[p.kv_offsets[b + 1] - 1];
    store_row(p.pool_k, p.bf16, slot * kv_rows, row + q_rows, kv_rows);
    store_row(p.pool_v, p.bf16, slot * kv_rows, row + q_rows + kv_rows, kv_rows);
  }

  std::vector<Task> tasks;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = p.kv_offsets[b + 1] - p.kv_offsets[b];
    for (int64_t h = 0; h < nkv; ++h) {
      for (int64_t c = 0; c < n; c += kAttendChunk) {
        tasks.push_back({b, h, c, std::min(n, c + kAttendChunk)});
      }
    }
  }
  const int64_t num_tasks = static_cast<int64_t>(tasks.size());
  std::vector<float> m(num_tasks * group), l(num_tasks * group), acc(num_tasks * group * hd);
  const AttendKernel& kernel = attend_for(p.isa);
  g_attend_uses[kernel.id].fetch_add(1, std::memory_order_relaxed);
  const auto attend = kernel.fn;
  pool.parallel_for(num_tasks, [&](int64_t t) {
    thread_local std::vector<float> scratch;
    scratch.resize(group * kAttendChunk + hd);
    const Task& task = tasks[t];
    AttendArgs a;
    a.q = q.data() + task.seq * nq + task.kv_head * group * hd;
    a.group = group;
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
    a.row = scratch.data() + group * kAttendChunk;
    a.m = m.data() + t * group;
    a.l = l.data() + t * group;
    a.acc = acc.data() + t * group * hd;
    attend(a);
  });

  // Merge the chunks of each (sequence, kv head) in chunk order: rescale to the overall maximum.
  std::vector<float> attn(B * nq);
  for (int64_t t0 = 0; t0 < num_tasks;) {
    int64_t t1 = t0;
    while (t1 < num_tasks && tasks[t1].seq == tasks[t0].seq &&
           tasks[t1].kv_head == tasks[t0].kv_head) {
      ++t1;
    }
    for (int64_t h = 0; h < group; ++h) {
      float mx = m[t0 * group + h];
      for (int64_t t = t0 + 1; t < t1; ++t) mx = std::max(mx, m[t * group + h]);
      float* dst = attn.data() + tasks[t0].seq * nq + (tasks[t0].kv_head * group + h) * hd;
      float denom = 0.0f;
      std::fill(dst, dst + hd, 0.0f);
      for (int64_t t = t0; t < t1; ++t) {
        const float w = t1 - t0 == 1 ? 1.0f : std::exp(m[t * group + h] - mx);
        denom += w * l[t * group + h];
        const float* src = acc.data() + (t * group + h) * hd;
        for (int64_t j = 0; j < hd; ++j) dst[j] += w * src[j];
      }
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
        float s = 1.0f / (1.0f + std::exp(-gate[j]));
        if (p.bf16) s = round_to_bf16(s);
        a[j] *= s;
      }
    }
    keep(attn.data(), B * nq);
  }
  LinearProblem o;
  o.x = attn.data();
  o.x_is_bf16 = false;  // bf16 values kept as fp32
  o.rows = B;
  o.in = nq;
  o.out_features = p.hidden;
  o.format = format;
  o.w = p.o_w;
  o.isa = p.isa;
  project_residual(o, p.input_norm != nullptr ? normed.h.data() : nullptr, p.bf16, p.out, pool);
}

}  // namespace freetoken
