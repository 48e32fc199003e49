// attnlab's float matrix product for a few rows (decoding), built with the other CPU kernels by
// attnlab/cpu/kernels.py:
//
//   y[m, n] = Σ_k x[m, k] · W[n, k] (+ b[n])      x (rows, in), W (out, in) row-major
//
// W float32, or float16 / bfloat16 widened to float32 as it is read (half the bytes: a decoded
// token reads every weight once, so bytes are time; the sums stay float32, so no CPU needs
// native 16-bit arithmetic). x and b are float32, or W's 16-bit dtype, widened once a call;
// y is x's dtype, each sum rounded to it once (so a bf16 layer's call needs no conversions
// around it). Each thread takes a block of output channels. Every (row, channel) sum runs in
// one order, four chains of 8 lanes then a fixed lane sum, whatever the other rows, the
// threads or the CPU's vector width: a row gets the same bits in a batch as alone.
//   One row: a weight row at a time, bound by the memory that streams W.
//   Several rows (a batch of sequences, a short prompt): blocks of weight rows against blocks
//   of rows of x, each weight row read from memory once for all of them, and the next block's
//   weights fetched while this one computes (docs/benchmarks.md, "Batched decoding").
//
// bf16_batch_matmul(x, weight, bias): the same product for a bf16 W and a batch of one-token
// rows (KernelLinear sends it a step of 4 or more sequences, or beams), where the build has
// AVX512-BF16 (ATTNLAB_DPBF16, set by cpu/kernels.py) and the CPU runs it: x is rounded to
// bf16 once a call and vdpbf16ps multiplies 32 pairs exactly an instruction, adding them into
// 16 float32 sums, fewer instructions than widening each weight for every row. Each row's
// sums run in an order of its own, whatever the other rows and threads. Elsewhere it is
// float_matmul. bf16_dot_here() says which.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <memory>
#include <optional>
#if defined(ATTNLAB_DPBF16) && defined(__x86_64__) && \
    ((defined(__clang__) && __clang_major__ >= 11) || (!defined(__clang__) && __GNUC__ >= 10))
#include <immintrin.h>
#define ATTNLAB_HAS_DPBF16 1
#endif

#include "vectors.h"
#if defined(ATTNLAB_WIDE) && defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

using attnlab::f8;
using attnlab::lane_sum;
using attnlab::load;
using attnlab::widen;

constexpr int64_t kGrain = 16;  // output channels a thread takes at least

// ATTNLAB_WIDE (cpu/kernels.py sets it where ATen runs AVX-512): the batched product's blocks
// are also compiled for AVX-512, whose 32 registers of 16 lanes hold a wider block
// (block_dot16); it runs where the CPU says it has AVX-512F and VL. Each lane's arithmetic is
// the 8-lane code's either way, so the sums are the same bits.
#if defined(ATTNLAB_WIDE) && defined(__x86_64__) && (defined(__clang__) || __GNUC__ >= 9)
#define ATTNLAB_WIDE_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512vl")))
#define ATTNLAB_HAS_WIDE 1
bool wide_here() {
  static const bool here =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
  return here;
}
#else
#define ATTNLAB_WIDE_TARGET
bool wide_here() { return false; }
#endif

// Σ_k w[k] · x[k] in 4 chains of 8 lanes (then 8 at a time, then one at a time: any width)
template <typename T>
inline float row_dot(const T* w, const float* x, int64_t k) {
  f8 a[4] = {};
  int64_t i = 0;
  for (; i + 32 <= k; i += 32)
    for (int u = 0; u < 4; ++u) a[u] += widen(w + i + 8 * u) * load(x + i + 8 * u);
  for (; i + 8 <= k; i += 8) a[0] += widen(w + i) * load(x + i);
  float tail = 0;
  for (; i < k; ++i) tail += static_cast<float>(w[i]) * x[i];
  return lane_sum((a[0] + a[1]) + (a[2] + a[3])) + tail;
}

// b[o] as a float: the bias is float32, or T where ``bias_is_t`` (nullptr: none, 0)
template <typename T>
inline float bias_at(const void* bias, bool bias_is_t, int64_t o) {
  return !bias ? 0.f
         : bias_is_t ? static_cast<float>(static_cast<const T*>(bias)[o])
                     : static_cast<const float*>(bias)[o];
}

