// attnlab's integer weight-only matrix products for a few rows (decoding), built on first use
// by attnlab/cpu/kernels.py. 8 float lanes as one vector (GCC/Clang vector extensions: one
// AVX2 register, two NEON ones), AVX2 intrinsics where GCC's own code is slow; OpenMP threads
// through ATen's at::parallel_for, over output channels. Both read the codes once and never
// materialise the dequantised matrix.
//
//   int8: y[m, n] = Σ_g s[n, g] · Σ_{k ∈ g} q[n, k] · x[m, k]                  q int8 (N, K)
//         x float32: only the order of the sums differs from x · Ŵᵀ in float32.
//   int4: y[m, n] = Σ_g s[n, g] · Σ_{k ∈ g} c[n, k] · x̂[m, k] + b[n, g] · Σ_{k ∈ g} x[m, k]
//         c ∈ 0…15, two to a byte (input 2j in the low nibble of byte j, 2j+1 in the high one),
//         Ŵ = s · c + b (b = z − 8s for attnlab's codes, Q4_1's minimum for llama.cpp's);
//         x̂ = x rounded to 16 bits per 32 inputs, so that codes and activations meet in exact
//         integer sums (converting every 4-bit code to float costs more than reading it).
//
// Groups are g consecutive inputs (int8: any g that divides K, g = K is one scale per channel;
// int4: g a multiple of 32).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "vectors.h"  // (defines ATTNLAB_X86 where AVX2, FMA and F16C are on)
#if defined(ATTNLAB_X86)
#define CONVERT(v) _mm256_cvtepi32_ps(v)
#else
#define CONVERT(v) __builtin_convertvector(v, f8)
#endif

namespace {

constexpr int64_t kGrain = 16;  // output channels a thread takes at least

void check(bool ok, const char* what) { TORCH_CHECK(ok, "attnlab integer kernel: ", what); }

void check_common(const at::Tensor& x, const at::Tensor& scales, at::ScalarType dtype,
                  int64_t n, int64_t k, int64_t group) {
  check(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.is_cpu(),
        "x must be a contiguous float32 (rows, in) CPU tensor");
  check(x.size(1) == k, "x's width must be the matrix's in_features");
  check(group > 0 && k % group == 0, "group must divide in_features");
  check(scales.scalar_type() == dtype && scales.is_contiguous() && scales.dim() == 2 &&
            scales.size(0) == n && scales.size(1) == k / group,
        dtype == at::kFloat ? "scales must be float32 (out, in / group)"
                            : "scales must be float16 (out, in / group)");
}

using attnlab::f8;
using attnlab::i8;
using attnlab::lane_sum;
using attnlab::load;
using attnlab::store;
typedef int8_t s8x8 __attribute__((vector_size(8)));

// 8 int8 codes to 8 floats
#if defined(ATTNLAB_X86)
// GCC widens a vector of 8 bytes element by element (10x slower), so x86 says it directly
inline f8 signed_codes(const int8_t* p) {
  return (f8)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}
#else
inline f8 signed_codes(const int8_t* p) {
  s8x8 c;
  std::memcpy(&c, p, sizeof c);
  return __builtin_convertvector(__builtin_convertvector(c, i8), f8);
}
#endif

// lanes += s · Σ_{k < g} q[k] · x[k], the sum kept in 8 lanes; 4 independent accumulators
// (then 8 at a time, then one at a time: any g)
inline void group_dot(const int8_t* q, const float* x, int64_t g, float s, f8& lanes) {
  f8 a[4] = {};
  int64_t k = 0;
  for (; k + 32 <= g; k += 32)
    for (int u = 0; u < 4; ++u) {
      a[u] += signed_codes(q + k + 8 * u) * load(x + k + 8 * u);
    }
  for (; k + 8 <= g; k += 8) a[0] += signed_codes(q + k) * load(x + k);
  float tail = 0;  // a width that is not a multiple of 8
  for (; k < g; ++k) tail += static_cast<float>(q[k]) * x[k];
  a[1][0] += tail;
  lanes += s * ((a[0] + a[1]) + (a[2] + a[3]));
}

at::Tensor int8_matmul(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales,
                       int64_t group) {
  check(q.dim() == 2 && q.scalar_type() == at::kChar && q.is_contiguous(),
        "codes must be contiguous int8 (out, in)");
  const int64_t m = x.size(0), n = q.size(0), k = q.size(1);
  check_common(x, scales, at::kFloat, n, k, group);
  const int64_t groups = k / group;
  at::Tensor y = at::empty({m, n}, x.options());
  const float* xp = x.data_ptr<float>();
  const int8_t* qp = q.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, n, kGrain, [&](int64_t n0, int64_t n1) {
    for (int64_t o = n0; o < n1; ++o)
      for (int64_t r = 0; r < m; ++r) {  // the row of codes stays in L1 across the rows of x
        f8 lanes = {};
        for (int64_t g = 0; g < groups; ++g)
          group_dot(qp + o * k + g * group, xp + r * k + g * group, group,
                    sp[o * groups + g], lanes);
        yp[r * n + o] = lane_sum(lanes);
      }
  });
  return y;
}

