// attnlab's integer weight-only matrix products for a few rows (decoding), built on first use
// by attnlab/nn/int_kernels.py. 8 float lanes as one vector (GCC/Clang vector extensions: one
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
// Groups are g consecutive inputs (int8: g a multiple of 16, g = K is one scale per channel;
// int4: g a multiple of 32).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#if defined(__AVX2__)
#include <immintrin.h>
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

// Eight float lanes as one value (GCC/Clang vector extensions: one AVX2 register, two NEON
// ones), so that the loops below are SIMD whatever the compiler's auto-vectoriser decides.
typedef float f8 __attribute__((vector_size(32)));
typedef int8_t s8x8 __attribute__((vector_size(8)));
typedef int32_t i8 __attribute__((vector_size(32)));

inline f8 load(const float* p) {
  f8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// 8 int8 codes to 8 floats
#if defined(__AVX2__)
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

inline float lane_sum(f8 v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
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
#if defined(__AVX2__) && defined(__F16C__)
  return _cvtsh_ss(bits);
#else
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
#endif
}

// One 32-input chunk of a row of 4-bit codes (16 bytes: byte j holds input 2j in its low
// nibble, 2j+1 in its high one) against the chunk's 16-bit activations, stored as the 16 even
// inputs and then the 16 odd ones: the exact integer Σ c · q_x in 8 lanes (each lane's sum
// is at most 4 · 15 · 32767 < 2^24, exact in float32 too).
#if defined(__AVX2__)
inline f8 chunk_dot4(const uint8_t* bytes, const int16_t* xq) {
  const __m128i v = _mm_loadu_si128((const __m128i*)bytes), nibble = _mm_set1_epi8(15);
  const __m256i low = _mm256_cvtepu8_epi16(_mm_and_si128(v, nibble));
  const __m256i high = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), nibble));
  // int16 · int16 in pairs to int32
  const __m256i sums = _mm256_add_epi32(
      _mm256_madd_epi16(low, _mm256_loadu_si256((const __m256i*)xq)),
      _mm256_madd_epi16(high, _mm256_loadu_si256((const __m256i*)(xq + 16))));
  return (f8)_mm256_cvtepi32_ps(sums);
}
#else
inline f8 chunk_dot4(const uint8_t* bytes, const int16_t* xq) {
  i8 sums = {};
  for (int j = 0; j < 16; ++j)
    sums[j % 8] += (bytes[j] & 15) * int32_t(xq[j]) + (bytes[j] >> 4) * int32_t(xq[16 + j]);
  return __builtin_convertvector(sums, f8);
}
#endif

// The activations of int4_matmul, per 32-input chunk of each row: 16-bit codes with one scale,
// q_x = round(x / s_x), s_x = max |x| / 32767, stored even inputs first (above), and each
// group's float sum Σ x for the offsets (xs zeroed). A chunk holding an inf or a NaN gets
// s_x = NaN (its row's outputs are NaN, as x · Ŵᵀ would be or nearly); one whose inputs are
// all below 1e-30 in size counts as zeros (an error under 1e-30 · Σ |s · c|).
void quantize_chunks(const float* x, int64_t m, int64_t k, int64_t group, int16_t* xq,
                     float* sx, float* xs) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < k / 32; ++c) {
      const float* src = x + r * k + c * 32;
      float top = 0, sum = 0;
      for (int j = 0; j < 32; ++j) {
        top = std::max(top, std::fabs(src[j]));
        sum += src[j];
      }
      const bool finite = std::isfinite(sum) && std::isfinite(top);
      const float inverse = finite && top > 1e-30f ? 32767 / top : 0;
      auto code = [&](float v) {  // within ±32767 however the product rounds
        return static_cast<int16_t>(std::fmin(32767.f, std::fmax(-32767.f,
                                                                   std::nearbyint(v * inverse))));
      };
      int16_t* dst = xq + r * k + c * 32;
      for (int j = 0; j < 16; ++j) {
        dst[j] = inverse > 0 ? code(src[2 * j]) : 0;
        dst[16 + j] = inverse > 0 ? code(src[2 * j + 1]) : 0;
      }
      sx[r * (k / 32) + c] = finite ? top / 32767 : std::nanf("");
      xs[r * (k / group) + c * 32 / group] += sum;
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
  at::Tensor sx = at::empty({m, chunks}, x.options()), xs = at::zeros({m, groups}, x.options());
  quantize_chunks(x.data_ptr<float>(), m, k, group, xq.data_ptr<int16_t>(), sx.data_ptr<float>(),
                  xs.data_ptr<float>());
  at::Tensor y = at::empty({m, n}, x.options());
  const int16_t* xqp = xq.data_ptr<int16_t>();
  const float *sxp = sx.data_ptr<float>(), *xsp = xs.data_ptr<float>();
  const uint8_t* cp = packed.data_ptr<uint8_t>();
  // float16 scales and offsets, as Q4_1 keeps them: 4 bytes a group, not 8
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>());
  const uint16_t* bp = reinterpret_cast<const uint16_t*>(offsets.data_ptr<at::Half>());
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, n, kGrain, [&](int64_t n0, int64_t n1) {
    for (int64_t o = n0; o < n1; ++o)
      for (int64_t r = 0; r < m; ++r) {
        // two independent sums, so that each FMA need not wait for the one before
        f8 even = {}, odd = {};
        const uint8_t* row = cp + o * k / 2;
        const int16_t* xr = xqp + r * k;
        const uint16_t* sr = sp + o * groups;
        const float* sxr = sxp + r * chunks;
        // a chunk's weight scale (no division in the common case of groups of 32)
        auto scale = [&](int64_t c) { return half(per_group == 1 ? sr[c] : sr[c / per_group]); };
        int64_t c = 0;
        for (; c + 1 < chunks; c += 2) {
          even += (scale(c) * sxr[c]) * chunk_dot4(row + c * 16, xr + c * 32);
          odd += (scale(c + 1) * sxr[c + 1]) *
                 chunk_dot4(row + (c + 1) * 16, xr + (c + 1) * 32);
        }
        if (c < chunks) even += (scale(c) * sxr[c]) * chunk_dot4(row + c * 16, xr + c * 32);
        float offset = 0;
        for (int64_t g = 0; g < groups; ++g) offset += half(bp[o * groups + g]) * xsp[r * groups + g];
        yp[r * n + o] = lane_sum(even + odd) + offset;
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