// For O weight rows against R rows of x at once: out[o·R + r] = row_dot(w_o, x_r), each pair's
// sums in row_dot's order exactly (4 chains of 8 lanes, the same tails, the same lane sum), so
// a row gets the same bits in a batch as alone. What blocking buys is loads: row_dot reads a
// weight vector and an x vector for each multiply-add (load-bound), a block reads O + R vectors
// for O·R of them. Each pair keeps 4 chains, so a block holds 4·O·R sums in registers: AVX2's
// 16 vector registers take 1 × 2 (AVX-512's 32 take 4 × 2 in block_dot16's 16-lane form).
//
// ``ahead``: the next block's weight rows (or nullptr), fetched into the cache while this block
// computes: a batch's block spends long enough on its rows that the hardware's own prefetching
// falls behind, and the product then waits on memory and arithmetic in turn.
// Into the cache: inputs i .. i + 31 of the O weight rows at ``ahead`` (rows of k)
template <int O, typename T>
__attribute__((always_inline)) inline void fetch(const T* ahead, int64_t k, int64_t i) {
  for (int o = 0; o < O; ++o)
    for (size_t b = 0; b < 32 * sizeof(T); b += 64)
      __builtin_prefetch(reinterpret_cast<const char*>(ahead + o * k + i) + b, 0, 1);
}

template <int O, int R, typename T>
__attribute__((always_inline)) inline void block_dot(const T* w, const float* x, int64_t k,
                                                     float* out, const T* ahead, int pass,
                                                     int passes) {
  f8 a[O][R][4] = {};
  int64_t i = 0;
  for (int turn = 0; i + 32 <= k; i += 32, turn = turn + 1 == passes ? 0 : turn + 1) {
    if (ahead && turn == pass) fetch<O>(ahead, k, i);  // each pass fetches its share
    for (int u = 0; u < 4; ++u) {
      f8 wv[O];
      for (int o = 0; o < O; ++o) wv[o] = widen(w + o * k + i + 8 * u);
      for (int r = 0; r < R; ++r) {
        f8 xv = load(x + r * k + i + 8 * u);
#if defined(ATTNLAB_X86)  // one load for the O products (else the compiler reads it O times)
        asm("" : "+v"(xv));
#endif
        for (int o = 0; o < O; ++o) a[o][r][u] += wv[o] * xv;
      }
    }
  }
  for (; i + 8 <= k; i += 8)
    for (int o = 0; o < O; ++o)
      for (int r = 0; r < R; ++r) a[o][r][0] += widen(w + o * k + i) * load(x + r * k + i);
  for (int o = 0; o < O; ++o)
    for (int r = 0; r < R; ++r) {
      float tail = 0;
      for (int64_t j = i; j < k; ++j) tail += static_cast<float>(w[o * k + j]) * x[r * k + j];
      const f8* s = a[o][r];
      out[o * R + r] = lane_sum((s[0] + s[1]) + (s[2] + s[3])) + tail;
    }
}

#if defined(ATTNLAB_HAS_WIDE)
#define ATTNLAB_WIDE_INLINE ATTNLAB_WIDE_TARGET __attribute__((always_inline)) inline

// Sixteen float lanes: one AVX-512 register
typedef float f16x __attribute__((vector_size(64)));

ATTNLAB_WIDE_INLINE f16x widen16(const float* p) {
  f16x v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

ATTNLAB_WIDE_INLINE f16x widen16(const c10::Half* p) {
  return (f16x)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
}

ATTNLAB_WIDE_INLINE f16x widen16(const c10::BFloat16* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p));
  return (f16x)_mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// block_dot's sums in 16-lane registers: a pair's chains 0 and 1 share one register (lanes 0-7
