// Helpers the decode ops share (attention.cpp, gdn.cpp, moe_block.cpp; compiled without ISA
// flags): the pre-norm residual step of the Qwen3 decoder layers (h + mixer(RMSNorm(h))), the
// RMSNorm itself, dense projections, the scalar activations, and moving values between fp32 and
// the model dtype (bf16 bits or fp32).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "freetoken/isa.h"
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

// dst[0:n] = src * rsqrt(mean(src^2) + eps) * w * scale (w null: no weight; dst may be src), the
// products in that order, as F.rms_norm in fp32 followed by the multiplier.
void rms_norm(const float* src, int64_t n, const float* w, float eps, float scale, float* dst);

// out[i] = h[i] + y[i] for i < count, rounded to bf16 values for a bf16 model (y holds values
// already in the model dtype).
void residual_add(const float* h, const float* y, bool bf16, float* out, int64_t count);

// out [rows, out_features] fp32 = x [rows, in] @ w [out_features, in]^T, w dense in the model
// dtype (bf16 or fp32), x bf16 bits or fp32 (x_is_bf16), on the pool.
void project(const void* x, bool x_is_bf16, int64_t rows, int64_t in, const void* w,
             int64_t out_features, bool bf16, Isa isa, float* out, ThreadPool& pool);

// The output projection of a block, x fp32: without h, out = project(x, w); with h (the
// residual stream, fp32) the projection is rounded to bf16 values for a bf16 model and out =
// residual_add(h, it). bias [out_features] (fp32 holding model-dtype values, or null) is added
// to the projection rounded to the model dtype (F.linear's output, then `+ bias`), the sum
// rounded again before the residual add; without h the sum is returned unrounded.
void project_residual(const float* x, int64_t rows, int64_t in, const void* w,
                      int64_t out_features, bool bf16, Isa isa, const float* h, float* out,
                      ThreadPool& pool, const float* bias = nullptr);

// Inlined into the per-element loops of the decode ops (libm's expf either way).
inline float silu(float v) { return v / (1.0f + std::exp(-v)); }
inline float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

// dst[0:n] = the n values at element `at` of `base` (bf16 bits widened, or fp32) as fp32.
void load_values(const void* base, bool bf16, int64_t at, int64_t n, float* dst);

// The n values src[0:n] stored at element `at` of `base` in the model dtype (bf16: the top
// halves, so src must already hold bf16 values).
void store_values(const float* src, int64_t n, void* base, bool bf16, int64_t at);

}  // namespace freetoken
