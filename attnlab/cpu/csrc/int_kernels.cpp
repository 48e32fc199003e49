// attnlab's integer weight-only matrix products for a few rows (decoding), built on first use
// by attnlab/cpu/kernels.py. 8 float lanes as one vector (GCC/Clang vector extensions: one
// AVX2 register, two NEON ones), x86 intrinsics where GCC's own code is slow; OpenMP threads
// through ATen's at::parallel_for, over output channels. Both read the codes once and never
// materialise the dequantised matrix.
//
//   int8: y[m, n] = Σ_g s[n, g] · Σ_{k ∈ g} q[n, k] · x[m, k]                  q int8 (N, K)
//         x float32: only the order of the sums differs from x · Ŵᵀ in float32.
//   int4: y[m, n] = Σ_c s[n, c] · s_x[m, c] · Σ_{k ∈ c} c[n, k] · q_x[m, k]
//                   + b[n, c] · Σ_{k ∈ c} x[m, k]                  over chunks c of 32 inputs
//         c ∈ 0…15, two to a byte (input 2j in the low nibble of byte j, 2j+1 in the high one),
//         Ŵ = s · c + b (b = z − 8s for attnlab's codes, Q4_1's minimum for llama.cpp's);
//         x̂ = s_x · q_x is x rounded to 8 bits per 32 inputs (llama.cpp's Q8_1), so that
//         codes and activations meet in exact integer sums: unsigned × signed bytes, by
//         vpdpbusd (AVX512-VNNI) or vpmaddubsw + vpmaddwd (AVX2), the same integers either way.
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
#include <string>
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

// A chunk is 32 consecutive inputs: 16 bytes of codes (input 2j in the low nibble of byte j,
// 2j+1 in the high one) and 32 int8 activations stored even inputs first (input 2j at j, 2j+1 at
// 16 + j), the order in which the bytes' low nibbles, then their high ones, unpack. The dot
// product of a chunk is 8 exact int32 lanes, lane l summing the products at positions
// 4l … 4l+3 of that order (each lane at most 4 · 15 · 127): the same integers on every path.
#if defined(ATTNLAB_X86)
// the 32 codes of a chunk as 32 bytes 0…15: both halves hold the 16 bytes; shifting the high
// half's 32-bit lanes by 4 brings each byte's high nibble down
inline __m256i chunk_codes(const uint8_t* bytes) {
  const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)bytes));
  return _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)),
                          _mm256_set1_epi8(0x0F));
}

// AVX2: unsigned × signed bytes to int16 pairs (vpmaddubsw: at most 2 · 15 · 127, never
// saturating), then pairs of those to int32 (vpmaddwd by ones)
struct PairDot {
  inline __m256i operator()(const uint8_t* bytes, const int8_t* xq) const {
    const __m256i pairs = _mm256_maddubs_epi16(chunk_codes(bytes),
                                               _mm256_loadu_si256((const __m256i*)xq));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
  }
};
#else
struct PairDot {  // the same lanes, one product at a time
  inline i8 operator()(const uint8_t* bytes, const int8_t* xq) const {
    i8 sums = {};
    for (int p = 0; p < 32; ++p) {
      const int code = p < 16 ? bytes[p] & 15 : bytes[p - 16] >> 4;
      sums[p / 4] += code * xq[p];
    }
    return sums;
  }
};
#endif

#if defined(ATTNLAB_VNNI) && defined(ATTNLAB_X86) && \
    ((defined(__clang__) && __clang_major__ >= 11) || (!defined(__clang__) && __GNUC__ >= 10))
#define ATTNLAB_HAS_VNNI 1
#define ATTNLAB_VNNI_TARGET __attribute__((target("avx512f,avx512vl,avx512vnni")))
// AVX512-VNNI: the four products of each lane added in one instruction (vpdpbusd, 256 bits)
struct VnniDot {
  ATTNLAB_VNNI_TARGET inline __m256i operator()(const uint8_t* bytes, const int8_t* xq) const {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), chunk_codes(bytes),
                               _mm256_loadu_si256((const __m256i*)xq));
  }
};