// and 8-15), chains 2 and 3 another, since chain u holds inputs i + 8u .. i + 8u + 7 of each
// 32-wide step. Every lane takes the same multiply-adds in the same order as in block_dot,
// so the sums are its bits. A pair needs 2 registers instead of 4, so a block holds more
// weight rows (4 weight rows x 2 rows of x: 16 sums, 4 weight and 1 x vectors), and an
// instruction does twice the work where the CPU runs 512-bit multiply-adds at full width.
template <int O, int R, typename T>
ATTNLAB_WIDE_TARGET void block_dot16(const T* w, const float* x, int64_t k, float* out,
                                     const T* ahead, int pass, int passes) {
  f16x a[O][R][2] = {};
  int64_t i = 0;
  for (int turn = 0; i + 32 <= k; i += 32, turn = turn + 1 == passes ? 0 : turn + 1) {
    if (ahead && turn == pass) fetch<O>(ahead, k, i);
    for (int h = 0; h < 2; ++h) {
      f16x wv[O];
      for (int o = 0; o < O; ++o) wv[o] = widen16(w + o * k + i + 16 * h);
      for (int r = 0; r < R; ++r) {
        f16x xv = widen16(x + r * k + i + 16 * h);
        asm("" : "+v"(xv));  // one load for the O products
        for (int o = 0; o < O; ++o) a[o][r][h] += wv[o] * xv;
      }
    }
  }
  // the 4 chains of 8 lanes as block_dot holds them, then its tails and lane sum
  for (int o = 0; o < O; ++o)
    for (int r = 0; r < R; ++r) {
      f8 s[4];
      std::memcpy(&s[0], &a[o][r][0], 2 * sizeof(f8));
      std::memcpy(&s[2], &a[o][r][1], 2 * sizeof(f8));
      int64_t j = i;
      for (; j + 8 <= k; j += 8) s[0] += widen(w + o * k + j) * load(x + r * k + j);
      float tail = 0;
      for (; j < k; ++j) tail += static_cast<float>(w[o * k + j]) * x[r * k + j];
      out[o * R + r] = lane_sum((s[0] + s[1]) + (s[2] + s[3])) + tail;
    }
}
#endif

// block_dot, or block_dot16 where ``Wide`` (the caller runs AVX-512; block_dot16 carries that
// target itself, so this function, compiled without it, may call it but not inline it)
template <int O, int R, bool Wide, typename T>
__attribute__((always_inline)) inline void dot(const T* w, const float* x, int64_t k,
                                               float* out, const T* ahead, int pass,
                                               int passes) {
#if defined(ATTNLAB_HAS_WIDE)
  if constexpr (Wide)
    block_dot16<O, R>(w, x, k, out, ahead, pass, passes);
  else
#endif
    block_dot<O, R>(w, x, k, out, ahead, pass, passes);
}

// y[r, o0 .. o0+O) for every row r, R rows of x a block (then fewer: the same sums)
template <int O, int R, bool Wide, typename T, typename Y>
__attribute__((always_inline)) inline void block_rows(const float* x, const T* w,
                                                      const void* bias, bool bias_is_t, Y* y,
                                                      int64_t m, int64_t n, int64_t k,
                                                      int64_t o0) {
  static_assert(R >= 1 && R <= 3, "the remainder below takes at most 2 rows");
  float sums[O * R];
  float b[O];
  for (int o = 0; o < O; ++o) b[o] = bias_at<T>(bias, bias_is_t, o0 + o);
  int64_t r0 = 0;
  const auto put = [&](int rows) {
    for (int o = 0; o < O; ++o)
      for (int r = 0; r < rows; ++r) y[(r0 + r) * n + o0 + o] = Y(sums[o * rows + r] + b[o]);
    r0 += rows;
  };
  // every pass over the block's weight rows fetches a share of a later block's (within n):
  // the next one, or with AVX-512 the one after it (its blocks take less time each)
  constexpr int64_t kAhead = Wide ? 2 : 1;
  const T* next = o0 + (kAhead + 1) * O <= n ? w + (o0 + kAhead * O) * k : nullptr;
  const int passes = static_cast<int>(m / R + (R > 2 && m % R >= 2) + (m % R % 2 == 1));
  int pass = 0;
  for (; r0 + R <= m; ++pass) {
    dot<O, R, Wide>(w + o0 * k, x + r0 * k, k, sums, next, pass, passes);
    put(R);
  }
  if constexpr (R > 2) {
    if (m - r0 >= 2) {
      dot<O, 2, Wide>(w + o0 * k, x + r0 * k, k, sums, next, pass++, passes);
      put(2);
    }
  }
  if (m - r0 == 1) {
    dot<O, 1, Wide>(w + o0 * k, x + r0 * k, k, sums, next, pass, passes);
    put(1);
  }
}

// The output channels [o, n1) for several rows of x: 4 × 2 blocks of 16-lane sums, compiled
// for AVX-512 (docs/benchmarks.md, "Batched decoding", has the shapes tried)
template <typename T, typename Y>
ATTNLAB_WIDE_TARGET void wide_rows(const float* x, const T* w, const void* bias, bool bias_is_t,
                                   Y* y, int64_t m, int64_t n, int64_t k, int64_t o,
                                   int64_t n1) {
  for (; o + 4 <= n1; o += 4) block_rows<4, 2, true>(x, w, bias, bias_is_t, y, m, n, k, o);
  for (; o < n1; ++o) block_rows<1, 2, true>(x, w, bias, bias_is_t, y, m, n, k, o);
}

