// The pre-norm residual step the decode ops share (transformers Qwen3 decoder layers:
// h + mixer(RMSNorm(h))): the residual stream widened to fp32, its RMSNorm, and the add.
#pragma once

#include <cstdint>
#include <vector>

#include "freetoken/linear.h"
#include "freetoken/thread_pool.h"

namespace freetoken {

struct NormedRows {
  std::vector<float> h;  // [rows, n] the residual stream as fp32
  std::vector<float> x;  // [rows, n] h * rsqrt(mean(h^2) + eps) * w (F.rms_norm in fp32),
                         // rounded to bf16 values for a bf16 model
};

// h: [rows, n] bf16 bits (bf16) or fp32; w: [n] fp32 multiplier (1 + w when zero-centred).
NormedRows rms_norm_rows(const void* h, bool bf16, int64_t rows, int64_t n, const float* w,
                         float eps);

// out[i] = h[i] + y[i] for i < count, rounded to bf16 values for a bf16 model (y holds values
// already in the model dtype).
void residual_add(const float* h, const float* y, bool bf16, float* out, int64_t count);

// The output projection of a block: o.out = o.x @ o.w^T when h is null; else the projection
// rounded to bf16 values for a bf16 model and residual_add(h, it) written to `out` (o.out is
// ignored). o.rows x o.out_features values.
void project_residual(LinearProblem o, const float* h, bool bf16, float* out, ThreadPool& pool);

}  // namespace freetoken
