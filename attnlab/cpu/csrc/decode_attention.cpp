// attnlab's attention for one query a row against a key/value cache (decoding), built with the
// integer kernels by attnlab/cpu/kernels.py. Over the slots a row's mask allows, with s the
// scale:
//
//   out[b, h] = Σ_j p_j · v[b, h / r, j],   p_j = exp(s · q[b, h] · k[b, h / r, j] − m) / Z
//
// (r = heads / kv_heads query heads per key/value head; m the largest score, Z the sum of the
// exponentials). It reads only the slots up to the last allowed one: a static cache of 512
// slots a fifth full costs a fifth of its bytes, where PyTorch's fused kernel reads them all
// (and the masked slots among them are skipped too).
// k and v are float32, bfloat16 or float16 (one dtype), q that dtype or float32 (float32
// activations over a 16-bit cache); 16-bit values are widened as they are read (a bf16 cache is
// half the bytes), the scores, softmax and sums are float32, and the output, in q's dtype, is
// rounded to it once.
// A row with no allowed slot gives zeros (attnlab's convention for fully masked rows); a NaN
// score gives NaNs, as the softmax would.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "vectors.h"

namespace {

void check(bool ok, const char* what) { TORCH_CHECK(ok, "attnlab decode attention: ", what); }

using attnlab::f8;
using attnlab::lane_sum;
using attnlab::load;
using attnlab::store;
using attnlab::widen;

// Σ_i a[i] · b[i], a in float32 (the query), b as stored (a key row)
template <typename T>
inline float dot(const float* a, const T* b, int64_t n) {
  f8 lanes[2] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    lanes[0] += load(a + i) * widen(b + i);
    lanes[1] += load(a + i + 8) * widen(b + i + 8);
  }
  for (; i + 8 <= n; i += 8) lanes[0] += load(a + i) * widen(b + i);
  float rest = 0;
  for (; i < n; ++i) rest += a[i] * static_cast<float>(b[i]);
  return lane_sum(lanes[0] + lanes[1]) + rest;
}

// out[0 … n) = Σ_i p[i] · v[slot[i]][0 … n) in float32: the sum kept in registers when n is a
// known width (N > 0; 64 and 128, the usual head widths), in memory otherwise
template <int N, typename T>
void weighted_sum(const float* p, const int64_t* slot, int64_t count, const T* v,
                  int64_t stride, float* out, int64_t n) {
  if constexpr (N > 0) {
    f8 acc[N / 8] = {};
    for (int64_t i = 0; i < count; ++i) {
      const T* row = v + slot[i] * stride;
      for (int u = 0; u < N / 8; ++u) acc[u] += p[i] * widen(row + 8 * u);
    }
    for (int u = 0; u < N / 8; ++u) store(out + 8 * u, acc[u]);
  } else {  // 8 lanes at a time, then one at a time
    std::fill(out, out + n, 0.f);
    for (int64_t i = 0; i < count; ++i) {
      const T* row = v + slot[i] * stride;
      int64_t e = 0;
      for (; e + 8 <= n; e += 8) store(out + e, load(out + e) + p[i] * widen(row + e));
      for (; e < n; ++e) out[e] += p[i] * static_cast<float>(row[e]);
    }
  }
}