inline float half(uint16_t bits) {
#if defined(ATTNLAB_X86)
  return _cvtsh_ss(bits);
#else
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
#endif
}

// The 32 inputs of a chunk in the order its codes unpack: 16 bytes are 8 words, word w holding
// inputs 4w … 4w+3 in its four nibbles (low nibble first), and nibble q of every word is taken
// at once, so the 16-bit activations are stored as x[8q + w] = input 4w + q.
constexpr int kOrder[32] = {0, 4, 8,  12, 16, 20, 24, 28, 1, 5, 9,  13, 17, 21, 25, 29,
                            2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31};

// Σ c · q_x over one chunk, exact in 8 int32 lanes (each at most 4 · 15 · 32767 < 2^24, so
// exact in float32 too)
#if defined(ATTNLAB_X86)
inline __m256i chunk_dot4(const uint8_t* bytes, const int16_t* xq) {
  // both halves hold the 8 words; shifting each 32-bit lane (two words) by 0/4 (low/high
  // half), then 8/12, and keeping each word's low nibble gives nibbles 0, 1, then 2, 3
  const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)bytes));
  const __m256i nibble = _mm256_set1_epi32(0x000F000F);
  const __m256i q01 = _mm256_and_si256(
      _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), nibble);
  const __m256i q23 = _mm256_and_si256(
      _mm256_srlv_epi32(v, _mm256_setr_epi32(8, 8, 8, 8, 12, 12, 12, 12)), nibble);
  // int16 · int16 in pairs to int32 (vpmaddwd)
  return _mm256_add_epi32(_mm256_madd_epi16(q01, _mm256_loadu_si256((const __m256i*)xq)),
                          _mm256_madd_epi16(q23, _mm256_loadu_si256((const __m256i*)(xq + 16))));
}
#else
inline i8 chunk_dot4(const uint8_t* bytes, const int16_t* xq) {
  i8 sums = {};
  for (int q = 0; q < 4; ++q)
    for (int w = 0; w < 8; ++w)
      sums[w] += int32_t((bytes[2 * w + q / 2] >> (4 * (q % 2))) & 15) * xq[8 * q + w];
  return sums;
}
#endif

// The activations of int4_matmul, per 32-input chunk of each row: 16-bit codes with one scale,
// q_x = round(x / s_x), s_x = max |x| / 32767, stored in kOrder, and the chunk's float sum
// Σ x for the offsets. A chunk holding an inf or a NaN (its sum is not finite)
// gets s_x = NaN: its row's outputs are NaN, as x · Ŵᵀ would be or nearly. One whose inputs
// are all below 1e-30 in size counts as zeros (an error under 1e-30 · Σ |s · c|).
void quantize_chunks(const float* x, int64_t m, int64_t k, int16_t* xq, float* sx, float* xs) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < k / 32; ++c) {
      const float* src = x + r * k + c * 32;
      float v[32];
      for (int j = 0; j < 32; ++j) v[j] = src[kOrder[j]];
      f8 top8 = {}, sum8 = {};
      for (int u = 0; u < 4; ++u) {
        const f8 part = load(v + 8 * u);
        sum8 += part;
        top8 = top8 > part ? top8 : part;  // (NaN compares false: the sum catches it)
        top8 = top8 > -part ? top8 : -part;
      }
      float top = 0;
      for (int j = 0; j < 8; ++j) top = std::max(top, top8[j]);
      const float sum = lane_sum(sum8);
      const bool finite = std::isfinite(sum) && std::isfinite(top);
      const float inverse = finite && top > 1e-30f ? 32767 / top : 0;
      int16_t* dst = xq + r * k + c * 32;
      for (int u = 0; u < 4; ++u) {  // within ±32767 however the product rounds
        f8 scaled = load(v + 8 * u) * inverse;
        scaled = scaled < 32767.f ? scaled : 32767.f;
        scaled = scaled > -32767.f ? scaled : -32767.f;
#if defined(ATTNLAB_X86)  // (rounds to nearest even, as std::nearbyint does)
        const __m128i low = _mm256_castsi256_si128(_mm256_cvtps_epi32((__m256)scaled));
        const __m128i high = _mm256_extracti128_si256(_mm256_cvtps_epi32((__m256)scaled), 1);
        _mm_storeu_si128((__m128i*)(dst + 8 * u), _mm_packs_epi32(low, high));
#else
        for (int j = 0; j < 8; ++j)
          dst[8 * u + j] = static_cast<int16_t>(std::nearbyint(scaled[j]));
#endif
      }
      sx[r * (k / 32) + c] = finite ? top / 32767 : std::nanf("");
      xs[r * (k / 32) + c] = sum;
    }
}

