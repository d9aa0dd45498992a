// The ISA variants of one decode vector kernel (src/decode_impl.h: the attention chunk core, the
// delta-rule step): each variant's function, the stable name the kernel report uses (e.g.
// "attend_avx2") and the lowest ISA variant that runs it, with a per-process call count.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include "freetoken/isa.h"

namespace freetoken {

template <class Args>
class DecodeKernels {
 public:
  struct Variant {
    void (*fn)(const Args&) = nullptr;
    const char* name = "";
    Isa needs = Isa::kScalar;
  };

  // variants: lowest ISA first, the first one scalar.
  explicit DecodeKernels(std::vector<Variant> variants) : variants_(std::move(variants)) {
    if (variants_.empty() || variants_.size() > uses_.size()) {
      throw std::logic_error("DecodeKernels: 1 to 4 variants");
    }
  }

  // The function of the best variant at or below `isa`, its call counted.
  void (*use(Isa isa) const)(const Args&) {
    size_t best = 0;
    for (size_t i = 0; i < variants_.size(); ++i) {
      if (static_cast<int>(variants_[i].needs) <= static_cast<int>(isa)) best = i;
    }
    uses_[best].fetch_add(1, std::memory_order_relaxed);
    return variants_[best].fn;
  }

  const std::vector<Variant>& variants() const { return variants_; }
  uint64_t uses(size_t i) const { return uses_[i].load(std::memory_order_relaxed); }

 private:
  std::vector<Variant> variants_;
  mutable std::array<std::atomic<uint64_t>, 4> uses_{};
};

}  // namespace freetoken
