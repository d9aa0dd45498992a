// Dense copies of chosen experts of an MXFP4 bank, for the batched matmuls of a long prefill over
// resident 4-bit experts (freetoken/offload/resident.py): w = e2m1(code) * 2^(scale - 127), low
// nibble = even column, exact in fp32 and in bf16 (every value is a 2-bit mantissa times a power
// of two; E8M0 255 gives inf and 0 * inf NaN, as the Python dequantiser). Variants: scalar, and
// avx2 (also what the avx512 variants run); both give the same values (the avx2 copy writes +0
// for the code of -0).
#pragma once

#include <cstdint>

#include "freetoken/isa.h"
#include "freetoken/thread_pool.h"

namespace freetoken {

// One row of `groups` 32-column blocks: codes [groups, 16], scales [groups] -> out [groups * 32]
// fp32, or bf16 bits when bf16.
void dequantize_mxfp4_row_scalar(const uint8_t* codes, const uint8_t* scales, int64_t groups,
                                 bool bf16, void* out);
void dequantize_mxfp4_row_avx2(const uint8_t* codes, const uint8_t* scales, int64_t groups,
                               bool bf16, void* out);

// blocks [N, rows, cols / 32, 16] uint8, scales [N, rows, cols / 32] uint8 (cols % 32 == 0);
// out [n, rows, cols] fp32, or bf16 bits when bf16: out[i] = expert ids[i] (each in [0, N)).
// isa: scalar runs the scalar rows, every other variant the avx2 ones.
void dequantize_mxfp4_experts(const uint8_t* blocks, const uint8_t* scales, int64_t rows,
                              int64_t cols, const int64_t* ids, int64_t n, bool bf16, void* out,
                              Isa isa, ThreadPool& pool);

}  // namespace freetoken
