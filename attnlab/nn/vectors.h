// Eight float lanes as one value, shared by attnlab's CPU kernels (int_kernels.cpp,
// float_kernels.cpp, decode_attention.cpp). GCC/Clang vector extensions: one AVX2 register,
// two NEON ones, so the loops are SIMD whatever the compiler's auto-vectoriser decides.
#pragma once

#include <cstdint>
#include <cstring>

namespace attnlab {

typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));

inline f8 load(const float* p) {
  f8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store(float* p, f8 v) { std::memcpy(p, &v, sizeof v); }

// the sum of the 8 lanes, in a fixed order (so that every kernel adds them the same way)
inline float lane_sum(f8 v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

}  // namespace attnlab
