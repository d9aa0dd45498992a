// Dense linear layer on the CPU at decode sizes: out[t, r] = sum_c W[r, c] * x[t, c] for the T rows
// of x (a few tokens) and a dense [R, C] weight, through the same rows_dot kernels as the expert
// MLP (isa.h), so the weight streams once at close to the memory bandwidth whatever T is.
#pragma once

#include <cstdint>

#include "freetoken/isa.h"
#include "freetoken/thread_pool.h"

namespace freetoken {

struct LinearProblem {
  const void* x = nullptr;  // [T, C] fp32, or bf16 bits (x_is_bf16)
  bool x_is_bf16 = false;
  int64_t rows = 0;         // T
  int64_t in = 0;           // C
  int64_t out_features = 0;  // R
  WeightFormat format = WeightFormat::kBf16;  // kBf16 or kFp32
  const void* w = nullptr;  // [R, C] row-major
  float* out = nullptr;     // [T, R] fp32, fully overwritten
  Isa isa = Isa::kScalar;
};

// Computes p.out on the pool (fp32 activations: exact products, fp32 sums; the result does not
// depend on the thread count). Throws std::invalid_argument for a 4-bit format.
void linear_forward(const LinearProblem& p, ThreadPool& pool);

}  // namespace freetoken
