// The scratch schedule shared by the quantised row kernels (q4, fp8, nvfp4; avx2 / avx512): with
// many vectors, dequantise kScratchRows rows at a time into an fp32 scratch and run the fp32 row
// kernel over them; when the scratch cannot be allocated, run the fused schedule (which needs
// none) one vector at a time. Internal linkage on purpose: every including file is compiled for
// its own ISA, so no instantiation may be shared between them at link time.
#pragma once

#include <cstdint>
#include <cstdlib>

#include "freetoken/isa.h"

namespace freetoken {
namespace {

constexpr int64_t kScratchRows = 4;

// dequant(r0, r1, scratch): rows [r0, r1) of the weight as fp32 [r1 - r0, a.k] into scratch;
// fused(one): the fused schedule on `one` (a single vector of a); dot(d): the fp32 row kernel;
// finish(r0, r1): runs after the rows [r0, r1) of every output are written.
template <class Dequant, class Fused, class Dot, class Finish>
void scratch_rows(const RowsDotArgs& a, Dequant dequant, Fused fused, Dot dot, Finish finish) {
  float* scratch = static_cast<float*>(std::malloc(sizeof(float) * kScratchRows * a.k));
  if (scratch == nullptr) {  // out of memory: the fused schedule needs none, one vector at a time
    for (int64_t i = 0; i < a.num_vecs; ++i) {
      RowsDotArgs one = a;
      one.vecs = a.vecs + i;
      one.num_vecs = 1;
      one.out = a.out + i * a.out_stride;
      fused(one);
    }
    return;
  }
  for (int64_t r0 = a.row_begin; r0 < a.row_end; r0 += kScratchRows) {
    const int64_t r1 = r0 + kScratchRows < a.row_end ? r0 + kScratchRows : a.row_end;
    dequant(r0, r1, scratch);
    RowsDotArgs d;
    d.format = WeightFormat::kFp32;
    d.w = scratch;
    d.k = a.k;
    d.row_begin = 0;
    d.row_end = r1 - r0;
    d.vecs = a.vecs;  // the order the scratch rows are in (kNibble16 for 4-bit codes)
    d.num_vecs = a.num_vecs;
    d.out = a.out + (r0 - a.row_begin);
    d.out_stride = a.out_stride;
    dot(d);
    finish(r0, r1);
  }
  std::free(scratch);
}

}  // namespace
}  // namespace freetoken
