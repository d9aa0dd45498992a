// freetoken/decode_common.h (compiled without ISA flags).
#include "freetoken/decode_common.h"

#include <cmath>
#include <cstring>

namespace freetoken {

void load_values(const void* base, bool bf16, int64_t at, int64_t n, float* dst) {
  if (bf16) {
    widen_bf16(static_cast<const uint16_t*>(base) + at, dst, n);
  } else {
    std::memcpy(dst, static_cast<const float*>(base) + at, sizeof(float) * n);
  }
}

void store_values(const float* src, int64_t n, void* base, bool bf16, int64_t at) {
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

void rms_norm(const float* src, int64_t n, const float* w, float eps, float scale, float* dst) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += src[i] * src[i];
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) {
    const float v = w != nullptr ? src[i] * r * w[i] : src[i] * r;
    dst[i] = scale == 1.0f ? v : v * scale;
  }
}

NormedRows rms_norm_rows(const void* h, bool bf16, int64_t rows, int64_t n, const float* w,
                         float eps) {
  NormedRows r{std::vector<float>(rows * n), std::vector<float>(rows * n)};
  load_values(h, bf16, 0, rows * n, r.h.data());
  for (int64_t b = 0; b < rows; ++b) {
    rms_norm(r.h.data() + b * n, n, w, eps, 1.0f, r.x.data() + b * n);
  }
  if (bf16) round_to_bf16(r.x.data(), rows * n);
  return r;
}

void residual_add(const float* h, const float* y, bool bf16, float* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) out[i] = h[i] + y[i];
  if (bf16) round_to_bf16(out, count);
}

void project(const void* x, bool x_is_bf16, int64_t rows, int64_t in, const void* w,
             int64_t out_features, bool bf16, Isa isa, float* out, ThreadPool& pool) {
  LinearProblem p;
  p.x = x;
  p.x_is_bf16 = x_is_bf16;
  p.rows = rows;
  p.in = in;
  p.out_features = out_features;
  p.format = bf16 ? WeightFormat::kBf16 : WeightFormat::kFp32;
  p.w = w;
  p.out = out;
  p.isa = isa;
  linear_forward(p, pool);
}

namespace {

// y [rows, n] += bias [n] after rounding y to the model dtype.
void add_bias(float* y, int64_t rows, int64_t n, const float* bias, bool bf16) {
  if (bf16) round_to_bf16(y, rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < n; ++i) y[r * n + i] += bias[i];
  }
}

}  // namespace

void project_residual(const float* x, int64_t rows, int64_t in, const void* w,
                      int64_t out_features, bool bf16, Isa isa, const float* h, float* out,
                      ThreadPool& pool, const float* bias) {
  if (h == nullptr) {
    project(x, false, rows, in, w, out_features, bf16, isa, out, pool);
    if (bias != nullptr) add_bias(out, rows, out_features, bias, bf16);
    return;
  }
  const int64_t count = rows * out_features;
  std::vector<float> y(count);
  project(x, false, rows, in, w, out_features, bf16, isa, y.data(), pool);
  if (bias != nullptr) add_bias(y.data(), rows, out_features, bias, bf16);
  if (bf16) round_to_bf16(y.data(), count);
  residual_add(h, y.data(), bf16, out, count);
}

}  // namespace freetoken
