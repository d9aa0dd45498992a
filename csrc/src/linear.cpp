// Dense linear at decode sizes over the pool (compiled without ISA flags): x is widened and
// packed into the kernel's vector layout once, then tasks own disjoint blocks of output rows, so
// each weight row is read once per call and no two tasks write the same output.
#include "freetoken/linear.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace freetoken {

namespace {

constexpr int64_t kRowAlign = 4;  // the kernels' row tile

}  // namespace

void linear_forward(const LinearProblem& p, ThreadPool& pool) {
  if (p.format != WeightFormat::kBf16 && p.format != WeightFormat::kFp32) {
    throw std::invalid_argument("linear_forward needs dense (bf16 or fp32) weights");
  }
  const int64_t T = p.rows, C = p.in, R = p.out_features;
  if (T == 0 || R == 0) return;
  if (C == 0) {
    std::fill(p.out, p.out + T * R, 0.0f);
    return;
  }
  const RowsKernel& kernel = rows_kernel_for(p.isa, p.format, Activations::kFp32);
  note_kernel_use(kernel);
  std::vector<float> packed(T * C), row(C);
  std::vector<const float*> vecs(T);
  for (int64_t t = 0; t < T; ++t) {
    const float* src = static_cast<const float*>(p.x) + t * C;
    if (p.x_is_bf16) {
      widen_bf16(static_cast<const uint16_t*>(p.x) + t * C, row.data(), C);
      src = row.data();
    }
    pack_vector(kernel.layout, src, packed.data() + t * C, C);
    vecs[t] = packed.data() + t * C;
  }
  const int64_t chunk = chunk_rows(R, pool.size(), kRowAlign);
  pool.parallel_for((R + chunk - 1) / chunk, [&](int64_t task) {
    const int64_t r0 = task * chunk, r1 = std::min(R, r0 + chunk);
    RowsDotArgs a;
    a.format = p.format;
    a.w = p.w;  // rows are addressed from row 0
    a.k = C;
    a.row_begin = r0;
    a.row_end = r1;
    a.vecs = vecs.data();
    a.num_vecs = T;
    a.out = p.out + r0;
    a.out_stride = R;
    kernel.fn(a);
  });
}

}  // namespace freetoken
