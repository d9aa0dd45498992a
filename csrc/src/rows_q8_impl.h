// The q8 rows_dot for the 4-bit formats (mxfp4, q4g) over Q8Layout::kPair64, AVX2 + FMA + F16C
// code shared by rows_q8_avx2.cpp and rows_q8_avx512.cpp: everything but the integer sums of a
// full 256-column chunk, which each variant supplies as a policy Full with
//   template <bool kMx, int RB, int TB> static void sums(rows, xs, lut, out)
// (the signature of chunk_sums<kMx, true, RB, TB>; rows_q8_avx2.cpp describes the method).
// Integer sums are exact, so two variants whose policies agree give bit-identical outputs.
// Included inside an anonymous namespace of each variant's file, after <immintrin.h>,
// freetoken/isa.h, freetoken/nibble.h and freetoken/q8.h: each build keeps its own copy compiled
// with its own flags (no shared inline symbols across ISA flags).

constexpr int kMxfp4Offset = 12;  // u = 2 * e2m1 + 12 >= 0
constexpr int kQ4gSymmetricZero = 8;

struct MxU8Lut {
  uint8_t v[16];
};

constexpr MxU8Lut make_mx_u8() {
  MxU8Lut t{};
  for (int c = 0; c < 16; ++c) t.v[c] = static_cast<uint8_t>(kMxfp4Lut[c] + kMxfp4Offset);
  return t;
}

constexpr MxU8Lut kMxU8 = make_mx_u8();

// Everything about the bank that the loops need, computed once per call.
struct Q8Bank {
  const uint8_t* codes;
  const uint8_t* e8m0;   // mxfp4 scales, else nullptr
  const uint16_t* fp16;  // q4g scales, else nullptr
  const uint8_t* zeros;  // q4g zero points, or nullptr
  int64_t groups, blocks_per_group, blocks, row_bytes;
};

Q8Bank q8_bank(const RowsDotArgs& a) {
  const bool mx = a.format == WeightFormat::kMxfp4;
  Q8Bank b;
  b.codes = static_cast<const uint8_t*>(a.w);
  b.e8m0 = mx ? static_cast<const uint8_t*>(a.scales) : nullptr;
  b.fp16 = mx ? nullptr : static_cast<const uint16_t*>(a.scales);
  b.zeros = mx ? nullptr : a.zeros;
  b.groups = a.k / a.group;
  b.blocks_per_group = a.group / kQ8Block;
  b.blocks = a.k / kQ8Block;
  b.row_bytes = a.k / 2;
  return b;
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

constexpr int64_t kPrefetchRows = 4;  // prefetch distance, in rows

// Prefetches the scales (and zero points) of rows [r, r + n).
inline void prefetch_scales(const Q8Bank& w, int64_t r, int64_t n) {
  const int64_t idx = r * w.groups, count = n * w.groups;
  const char* s = w.e8m0 != nullptr ? reinterpret_cast<const char*>(w.e8m0 + idx)
                                     : reinterpret_cast<const char*>(w.fp16 + idx);
  const int64_t bytes = w.e8m0 != nullptr ? count : 2 * count;
  for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(s + o, _MM_HINT_T0);
  if (w.zeros != nullptr) {
    for (int64_t o = 0; o < count; o += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(w.zeros + idx + o), _MM_HINT_T0);
    }
  }
}

inline int slot_of(int i) { return 4 * (i % 2) + i / 2; }  // block i of a chunk -> its lane

// vpermd indices: slot j takes block idx[j] of the chunk (slot order [b0 b2 b4 b6 | b1 b3 b5 b7]).
inline __m256i slot_perm() { return _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7); }