// Whether this CPU runs vpdpbusd (the build asked for it; checked again where it runs)
bool vnni_cpu() {
  static const bool here =
      __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
  return here;
}
#endif

// The activations of int4_matmul, per chunk of each row: 8-bit codes with one scale,
// q_x = round(x / s_x), s_x = max |x| / 127 (llama.cpp's Q8_1 blocks), stored in the chunk's
// order above, and the chunk's float sum Σ x for the offsets. A chunk holding an inf or a NaN
// (its sum is not finite) gets s_x = NaN: its row's outputs are NaN, as x · Ŵᵀ would be or
// nearly. One whose inputs are all below 1e-30 in size counts as zeros (an error under
// 1e-30 · Σ |s · c|).
void quantize_chunks(const float* x, int64_t m, int64_t k, int8_t* xq, float* sx, float* xs) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < k / 32; ++c) {
      const float* src = x + r * k + c * 32;
      float v[32];
      for (int j = 0; j < 16; ++j) {
        v[j] = src[2 * j];
        v[16 + j] = src[2 * j + 1];
      }
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
      const float inverse = finite && top > 1e-30f ? 127 / top : 0;
      int8_t* dst = xq + r * k + c * 32;
      for (int u = 0; u < 4; ++u) {  // within ±127 however the product rounds
        f8 scaled = load(v + 8 * u) * inverse;
        scaled = scaled < 127.f ? scaled : 127.f;
        scaled = scaled > -127.f ? scaled : -127.f;
#if defined(ATTNLAB_X86)  // (rounds to nearest even, as std::nearbyint does)
        const __m256i whole = _mm256_cvtps_epi32((__m256)scaled);
        const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(whole),
                                              _mm256_extracti128_si256(whole, 1));
        _mm_storel_epi64((__m128i*)(dst + 8 * u), _mm_packs_epi16(words, words));
#else
        for (int j = 0; j < 8; ++j)
          dst[8 * u + j] = static_cast<int8_t>(std::nearbyint(scaled[j]));
#endif
      }
      sx[r * (k / 32) + c] = finite ? top / 127 : std::nanf("");
      xs[r * (k / 32) + c] = sum;
    }
}

// One int4 product's operands, after quantize_chunks
struct Int4Operands {
  const int8_t* xq;
  const float *sx, *xs;  // per chunk of each row of x: its scale, its sum
  const uint8_t* codes;
  const uint16_t *s, *b;  // float16 scales and offsets, as Q4_1 keeps them: 4 bytes a group
  float* y;
  int64_t m, n, k, groups, chunks, per_group;
};

// For output row o and input row r: w[c] = s · s_x of each chunk, and the offsets' part
// Σ_c b · Σ_{k ∈ c} x in 8 lanes (8 chunks at a time where the groups are chunks)
inline f8 chunk_weights(const Int4Operands& a, int64_t o, int64_t r, float* w) {
  const uint16_t* sr = a.s + o * a.groups;
  const uint16_t* br = a.b + o * a.groups;
  const float* sxr = a.sx + r * a.chunks;
  const float* xsr = a.xs + r * a.chunks;
  f8 lanes = {};
  int64_t c = 0;
#if defined(ATTNLAB_X86)
  if (a.per_group == 1)
    for (; c + 8 <= a.chunks; c += 8) {
      const f8 s = (f8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(sr + c)));
      const f8 b = (f8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(br + c)));
      store(w + c, s * load(sxr + c));
      lanes += b * load(xsr + c);
    }
#endif
  float rest = 0;
  for (; c < a.chunks; ++c) {
    w[c] = half(sr[c / a.per_group]) * sxr[c];
    rest += half(br[c / a.per_group]) * xsr[c];
  }
  lanes[0] += rest;
  return lanes;
}

