// attnlab's float matrix product for a few rows (decoding), built with the other CPU kernels by
// attnlab/nn/cpu_kernels.py:
//
//   y[m, n] = Σ_k x[m, k] · W[n, k] (+ b[n])      x float32 (rows, in), W (out, in) row-major
//
// W float32, or float16 / bfloat16 widened to float32 as it is read (half the bytes: a decoded
// token reads every weight once, so bytes are time; the activations and sums stay float32, so
// no CPU needs native 16-bit arithmetic). Each thread takes a block of output channels and
// reads each weight row once for all the rows of x (it stays in L1 between them), with four
// independent sums of 8 lanes; the same order of sums whatever the threads.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <optional>

#include "vectors.h"

namespace {

using attnlab::f8;
using attnlab::lane_sum;
using attnlab::load;
using attnlab::widen;

constexpr int64_t kGrain = 16;  // output channels a thread takes at least

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

template <typename T>
void product(const float* x, const T* w, const float* bias, float* y, int64_t m, int64_t n,
             int64_t k) {
  at::parallel_for(0, n, kGrain, [&](int64_t n0, int64_t n1) {
    for (int64_t o = n0; o < n1; ++o)
      for (int64_t r = 0; r < m; ++r)
        y[r * n + o] = row_dot(w + o * k, x + r * k, k) + (bias ? bias[o] : 0.f);
  });
}

at::Tensor float_matmul(const at::Tensor& x, const at::Tensor& weight,
                        const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.is_cpu(),
              "attnlab float kernel: x must be a contiguous float32 (rows, in) CPU tensor");
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && weight.is_cpu() &&
                  weight.size(1) == x.size(1),
              "attnlab float kernel: the weight must be a contiguous (out, in) CPU matrix "
              "with x's width");
  const int64_t m = x.size(0), n = weight.size(0), k = weight.size(1);
  const float* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->is_cpu() &&
                    bias->dim() == 1 && bias->size(0) == n,
                "attnlab float kernel: the bias must be a float32 (out,) CPU tensor");
    b = bias->data_ptr<float>();
  }
  at::Tensor y = at::empty({m, n}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  switch (weight.scalar_type()) {
    case at::kFloat: product(xp, weight.data_ptr<float>(), b, yp, m, n, k); break;
    case at::kHalf: product(xp, weight.data_ptr<at::Half>(), b, yp, m, n, k); break;
    case at::kBFloat16: product(xp, weight.data_ptr<at::BFloat16>(), b, yp, m, n, k); break;
    default: TORCH_CHECK(false, "attnlab float kernel: weights float32, float16 or bfloat16");
  }
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(attnlab, m) {
  m.def("float_matmul(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(attnlab, CPU, m) { m.impl("float_matmul", &float_matmul); }