// y = x · Wᵀ + b, x float32, y float32 or T (each sum rounded once), the bias float32 or T.
// One row: a weight row at a time (bound by memory). Several: blocks of weight rows and rows
// of x, wider where the CPU has AVX-512VL (wide_here()).
template <typename T, typename Y>
void product(const float* x, const T* w, const void* bias, bool bias_is_t, Y* y, int64_t m,
             int64_t n, int64_t k) {
  if (m == 0) return;
  const bool wide = m > 1 && wide_here();
  at::parallel_for(0, n, kGrain, [&](int64_t n0, int64_t n1) {
    if (wide) return wide_rows(x, w, bias, bias_is_t, y, m, n, k, n0, n1);
    if (m > 1) {
      for (int64_t o = n0; o < n1; ++o)
        block_rows<1, 2, false>(x, w, bias, bias_is_t, y, m, n, k, o);
      return;
    }
    for (int64_t o = n0; o < n1; ++o)
      y[o] = Y(row_dot(w + o * k, x, k) + bias_at<T>(bias, bias_is_t, o));
  });
}

#if defined(ATTNLAB_HAS_DPBF16)
#define ATTNLAB_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

// out[r] = Σ_j w[j] · x[r·k + j] for R bf16 rows of x against one bf16 weight row: 2 chains
// of 16 float32 lanes, each step adding 32 exact products a chain; the tail one at a time
template <int R>
ATTNLAB_BF16_TARGET inline void bf16_rows_dot(const uint16_t* w, const uint16_t* x, int64_t k,
                                              float* out) {
  __m512 a[R][2];
  for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 64 <= k; i += 64) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + i);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(w + i + 32);
    for (int r = 0; r < R; ++r) {
      a[r][0] = _mm512_dpbf16_ps(a[r][0], w0, (__m512bh)_mm512_loadu_si512(x + r * k + i));
      a[r][1] = _mm512_dpbf16_ps(a[r][1], w1, (__m512bh)_mm512_loadu_si512(x + r * k + i + 32));
    }
  }
  for (; i + 32 <= k; i += 32) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + i);
    for (int r = 0; r < R; ++r)
      a[r][0] = _mm512_dpbf16_ps(a[r][0], w0, (__m512bh)_mm512_loadu_si512(x + r * k + i));
  }
  for (int r = 0; r < R; ++r) {
    float tail = 0;
    for (int64_t j = i; j < k; ++j)
      tail += static_cast<float>(c10::BFloat16(w[j], c10::BFloat16::from_bits())) *
              static_cast<float>(c10::BFloat16(x[r * k + j], c10::BFloat16::from_bits()));
    out[r] = _mm512_reduce_add_ps(_mm512_add_ps(a[r][0], a[r][1])) + tail;
  }
}

// y = x · Wᵀ + b for bf16 x (m, k) and W (n, k), 4 rows of x a weight row at a time
template <typename Y>
ATTNLAB_BF16_TARGET void bf16_product(const uint16_t* x, const uint16_t* w, const void* bias,
                                      bool bias_is_t, Y* y, int64_t m, int64_t n, int64_t k) {
  at::parallel_for(0, n, kGrain, [&](int64_t n0, int64_t n1) {
    float sums[4];
    for (int64_t o = n0; o < n1; ++o) {
      const float b = bias_at<c10::BFloat16>(bias, bias_is_t, o);
      for (int64_t r = 0; r < m; r += 4) {
        const int64_t rows = std::min<int64_t>(4, m - r);
        const uint16_t* xr = x + r * k;
        if (rows == 4) bf16_rows_dot<4>(w + o * k, xr, k, sums);
        else if (rows == 3) bf16_rows_dot<3>(w + o * k, xr, k, sums);
        else if (rows == 2) bf16_rows_dot<2>(w + o * k, xr, k, sums);
        else bf16_rows_dot<1>(w + o * k, xr, k, sums);
        for (int64_t j = 0; j < rows; ++j) y[(r + j) * n + o] = Y(sums[j] + b);
      }
    }
  });
}

// Whether this CPU runs vdpbf16ps (the build asked for it; checked again where it runs)
bool dpbf16_cpu() {
  static const bool here = __builtin_cpu_supports("avx512bf16");
  return here;
}

