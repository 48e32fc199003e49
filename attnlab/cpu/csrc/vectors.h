// Eight float lanes as one value, and 16-bit floats widened into them, shared by attnlab's CPU
// kernels (int_kernels.cpp, float_kernels.cpp, decode_attention.cpp). GCC/Clang vector
// extensions: one AVX2 register, two NEON ones, so the loops are SIMD whatever the compiler's
// auto-vectoriser decides.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define ATTNLAB_X86 1
#endif

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

// 8 stored values as 8 floats: float32 as they are, float16 and bfloat16 widened (exactly)
inline f8 widen(const float* p) { return load(p); }

inline f8 widen(const c10::Half* p) {
#if defined(ATTNLAB_X86)
  return (f8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
#else
  f8 v;
  for (int j = 0; j < 8; ++j) v[j] = static_cast<float>(p[j]);
  return v;
#endif
}

inline f8 widen(const c10::BFloat16* p) {  // a bfloat16 is a float32's upper 16 bits
#if defined(ATTNLAB_X86)
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
  return (f8)_mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
#else
  f8 v;
  for (int j = 0; j < 8; ++j) v[j] = static_cast<float>(p[j]);
  return v;
#endif
}

}  // namespace attnlab
