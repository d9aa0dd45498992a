// Instruction-set variants of the CPU expert kernel and their runtime selection.
//
// Each variant lives in its own translation unit (src/rows_dot_<isa>.cpp) compiled with its own
// -m flags, so the module imports on any x86-64 CPU and only calls a variant the CPU reports.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace freetoken {

enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512Bf16 = 2 };

// Short stable names used by the Python API and the FREETOKEN_CPU_MOE_ISA override.
const char* isa_name(Isa isa);

// Parses "scalar" / "avx2" / "avx512_bf16"; throws std::invalid_argument otherwise.
Isa parse_isa(const std::string& name);

// Variants this CPU and OS can run, best last (scalar is always first).
std::vector<Isa> supported_isas();

// The best supported variant.
Isa best_isa();

// Arguments of the one ISA-specific primitive: dot products of bf16 weight rows with fp32 vectors.
//   out[i * out_stride + (r - row_begin)] = sum_k bf16_to_f32(w[r * w_stride + k]) * vecs[i][k]
// for rows r in [row_begin, row_end) and vectors i in [0, num_vecs). The AVX-512-BF16 variant
// rounds the vectors to bf16 (round-to-nearest-even) before the products; the others keep fp32.
struct RowsDotArgs {
  const uint16_t* w;       // bf16 bits, row-major, w_stride elements per row
  int64_t w_stride;
  int64_t k;               // reduction length (<= w_stride)
  int64_t row_begin;
  int64_t row_end;
  const float* const* vecs;  // num_vecs pointers to k fp32 values each
  int64_t num_vecs;
  float* out;
  int64_t out_stride;
};

void rows_dot_scalar(const RowsDotArgs& a);
void rows_dot_avx2(const RowsDotArgs& a);
void rows_dot_avx512_bf16(const RowsDotArgs& a);

using RowsDotFn = void (*)(const RowsDotArgs&);
RowsDotFn rows_dot_for(Isa isa);

}  // namespace freetoken