at::Tensor int4_matmul(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                       const at::Tensor& offsets, int64_t group) {
  check(packed.dim() == 2 && packed.scalar_type() == at::kByte && packed.is_contiguous(),
        "codes must be contiguous uint8 (out, in / 2), two to a byte");
  const int64_t m = x.size(0), n = packed.size(0), k = packed.size(1) * 2;
  check_common(x, scales, at::kHalf, n, k, group);
  check(group % 32 == 0, "int4 groups must be a multiple of 32");
  const int64_t groups = k / group;
  check(offsets.sizes() == scales.sizes() && offsets.scalar_type() == at::kHalf &&
            offsets.is_contiguous(), "offsets must be float16 shaped like scales");
  const int64_t chunks = k / 32, per_group = group / 32;
  at::Tensor xq = at::empty({m, k}, x.options().dtype(at::kShort));
  at::Tensor sx = at::empty({m, chunks}, x.options()), xs = at::empty({m, chunks}, x.options());
  quantize_chunks(x.data_ptr<float>(), m, k, xq.data_ptr<int16_t>(), sx.data_ptr<float>(),
                  xs.data_ptr<float>());
  at::Tensor y = at::empty({m, n}, x.options());
  const int16_t* xqp = xq.data_ptr<int16_t>();
  const float *sxp = sx.data_ptr<float>(), *xsp = xs.data_ptr<float>();
  const uint8_t* cp = packed.data_ptr<uint8_t>();
  // float16 scales and offsets, as Q4_1 keeps them: 4 bytes a group, not 8
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>());
  const uint16_t* bp = reinterpret_cast<const uint16_t*>(offsets.data_ptr<at::Half>());
  float* yp = y.data_ptr<float>();
  // For output row o and input row r: w[c] = s · s_x of each chunk, and the offsets' part
  // Σ_c b · Σ_{k ∈ c} x in 8 lanes (8 chunks at a time where the groups are chunks)
  auto prepare = [&](int64_t o, int64_t r, float* w) {
    const uint16_t* sr = sp + o * groups;
    const uint16_t* br = bp + o * groups;
    const float* sxr = sxp + r * chunks;
    const float* xsr = xsp + r * chunks;
    f8 lanes = {};
    int64_t c = 0;
#if defined(ATTNLAB_X86)
    if (per_group == 1)
      for (; c + 8 <= chunks; c += 8) {
        const f8 s = (f8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(sr + c)));
        const f8 b = (f8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(br + c)));
        store(w + c, s * load(sxr + c));
        lanes += b * load(xsr + c);
      }
#endif
    float rest = 0;
    for (; c < chunks; ++c) {
      w[c] = half(sr[c / per_group]) * sxr[c];
      rest += half(br[c / per_group]) * xsr[c];
    }
    lanes[0] += rest;
    return lanes;
  };
  at::parallel_for(0, n, kGrain, [&](int64_t n0, int64_t n1) {
    std::vector<float> weights(chunks);  // s · s_x of each chunk of a row
    float* w0 = weights.data();
    for (int64_t o = n0; o < n1; ++o)
      for (int64_t r = 0; r < m; ++r) {  // (the codes stay in L1 across the rows of x)
        const uint8_t* row = cp + o * k / 2;
        const int16_t* xr = xqp + r * k;
        // four independent sums, so that each FMA need not wait for the one before
        f8 lanes[4] = {prepare(o, r, w0)};
        int64_t c = 0;
        for (; c + 4 <= chunks; c += 4)
          for (int u = 0; u < 4; ++u)
            lanes[u] += w0[c + u] * (f8)CONVERT(chunk_dot4(row + (c + u) * 16, xr + (c + u) * 32));
        for (; c < chunks; ++c)
          lanes[0] += w0[c] * (f8)CONVERT(chunk_dot4(row + c * 16, xr + c * 32));
        yp[r * n + o] = lane_sum((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]));
      }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(attnlab, m) {
  m.def("int8_matmul(Tensor x, Tensor codes, Tensor scales, int group) -> Tensor");
  m.def("int4_matmul(Tensor x, Tensor codes, Tensor scales, Tensor offsets, int group) -> Tensor");
}

TORCH_LIBRARY_IMPL(attnlab, CPU, m) {
  m.impl("int8_matmul", &int8_matmul);
  m.impl("int4_matmul", &int4_matmul);
}