// The attention of every (row, head) for keys and values stored as T and queries and output
// as Q (T, or float); the sums and the softmax in float32, the output rounded to Q once
template <typename Q, typename T>
void attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const bool* allowed,
            int64_t mask_rows, float s, at::Tensor& out) {
  const int64_t batch = q.size(0), heads = q.size(1), kv_heads = k.size(1);
  const int64_t slots = k.size(2), d = q.size(3), dv = v.size(3);
  const Q* qp = q.data_ptr<Q>();
  const T *kp = k.data_ptr<T>(), *vp = v.data_ptr<T>();
  Q* op = out.data_ptr<Q>();
  const int64_t group = heads / kv_heads;
  const int64_t qb = q.stride(0), qh = q.stride(1), kb = k.stride(0), kh = k.stride(1);
  const int64_t kj = k.stride(2), vb = v.stride(0), vh = v.stride(1), vj = v.stride(2);
  auto sum = dv == 64    ? weighted_sum<64, T>
             : dv == 128 ? weighted_sum<128, T>
                         : weighted_sum<0, T>;
  constexpr bool plain = std::is_same_v<Q, float>;  // else: q widened, the output rounded
  at::parallel_for(0, batch * heads, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> p(slots), query(plain ? 0 : d), result(plain ? 0 : dv);
    std::vector<int64_t> slot(slots);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / heads, h = t % heads, g = h / group;
      const Q* qr = qp + b * qb + h * qh;
      const T* kr = kp + b * kb + g * kh;
      const T* vr = vp + b * vb + g * vh;
      const bool* row = allowed == nullptr ? nullptr : allowed + (mask_rows == 1 ? 0 : b) * slots;
      int64_t count = 0;  // the allowed slots, in order
      for (int64_t j = 0; j < slots; ++j)
        if (row == nullptr || row[j]) slot[count++] = j;
      Q* o = op + t * dv;
      if (count == 0) {  // nothing to attend to: zeros
        std::fill(o, o + dv, Q(0.f));
        continue;
      }
      const float* qf;
      if constexpr (plain) {
        qf = qr;
      } else {
        for (int64_t e = 0; e < d; ++e) query[e] = static_cast<float>(qr[e]);
        qf = query.data();
      }
      for (int64_t i = 0; i < count; ++i) p[i] = s * dot(qf, kr + slot[i] * kj, d);
      float top = p[0];
      for (int64_t i = 1; i < count; ++i) top = p[i] > top ? p[i] : top;
      float total = 0;
      for (int64_t i = 0; i < count; ++i) total += p[i] = std::exp(p[i] - top);
      const float inverse = 1 / total;
      for (int64_t i = 0; i < count; ++i) p[i] *= inverse;
      if constexpr (plain) {
        sum(p.data(), slot.data(), count, vr, vj, o, dv);
      } else {
        sum(p.data(), slot.data(), count, vr, vj, result.data(), dv);
        for (int64_t e = 0; e < dv; ++e) o[e] = static_cast<Q>(result[e]);
      }
    }
  });
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::optional<at::Tensor>& mask, double scale) {
  const at::ScalarType dtype = k.scalar_type();
  check(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
        "k and v must be float32, bfloat16 or float16");
  check(q.scalar_type() == dtype || q.scalar_type() == at::kFloat,
        "q must be k's dtype or float32");
  for (const at::Tensor* t : {&q, &k, &v})
    check(t->dim() == 4 && (t == &q || t->scalar_type() == dtype) && t->is_cpu() &&
              t->stride(3) == 1,
          "q, k and v must be (batch, heads, len, dim) CPU tensors, k and v of one dtype, "
          "rows contiguous");
  const int64_t batch = q.size(0), heads = q.size(1), kv_heads = k.size(1);
  const int64_t slots = k.size(2), d = q.size(3), dv = v.size(3);
  check(q.size(2) == 1, "one query a row");
  check(k.size(0) == batch && v.size(0) == batch && v.size(1) == kv_heads &&
            v.size(2) == slots && k.size(3) == d,
        "k and v must be (batch, kv_heads, slots, dim) with q's batch and width");
  check(kv_heads > 0 && heads % kv_heads == 0, "kv_heads must divide heads");
  const bool* allowed = nullptr;
  int64_t mask_rows = 0;
  if (mask.has_value()) {
    check(mask->scalar_type() == at::kBool && mask->dim() == 2 && mask->is_contiguous() &&
              mask->size(1) == slots && (mask->size(0) == 1 || mask->size(0) == batch),
          "mask must be a contiguous bool (batch or 1, slots) tensor");
    allowed = mask->data_ptr<bool>();
    mask_rows = mask->size(0);
  }
  at::Tensor out = at::empty({batch, heads, 1, dv}, q.options());
  const float s = static_cast<float>(scale);
  const bool wide = q.scalar_type() == at::kFloat;  // float32 queries over a 16-bit cache
  switch (dtype) {
    case at::kFloat: attend<float, float>(q, k, v, allowed, mask_rows, s, out); break;
    case at::kBFloat16:
      if (wide) attend<float, c10::BFloat16>(q, k, v, allowed, mask_rows, s, out);
      else attend<c10::BFloat16, c10::BFloat16>(q, k, v, allowed, mask_rows, s, out);
      break;
    default:
      if (wide) attend<float, c10::Half>(q, k, v, allowed, mask_rows, s, out);
      else attend<c10::Half, c10::Half>(q, k, v, allowed, mask_rows, s, out);
      break;
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(attnlab, m) {
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(attnlab, CPU, m) { m.impl("decode_attention", &decode_attention); }