// Weight scales of blocks [b0, b0 + nb) of row r in slot order, 0 in the lanes of missing blocks.
inline __m256 block_scales(const Q8Bank& w, int64_t r, int64_t b0, int64_t nb) {
  if (w.blocks_per_group == 1 && nb == kQ8ChunkBlocks) {
    const int64_t idx = r * w.groups + b0;
    __m256 s;
    if (w.e8m0 != nullptr) {
      // 2^(e - 127) has the bits e << 23 for e >= 1 and 0x00400000 for e = 0 (the larger of the
      // two), and halving it is exact, also into the subnormals: 2^(e - 128) for every byte but
      // 255 (E8M0 NaN, not supported: inf here).
      const __m256i e = _mm256_cvtepu8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.e8m0 + idx)));
      const __m256i bits =
          _mm256_max_epi32(_mm256_slli_epi32(e, 23), _mm256_set1_epi32(0x00400000));
      s = _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(0.5f));
    } else {
      s = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.fp16 + idx)));
    }
    return _mm256_permutevar8x32_ps(s, slot_perm());
  }
  alignas(32) float buf[kQ8ChunkBlocks] = {};
  for (int i = 0; i < nb; ++i) {
    const int64_t idx = r * w.groups + (b0 + i) / w.blocks_per_group;
    buf[slot_of(i)] = w.e8m0 != nullptr ? e8m0_half_scale(w.e8m0[idx]) : _cvtsh_ss(w.fp16[idx]);
  }
  return _mm256_load_ps(buf);
}

// Zero points of blocks [b0, b0 + nb) of row r as int32 in slot order (0 for missing blocks).
inline __m256i block_zeros(const Q8Bank& w, int64_t r, int64_t b0, int64_t nb) {
  if (w.blocks_per_group == 1 && nb == kQ8ChunkBlocks) {
    const __m256i z = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.zeros + r * w.groups + b0)));
    return _mm256_permutevar8x32_epi32(z, slot_perm());
  }
  alignas(32) int32_t buf[kQ8ChunkBlocks] = {};
  for (int i = 0; i < nb; ++i) {
    buf[slot_of(i)] = w.zeros[r * w.groups + (b0 + i) / w.blocks_per_group];
  }
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(buf));
}

// Low / high nibbles of 32 code bytes as unsigned weights u (see the file comment).
template <bool kMx>
inline void nibbles(__m256i raw, __m256i lut, __m256i& lo, __m256i& hi) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  lo = _mm256_and_si256(raw, m4);
  hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
  if (kMx) {
    lo = _mm256_shuffle_epi8(lut, lo);
    hi = _mm256_shuffle_epi8(lut, hi);
  }
}

inline __m256i load256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// 128 bits from p in the low lane, zeros in the high lane.
inline __m256i load128_low(const void* p) {
  return _mm256_inserti128_si256(_mm256_setzero_si256(),
                                 _mm_loadu_si128(static_cast<const __m128i*>(p)), 0);
}

// int16 partial sums of u * q for pair `pair` of a chunk, lo / hi its decoded nibbles; `lone`: the
// pair holds only its first block (the vector's unpaired last block, low lane only).
inline __m256i pair_dot(const int8_t* x, int pair, bool lone, __m256i lo, __m256i hi) {
  const int8_t* p = x + 64 * pair;
  if (!lone) {
    return _mm256_add_epi16(_mm256_maddubs_epi16(lo, load256(p)),
                            _mm256_maddubs_epi16(hi, load256(p + 32)));
  }
  return _mm256_add_epi16(_mm256_maddubs_epi16(lo, load128_low(p)),
                          _mm256_maddubs_epi16(hi, load128_low(p + 16)));
}