// Output channels n0 … n1 − 1 of y: each chunk's exact integer lanes, scaled by w[c] into four
// independent float sums (so that each FMA need not wait for the one before). ``dot`` is the
// chunk product of the CPU's instructions; every path adds the same integers in the same order.
template <typename Dot>
__attribute__((always_inline)) inline void int4_channels(const Int4Operands& a, int64_t n0,
                                                         int64_t n1, float* w, Dot dot) {
  for (int64_t o = n0; o < n1; ++o)
    for (int64_t r = 0; r < a.m; ++r) {  // (the codes stay in L1 across the rows of x)
      const uint8_t* row = a.codes + o * a.k / 2;
      const int8_t* xr = a.xq + r * a.k;
      f8 lanes[4] = {chunk_weights(a, o, r, w)};
      int64_t c = 0;
      for (; c + 4 <= a.chunks; c += 4)
        for (int u = 0; u < 4; ++u)
          lanes[u] += w[c + u] * (f8)CONVERT(dot(row + (c + u) * 16, xr + (c + u) * 32));
      for (; c < a.chunks; ++c) lanes[0] += w[c] * (f8)CONVERT(dot(row + c * 16, xr + c * 32));
      a.y[r * a.n + o] = lane_sum((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]));
    }
}

void int4_product(const Int4Operands& a) {
  at::parallel_for(0, a.n, kGrain, [&](int64_t n0, int64_t n1) {
    std::vector<float> w(a.chunks);  // s · s_x of each chunk of a row
    int4_channels(a, n0, n1, w.data(), PairDot{});
  });
}

#if defined(ATTNLAB_HAS_VNNI)
ATTNLAB_VNNI_TARGET void int4_product_vnni(const Int4Operands& a) {
  at::parallel_for(0, a.n, kGrain, [&](int64_t n0, int64_t n1) {
    std::vector<float> w(a.chunks);
    int4_channels(a, n0, n1, w.data(), VnniDot{});
  });
}
#endif

at::Tensor int4_matmul(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                       const at::Tensor& offsets, int64_t group) {
  check(packed.dim() == 2 && packed.scalar_type() == at::kByte && packed.is_contiguous(),
        "codes must be contiguous uint8 (out, in / 2), two to a byte");
  const int64_t m = x.size(0), n = packed.size(0), k = packed.size(1) * 2;
  check_common(x, scales, at::kHalf, n, k, group);
  check(group % 32 == 0, "int4 groups must be a multiple of 32");
  check(offsets.sizes() == scales.sizes() && offsets.scalar_type() == at::kHalf &&
            offsets.is_contiguous(), "offsets must be float16 shaped like scales");
  const int64_t chunks = k / 32;
  at::Tensor xq = at::empty({m, k}, x.options().dtype(at::kChar));
  at::Tensor sx = at::empty({m, chunks}, x.options()), xs = at::empty({m, chunks}, x.options());
  quantize_chunks(x.data_ptr<float>(), m, k, xq.data_ptr<int8_t>(), sx.data_ptr<float>(),
                  xs.data_ptr<float>());
  at::Tensor y = at::empty({m, n}, x.options());
  const Int4Operands a{xq.data_ptr<int8_t>(),
                       sx.data_ptr<float>(),
                       xs.data_ptr<float>(),
                       packed.data_ptr<uint8_t>(),
                       reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>()),
                       reinterpret_cast<const uint16_t*>(offsets.data_ptr<at::Half>()),
                       y.data_ptr<float>(),
                       m, n, k, k / group, chunks, group / 32};
#if defined(ATTNLAB_HAS_VNNI)
  if (vnni_cpu()) {
    int4_product_vnni(a);
    return y;
  }
#endif
  int4_product(a);
  return y;
}

// Which instructions int4_matmul's chunk products run on this CPU, for `attnlab info`
std::string int4_dot() {
#if defined(ATTNLAB_HAS_VNNI)
  if (vnni_cpu()) return "vpdpbusd";
#endif
#if defined(ATTNLAB_X86)
  return "vpmaddubsw";
#else
  return "portable";
#endif
}

}  // namespace

TORCH_LIBRARY(attnlab, m) {
  m.def("int8_matmul(Tensor x, Tensor codes, Tensor scales, int group) -> Tensor");
  m.def("int4_matmul(Tensor x, Tensor codes, Tensor scales, Tensor offsets, int group) -> Tensor");
  m.def("int4_dot() -> str", &int4_dot);
}

TORCH_LIBRARY_IMPL(attnlab, CPU, m) {
  m.impl("int8_matmul", &int8_matmul);
  m.impl("int4_matmul", &int4_matmul);
}
