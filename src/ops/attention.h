// What the Attention kernel (attention.cpp: ai.onnx Attention-23/24/25) and its backward op
// (attention_grad.cpp: ai.onnxtrain.AttentionGrad) share: the attributes, the reading of the
// input shapes, the additive bias of each score (mask, causal frontier, sliding window,
// padding) and the small GEMM wrapper over oneDNN's sgemm.
//
// Shapes (ONNX operator doc "Attention"): Q [B, Hq, Sq, Dh] with K [B, Hkv, Skv, Dh] and V
// [B, Hkv, Skv, Dv], or the 3-D forms Q [B, Sq, Hq * Dh], K [B, Skv, Hkv * Dh], V [B, Skv,
// Hkv * Dv] with the attributes q_num_heads and kv_num_heads. past_key [B, Hkv, P, Dh] and
// past_value [B, Hkv, P, Dv] are prepended to K and V along the sequence (the present
// outputs); T = P + Skv keys in all. Query head h reads key/value head h / (Hq / Hkv) (GQA).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "ops/kernel.h"

namespace onnxtrain::ops::attention {

// Input positions of the forward op; AttentionGrad takes dY first and these shifted by one.
enum Input : int { kQ = 0, kK, kV, kMask, kPastKey, kPastValue, kNonpad };

struct Spec {
  int version = 23;  // 23, 24 (nonpad_kv_seqlen), 25 (sliding window)
  bool is_causal = false;
  int64_t q_num_heads = 0, kv_num_heads = 0;  // 0: absent
  bool has_scale = false;
  double scale = 0;
  double softcap = 0;  // applied when > 0
  DataType softmax_precision = DataType::Undefined;  // Undefined: the inputs' type
  int qk_mode = 0;
  int64_t left_window = -1, right_window = -1;  // -1: unbounded (version 25)
  // ai.onnxtrain.Attention (runtime/fusion.h fuse_attention: the MatMul-Softmax-MatMul pattern
  // exporters write) only, attribute input_layout = "BSHD": Q, K and V are 4-D [batch,
  // sequence, heads, head size] (the head split's Reshape output) and read as Transpose(.,
  // [0, 2, 1, 3]), the [batch, heads, sequence, head size] of the 4-D form; Y is that 4-D form.
  // dQ, dK and dV are written in the inputs' layout.
  bool bshd = false;
  // ai.onnxtrain.Attention only, attribute output_layout = "BSHD": Y (and AttentionGrad's dY) is
  // 4-D [batch, sequence, heads, head size], the Transpose(., [0, 2, 1, 3]) of the 4-D form, which
  // the exporters' head merge writes before its Reshape (fuse_attention drops that Transpose).
  bool y_bshd = false;
  // ai.onnxtrain.Attention only: the unfused graph's semantics where Attention's differ. The
  // mask is a float tensor added to the scores as by Add (a last dim of 1 broadcasts over the
  // keys; any other dim must match), and a row the mask disallows entirely (-inf everywhere)
  // softmaxes to NaN, as Softmax does, rather than to zeros.
  bool graph_semantics = false;
  // ai.onnxtrain.Attention only, attribute nan_to_zero = 1: each NaN of P becomes 0, as the
  // Where(IsNaN(P), 0, P) PyTorch's export writes after the Softmax does (a row the mask
  // disallows entirely then gives zeros).
  bool nan_to_zero = false;
};

// row[j] = 0 where it is NaN, j < n.
template <class C>
void zero_nans(C* row, int64_t n) {
  for (int64_t j = 0; j < n; ++j) row[j] = row[j] != row[j] ? C(0) : row[j];
}
// The attributes of an Attention node (or of an AttentionGrad node, which copies them).
Spec parse_spec(const KernelInit& init, int version);

// Element (b, h, s, d) of a tensor laid out as Q, K or V is at b * b_stride + h * h_stride +
// s * s_stride + d.
struct Strides {
  int64_t b = 0, h = 0, s = 0;
  int64_t at(int64_t b_, int64_t h_) const { return b_ * b + h_ * h; }
};

struct Geometry {
  int64_t B = 0, Hq = 0, Hkv = 0, Sq = 0, Skv = 0, past = 0, total = 0, Dh = 0, Dv = 0;
  bool rank3 = false;
  bool has_past = false;
  double scale = 0;  // the factor applied to Q K^T
  Strides q, k, v;   // of the inputs Q, K, V (new tokens only)
  Strides y;         // of Y (and dQ-like tensors shaped as Q but with Dv)
  Shape y_shape;     // Y's shape
  int64_t group() const { return Hq / Hkv; }
};
// Validates the inputs at `base + kQ`.. (base 0: Attention, 1: AttentionGrad) against the spec;
// errors name the tensors.
Geometry read_geometry(const KernelContext& ctx, const Spec& spec, int base);

// The additive bias of each score, per (b, h, i) row of keys j < total:
//   mask value (bool: 0 / -inf; keys beyond a shorter mask's last dim: -inf)
//   + (-inf where is_causal and j > i + offset[b])
//   + (-inf outside the sliding window around i + offset[b])
//   + (-inf where j >= nonpad_kv_seqlen[b]),
// offset[b] = past length with past_key, nonpad_kv_seqlen[b] - Sq with that input, else 0.
template <class C>
class Bias {
 public:
  Bias(const KernelContext& ctx, const Spec& spec, const Geometry& g, int base);
  // out[j] for j < total.
  void row(C* out, int64_t b, int64_t h, int64_t i) const;
  // Keys j >= key_limit(b, i) are disallowed (bias -inf) for query row i of batch b, whatever
  // the head, by the causal frontier, the right window or nonpad_kv_seqlen; total without them.
  int64_t key_limit(int64_t b, int64_t i) const;
  bool has_mask() const { return has_mask_; }
  // Every bias is 0 (no mask, causal frontier, window or nonpad_kv_seqlen): rows need none.
  bool none() const { return !has_mask_ && !causal_ && left_ < 0 && right_ < 0 && nonpad_.empty(); }
  // The mask's last dim is 1 and broadcasts over the keys (graph_semantics).
  bool mask_broadcasts_keys() const { return broadcast_keys_; }
  // Mask geometry: element (b, h, i, j) of the mask, broadcast (stride 0) where its dim is 1.
  int64_t mask_offset(int64_t b, int64_t h, int64_t i) const { return b * mb_ + h * mh_ + i * mi_; }
  int64_t mask_len() const { return mask_len_; }