// The 8 block sums of a chunk (before the offset correction), slot order, for RB rows x TB
// vectors: rows[r] points at row r's first code byte of the chunk, xs[t] at vector t's first
// activation byte. kFull: 8 blocks; else nb < 8. Every step runs for all RB x TB pairs before
// the next, so the compiler emits the independent dependency chains side by side (one chunk's
// chain is ~25 cycles long, longer than the out-of-order window reaches ahead on its own).
template <bool kMx, bool kFull, int RB, int TB>
inline void chunk_sums(const uint8_t* const* rows, const int8_t* const* xs, int nb, __m256i lut,
                       __m256i (*out)[TB]) {
  const __m256i ones = _mm256_set1_epi16(1);
  const int pairs = kFull ? 4 : (nb + 1) / 2;
  __m256i half[2][RB][TB];
  for (int h = 0; h < 2; ++h) {
    __m256i part[2][RB][TB];
    for (int j = 0; j < 2; ++j) {
      const int pair = 2 * h + j;
      if (!kFull && pair >= pairs) {
        for (int r = 0; r < RB; ++r)
          for (int t = 0; t < TB; ++t) part[j][r][t] = _mm256_setzero_si256();
        continue;
      }
      const bool lone = !kFull && 2 * pair + 1 == nb;
      for (int r = 0; r < RB; ++r) {
        const uint8_t* c = rows[r] + 32 * pair;
        __m256i lo, hi;
        nibbles<kMx>(lone ? load128_low(c) : load256(c), lut, lo, hi);
        for (int t = 0; t < TB; ++t) part[j][r][t] = pair_dot(xs[t], pair, lone, lo, hi);
      }
    }
    for (int r = 0; r < RB; ++r) {
      for (int t = 0; t < TB; ++t) {
        const __m256i folded =
            _mm256_add_epi16(_mm256_unpacklo_epi64(part[0][r][t], part[1][r][t]),
                             _mm256_unpackhi_epi64(part[0][r][t], part[1][r][t]));
        half[h][r][t] = _mm256_madd_epi16(folded, ones);  // [b0 b0 b2 b2 | b1 b1 b3 b3] (h = 0)
      }
    }
  }
  for (int r = 0; r < RB; ++r) {
    for (int t = 0; t < TB; ++t) {
      const __m256 a = _mm256_castsi256_ps(half[0][r][t]), b = _mm256_castsi256_ps(half[1][r][t]);
      out[r][t] = _mm256_add_epi32(_mm256_castps_si256(_mm256_shuffle_ps(a, b, 0x88)),
                                   _mm256_castps_si256(_mm256_shuffle_ps(a, b, 0xDD)));
    }
  }
}

// Sums of the RB accumulators into out[0 : RB].
template <int RB>
inline void store_sums(const __m256* acc, float* out) {
  for (int r = 0; r < RB; ++r) out[r] = hsum8(acc[r]);
}

