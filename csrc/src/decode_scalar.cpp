// decode_impl.h over a portable 16-float array (no ISA flags; separate multiply and add).
#include "decode_impl.h"

namespace freetoken {

namespace {

struct V16 {
  float v[kLanes];

  static V16 zero() { return V16{}; }
  static V16 broadcast(float x) {
    V16 r;
    for (int64_t l = 0; l < kLanes; ++l) r.v[l] = x;
    return r;
  }
  static V16 load(const float* p) {
    V16 r;
    std::memcpy(r.v, p, sizeof(r.v));
    return r;
  }
  static V16 load_bf16(const uint16_t* p) {
    V16 r;
    for (int64_t l = 0; l < kLanes; ++l) {
      const uint32_t u = static_cast<uint32_t>(p[l]) << 16;
      std::memcpy(r.v + l, &u, sizeof(float));
    }
    return r;
  }
  static V16 fma(const V16& a, const V16& b, V16 acc) {
    for (int64_t l = 0; l < kLanes; ++l) acc.v[l] += a.v[l] * b.v[l];
    return acc;
  }
  static void store(float* p, const V16& x) { std::memcpy(p, x.v, sizeof(x.v)); }
  static float fold(V16 x) {
    for (int64_t w = kLanes / 2; w >= 1; w /= 2) {
      for (int64_t l = 0; l < w; ++l) x.v[l] += x.v[l + w];
    }
    return x.v[0];
  }
  static void fold16(const V16* rows, float* out) {
    for (int r = 0; r < 16; ++r) out[r] = fold(rows[r]);
  }
};

}  // namespace

void attend_chunk_scalar(const AttendArgs& a) { attend_chunk_impl<V16>(a); }

void delta_rule_step_scalar(const DeltaRuleArgs& a) { delta_rule_step_impl<V16>(a); }

}  // namespace freetoken