// x rounded to bf16 (a copy, if it is float32), then vdpbf16ps
void run_dpbf16(const at::Tensor& x, const at::Tensor& weight, const void* bias,
                bool bias_is_t, at::Tensor& y) {
  const int64_t m = x.size(0), n = weight.size(0), k = weight.size(1);
  const at::Tensor xb = x.scalar_type() == at::kBFloat16 ? x : x.to(at::kBFloat16);
  const auto* xp = reinterpret_cast<const uint16_t*>(xb.data_ptr<at::BFloat16>());
  const auto* w = reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>());
  if (y.scalar_type() == at::kFloat)
    bf16_product(xp, w, bias, bias_is_t, y.data_ptr<float>(), m, n, k);
  else
    bf16_product(xp, w, bias, bias_is_t, y.data_ptr<at::BFloat16>(), m, n, k);
}
#endif

template <typename T>
void run(const at::Tensor& x, const at::Tensor& weight, const void* bias, bool bias_is_t,
         at::Tensor& y) {
  const int64_t m = x.size(0), n = weight.size(0), k = weight.size(1);
  const T* w = weight.data_ptr<T>();
  if (x.scalar_type() == at::kFloat) {
    product(x.data_ptr<float>(), w, bias, bias_is_t, y.data_ptr<float>(), m, n, k);
    return;
  }
  // 16-bit x: widened once here, on one thread (a few KB for the few rows KernelLinear sends),
  // not once for every output channel
  std::unique_ptr<float[]> wide(new float[m * k]);
  const T* xs = x.data_ptr<T>();
  for (int64_t i = 0; i < m * k; ++i) wide[i] = static_cast<float>(xs[i]);
  product(wide.get(), w, bias, bias_is_t, y.data_ptr<T>(), m, n, k);
}

// The bias's data and whether it is W's 16-bit dtype (else float32; nullptr: none), once the
// operands are checked
const void* checked(const at::Tensor& x, const at::Tensor& weight,
                    const std::optional<at::Tensor>& bias, bool* bias_is_t) {
  const auto wt = weight.scalar_type();
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && weight.is_cpu() &&
                  (wt == at::kFloat || wt == at::kHalf || wt == at::kBFloat16),
              "attnlab float kernel: the weight must be a contiguous (out, in) float32, "
              "float16 or bfloat16 CPU matrix");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.is_cpu() && x.size(1) == weight.size(1) &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == wt),
              "attnlab float kernel: x must be a contiguous (rows, in) CPU matrix with the "
              "weight's width, float32 or the weight's dtype");
  *bias_is_t = false;
  if (!bias.has_value()) return nullptr;
  TORCH_CHECK(bias->is_cpu() && bias->is_contiguous() && bias->dim() == 1 &&
                  bias->size(0) == weight.size(0) &&
                  (bias->scalar_type() == at::kFloat || bias->scalar_type() == wt),
              "attnlab float kernel: the bias must be a contiguous (out,) CPU vector, "
              "float32 or the weight's dtype");
  *bias_is_t = bias->scalar_type() != at::kFloat;
  return bias->data_ptr();
}

at::Tensor float_matmul(const at::Tensor& x, const at::Tensor& weight,
                        const std::optional<at::Tensor>& bias) {
  bool bias_is_t;
  const void* b = checked(x, weight, bias, &bias_is_t);
  at::Tensor y = at::empty({x.size(0), weight.size(0)}, x.options());
  switch (weight.scalar_type()) {
    case at::kFloat: run<float>(x, weight, b, bias_is_t, y); break;
    case at::kHalf: run<at::Half>(x, weight, b, bias_is_t, y); break;
    default: run<at::BFloat16>(x, weight, b, bias_is_t, y); break;
  }
  return y;
}

bool bf16_dot_here() {
#if defined(ATTNLAB_HAS_DPBF16)
  return dpbf16_cpu();
#else
  return false;
#endif
}

at::Tensor bf16_batch_matmul(const at::Tensor& x, const at::Tensor& weight,
                             const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16,
              "attnlab float kernel: bf16_batch_matmul takes a bfloat16 weight");
#if defined(ATTNLAB_HAS_DPBF16)
  if (dpbf16_cpu()) {
    bool bias_is_t;
    const void* b = checked(x, weight, bias, &bias_is_t);
    at::Tensor y = at::empty({x.size(0), weight.size(0)}, x.options());
    run_dpbf16(x, weight, b, bias_is_t, y);
    return y;
  }
#endif
  return float_matmul(x, weight, bias);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(attnlab, m) {
  m.def("float_matmul(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("bf16_batch_matmul(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("bf16_dot_here() -> bool", &bf16_dot_here);
}

TORCH_LIBRARY_IMPL(attnlab, CPU, m) {
  m.impl("float_matmul", &float_matmul);
  m.impl("bf16_batch_matmul", &bf16_batch_matmul);
}