 private:
  static constexpr C kNegInf = -std::numeric_limits<C>::infinity();
  std::vector<C> mask_;
  int64_t mb_ = 0, mh_ = 0, mi_ = 0, mask_len_ = 0;
  bool has_mask_ = false;
  bool broadcast_keys_ = false;
  bool causal_ = false;
  int64_t left_ = -1, right_ = -1, total_ = 0;
  std::vector<int64_t> offset_, nonpad_;  // per batch; nonpad_ empty without that input
};

// Row-major C [M, N] = alpha A' B' + beta C with A' = A^T when trans_a (A stored [K, M]), B' =
// B^T when trans_b (B stored [N, K]); leading dims lda, ldb, ldc. float runs oneDNN's sgemm
// (never throws: returns false on a oneDNN failure, so callers inside OpenMP regions report
// it afterwards), double plain loops.
bool gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
bool gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc);

// e^x for x <= 0 (a score minus its row's maximum), -inf or NaN, in float, written so that
// loops over it vectorize: x = n ln2 + r with |r| <= ln2 / 2 (n rounded by adding 1.5 * 2^23;
// ln2 split in two so n ln2 is exact), e^r by its Taylor polynomial to r^7 (truncation error
// below 6e-9), 2^n added to the exponent bits. x < -87 (e^x below float's normal range) gives
// 0 and NaN stays NaN. Relative error about 1e-7.
inline float exp_nonpositive(float x) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = x * 1.4426950408889634f + kMagic;  // x / ln2 + magic
  const float n = t - kMagic;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // ln2 = 0.693359375 - 2.12194440e-4
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const uint32_t y = std::bit_cast<uint32_t>(p) + (static_cast<uint32_t>(static_cast<int32_t>(n)) << 23);
  // Selections by integer masks rather than branches, so that loops over this vectorize.
  const uint32_t bits = std::bit_cast<uint32_t>(x), magnitude = bits & 0x7fffffffu;
  const uint32_t nan = 0u - static_cast<uint32_t>(magnitude > 0x7f800000u);
  const uint32_t zero = 0u - static_cast<uint32_t>(magnitude > 0x42ae0000u);  // |x| > 87 (or NaN)
  return std::bit_cast<float>((y & ~zero) | (bits & nan));
}

// v rounded to T where T is a 16-bit float (the reference rounds after every numpy op).
template <class T, class C>
C rt(C v) {
  if constexpr (is_half_v<T>) {
    return static_cast<C>(static_cast<float>(T(static_cast<float>(v))));
  } else {
    return v;
  }
}

// Softmax of one row in place, computed in precision P (rounded to P after each step when P is
// a 16-bit float). A row whose maximum is -inf softmaxes to zeros; a NaN makes the sum, and so
// the row, NaN (as the reference's maximum would).
template <class C, class P>
void softmax_row(C* x, int64_t n) {
  using W = std::conditional_t<std::is_same_v<P, double>, double, float>;
  W m = -std::numeric_limits<W>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < n; ++j) m = std::max(m, rt<P>(static_cast<W>(x[j])));
  const W safe = m == -std::numeric_limits<W>::infinity() ? W(0) : m;
  W sum = 0;
  if constexpr (std::is_same_v<P, float>) {  // the fast path: no rounding, a vectorized exp
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) {
      const float e = exp_nonpositive(static_cast<float>(x[j]) - safe);
      x[j] = static_cast<C>(e);
      sum += e;
    }
  } else {
    for (int64_t j = 0; j < n; ++j) {
      const W e = rt<P>(std::exp(rt<P>(rt<P>(static_cast<W>(x[j])) - safe)));
      x[j] = static_cast<C>(e);
      // bfloat16 sums round after each add (ml_dtypes' reduction); float16 sums in float (numpy).
      sum = std::is_same_v<P, BFloat16> ? rt<P>(sum + e) : sum + e;
    }
  }
  sum = rt<P>(sum);
  const W inv = W(1) / (sum == W(0) ? W(1) : sum);
  if constexpr (std::is_same_v<P, float>) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) x[j] = static_cast<C>(static_cast<W>(x[j]) * inv);
  } else {
    for (int64_t j = 0; j < n; ++j) x[j] = static_cast<C>(rt<P>(static_cast<W>(x[j]) / sum));
  }
}

// Query rows per block when the keys a block needs end early (key_limit): each block multiplies
// only with the keys it can attend (causal attention: about 5/8 of the work at 256 queries).
// 64 rows: on one core, 32 made the products too small to run fast, 128 skipped too little.
inline constexpr int64_t kQueryBlock = 64;

// The number of threads to run `tasks` independent heads on: all when there are enough tasks
// (each then calls sgemm single-threaded), else 1 (sgemm itself is parallel).
int head_threads(int64_t tasks);

}  // namespace onnxtrain::ops::attention
