// freetoken/residual.h (compiled without ISA flags).
#include "freetoken/residual.h"

#include <algorithm>
#include <cmath>

#include "freetoken/isa.h"

namespace freetoken {

NormedRows rms_norm_rows(const void* h, bool bf16, int64_t rows, int64_t n, const float* w,
                         float eps) {
  NormedRows r{std::vector<float>(rows * n), std::vector<float>(rows * n)};
  if (bf16) {
    widen_bf16(static_cast<const uint16_t*>(h), r.h.data(), rows * n);
  } else {
    std::copy_n(static_cast<const float*>(h), rows * n, r.h.data());
  }
  for (int64_t b = 0; b < rows; ++b) {
    const float* src = r.h.data() + b * n;
    float ss = 0.0f;
    for (int64_t i = 0; i < n; ++i) ss += src[i] * src[i];
    const float s = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
    for (int64_t i = 0; i < n; ++i) r.x[b * n + i] = src[i] * s * w[i];
  }
  if (bf16) round_to_bf16(r.x.data(), rows * n);
  return r;
}

void residual_add(const float* h, const float* y, bool bf16, float* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) out[i] = h[i] + y[i];
  if (bf16) round_to_bf16(out, count);
}

void project_residual(LinearProblem o, const float* h, bool bf16, float* out, ThreadPool& pool) {
  if (h == nullptr) {
    o.out = out;
    linear_forward(o, pool);
    return;
  }
  const int64_t count = o.rows * o.out_features;
  std::vector<float> y(count);
  o.out = y.data();
  linear_forward(o, pool);
  if (bf16) round_to_bf16(y.data(), count);
  residual_add(h, y.data(), bf16, out, count);
}

}  // namespace freetoken