// Rows [r0, r0 + RB) x vectors [i0, i0 + TB): out = sum over chunks of cvt(isum) * d_x * d_w.
// Chunk-outer: each chunk's vector data (q, d, o * sum(q)) is read once for the RB rows.
template <class Full, bool kMx, bool kZeros, int RB, int TB>
void tile(const Q8Bank& w, const RowsDotArgs& a, int64_t r0, int64_t i0) {
  __m256 acc[TB][RB];
  for (int t = 0; t < TB; ++t)
    for (int r = 0; r < RB; ++r) acc[t][r] = _mm256_setzero_ps();
  const Q8Vec* v = a.qvecs + i0;
  const __m256i lut = kMx ? _mm256_broadcastsi128_si256(
                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxU8.v)))
                          : _mm256_setzero_si256();
  const __m256i fixed_offset = _mm256_set1_epi32(kMx ? kMxfp4Offset : kQ4gSymmetricZero);
  // Codes: the row block kPrefetchRows rows on (same columns), when there is one; scales and zero
  // points of that block once per tile (they sit apart from the codes).
  const int64_t ahead_rows = a.row_end - r0 > kPrefetchRows ? kPrefetchRows : 0;
  const int64_t ahead = ahead_rows * w.row_bytes;
  if (ahead_rows > 0) prefetch_scales(w, r0 + ahead_rows, RB);
  for (int64_t b0 = 0; b0 < w.blocks; b0 += kQ8ChunkBlocks) {
    const int64_t nb = w.blocks - b0 < kQ8ChunkBlocks ? w.blocks - b0 : kQ8ChunkBlocks;
    const int8_t* xs[TB];
    __m256i corr[TB];  // o * sum(q) per block, when o is fixed
    for (int t = 0; t < TB; ++t) {
      xs[t] = v[t].q + b0 * kQ8Block;
      if (!kZeros) {
        const __m256i qsum = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v[t].sums + b0));
        corr[t] = _mm256_mullo_epi32(fixed_offset, qsum);
      }
    }
    const uint8_t* rows[RB];
    __m256 dw[RB];
    for (int r = 0; r < RB; ++r) {
      rows[r] = w.codes + (r0 + r) * w.row_bytes + b0 * (kQ8Block / 2);
      _mm_prefetch(reinterpret_cast<const char*>(rows[r] + ahead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(rows[r] + ahead + 64), _MM_HINT_T0);
      dw[r] = block_scales(w, r0 + r, b0, nb);
    }
    __m256i sums[RB][TB];
    if (nb == kQ8ChunkBlocks) {
      Full::template sums<kMx, RB, TB>(rows, xs, lut, sums);
    } else {
      chunk_sums<kMx, false, RB, TB>(rows, xs, static_cast<int>(nb), lut, sums);
    }
    for (int r = 0; r < RB; ++r) {
      __m256i zeros;
      if (kZeros) zeros = block_zeros(w, r0 + r, b0, nb);
      for (int t = 0; t < TB; ++t) {
        __m256i isum;
        if (kZeros) {
          const __m256i qsum =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v[t].sums + b0));
          isum = _mm256_sub_epi32(sums[r][t], _mm256_mullo_epi32(zeros, qsum));
        } else {
          isum = _mm256_sub_epi32(sums[r][t], corr[t]);
        }
        const __m256 scale = _mm256_mul_ps(_mm256_loadu_ps(v[t].d + b0), dw[r]);
        acc[t][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[t][r]);
      }
    }
  }
  for (int t = 0; t < TB; ++t) {
    store_sums<RB>(acc[t], a.out + (i0 + t) * a.out_stride + (r0 - a.row_begin));
  }
}

// Rows [row_begin, row_end) x vectors [i0, i0 + TB): RB-row tiles, then single rows.
template <class Full, bool kMx, bool kZeros, int RB, int TB>
void row_tiles(const Q8Bank& w, const RowsDotArgs& a, int64_t i0) {
  int64_t r = a.row_begin;
  for (; r + RB <= a.row_end; r += RB) tile<Full, kMx, kZeros, RB, TB>(w, a, r, i0);
  for (; r < a.row_end; ++r) tile<Full, kMx, kZeros, 1, TB>(w, a, r, i0);
}

// Vectors in groups of 4, then 2 (one row per tile), then one at a time (two rows per tile): at
// most 4 chains side by side, which the 16 ymm registers hold without many spills (measured on
// the AVX2 test machine; 4 rows x 1 vector was slower for q4g).
template <class Full, bool kMx, bool kZeros>
void rows(const Q8Bank& w, const RowsDotArgs& a) {
  int64_t i0 = 0;
  for (; i0 + 4 <= a.num_vecs; i0 += 4) row_tiles<Full, kMx, kZeros, 1, 4>(w, a, i0);
  for (; i0 + 2 <= a.num_vecs; i0 += 2) row_tiles<Full, kMx, kZeros, 1, 2>(w, a, i0);
  for (; i0 < a.num_vecs; ++i0) row_tiles<Full, kMx, kZeros, 2, 1>(w, a, i0);
}

// rows<Full, ...> for the bank's format (mxfp4, q4g with or without zero points).
template <class Full>
void rows_for_format(const RowsDotArgs& a) {
  if (a.num_vecs <= 0 || a.row_end <= a.row_begin) return;
  const Q8Bank w = q8_bank(a);
  if (a.format == WeightFormat::kMxfp4) {
    rows<Full, true, false>(w, a);
  } else if (w.zeros != nullptr) {
    rows<Full, false, true>(w, a);
  } else {
    rows<Full, false, false>(w, a);
  }
}
