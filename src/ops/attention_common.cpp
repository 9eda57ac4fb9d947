// The parts of Attention shared by the forward kernel and AttentionGrad (attention.h).
#include <algorithm>
#include <cmath>
#include <dnnl.h>
#include <string>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/attention.h"
#include "ops/matmul_primitive.h"

namespace onnxtrain::ops::attention {

namespace {

std::string num(int64_t v) { return std::to_string(v); }

// The 4-D reading of one of Q, K, V: (batch, heads, seq, head size) and its strides.
struct Operand {
  int64_t B = 0, H = 0, S = 0, D = 0;
  Strides strides;
};

Operand read_operand(const KernelContext& ctx, int i, int64_t heads_attr, const char* heads_name, bool bshd) {
  const Tensor& t = ctx.input(i);
  Operand o;
  if (bshd) {  // [B, S, H, D] read as [B, H, S, D]
    if (t.rank() != 4) fail("input " + ctx.input_name(i) + " is " + t.description() + ", expected 4-D [batch, sequence, heads, head size] (input_layout BSHD)");
    o = {t.dim(0), t.dim(2), t.dim(1), t.dim(3), {}};
    o.strides = {o.S * o.H * o.D, o.D, o.H * o.D};
    return o;
  }
  if (t.rank() == 4) {
    o = {t.dim(0), t.dim(1), t.dim(2), t.dim(3), {}};
    o.strides = {o.H * o.S * o.D, o.S * o.D, o.D};
    return o;
  }
  if (heads_attr <= 0 || t.dim(2) % heads_attr != 0) {
    fail("input " + ctx.input_name(i) + " is " + t.description() + ": a 3-D input needs the attribute '" + heads_name +
         "' dividing its last dim (" + heads_name + " = " + num(heads_attr) + ")");
  }
  o = {t.dim(0), heads_attr, t.dim(1), t.dim(2) / heads_attr, {}};
  o.strides = {o.S * o.H * o.D, o.D, o.H * o.D};
  return o;
}

}  // namespace

Spec parse_spec(const KernelInit& init, int version) {
  Spec s;
  s.version = version;
  s.is_causal = init.attr_int("is_causal", 0) != 0;
  s.q_num_heads = init.attr_int("q_num_heads", 0);
  s.kv_num_heads = init.attr_int("kv_num_heads", 0);
  s.has_scale = init.has_attr("scale");
  s.scale = init.attr_float("scale", 0.0f);
  s.softcap = init.attr_float("softcap", 0.0f);
  s.qk_mode = static_cast<int>(init.attr_int("qk_matmul_output_mode", 0));
  if (s.qk_mode < 0 || s.qk_mode > 3) fail("attribute 'qk_matmul_output_mode' = " + num(s.qk_mode) + " is not one of 0, 1, 2, 3");
  if (init.has_attr("softmax_precision")) {
    const int64_t p = init.attr_int("softmax_precision", 0);
    if (p != 1 && p != 10 && p != 11 && p != 16) {
      fail("attribute 'softmax_precision' = " + num(p) + " is not one of 1 (float), 10 (float16), 11 (double), 16 (bfloat16)");
    }
    s.softmax_precision = static_cast<DataType>(p);
  }
  if (init.has_attr("input_layout")) {  // ai.onnxtrain.Attention
    const std::string layout = init.attr_string("input_layout", "");
    if (layout != "BSHD") fail("attribute 'input_layout' is '" + layout + "', expected 'BSHD'");
    s.bshd = true;
  }
  if (init.has_attr("output_layout")) {  // ai.onnxtrain.Attention
    const std::string layout = init.attr_string("output_layout", "");
    if (layout != "BSHD") fail("attribute 'output_layout' is '" + layout + "', expected 'BSHD'");
    s.y_bshd = true;
  }
  s.graph_semantics = init.attr_int("graph_semantics", 0) != 0;
  s.nan_to_zero = init.attr_int("nan_to_zero", 0) != 0;
  if (version >= 25) {
    s.left_window = init.attr_int("left_window_size", -1);
    s.right_window = init.attr_int("right_window_size", -1);
    if (s.left_window < -1 || s.right_window < -1) {
      fail("attributes 'left_window_size' = " + num(s.left_window) + " and 'right_window_size' = " + num(s.right_window) +
           " must be -1 (unbounded) or nonnegative");
    }
  }
  return s;
}

Geometry read_geometry(const KernelContext& ctx, const Spec& spec, int base) {
  const Tensor& q = ctx.input(base + kQ);
  const Tensor& k = ctx.input(base + kK);
  const Tensor& v = ctx.input(base + kV);
  if ((q.rank() != 3 && q.rank() != 4) || k.rank() != q.rank() || v.rank() != q.rank()) {
    fail("inputs " + ctx.input_name(base + kQ) + " " + q.description() + ", " + ctx.input_name(base + kK) + " " + k.description() +
         " and " + ctx.input_name(base + kV) + " " + v.description() + " must all be 3-D or all 4-D");
  }
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype()) {
    fail("inputs " + ctx.input_name(base + kK) + " " + k.description() + " and " + ctx.input_name(base + kV) + " " + v.description() +
         " must have the element type of " + ctx.input_name(base + kQ) + " " + q.description() +
         " (a value type other than the query's is not supported)");
  }
  Geometry g;
  g.rank3 = q.rank() == 3;
  if (!g.rank3 && (spec.q_num_heads || spec.kv_num_heads)) {
    const bool agree = (!spec.q_num_heads || spec.q_num_heads == q.dim(1)) && (!spec.kv_num_heads || spec.kv_num_heads == k.dim(1));
    if (spec.version >= 25 || !agree) {
      fail("attributes 'q_num_heads' and 'kv_num_heads' are for 3-D inputs; input " + ctx.input_name(base + kQ) + " is " + q.description());
    }
  }
  const Operand oq = read_operand(ctx, base + kQ, spec.q_num_heads, "q_num_heads", spec.bshd);
  const Operand ok = read_operand(ctx, base + kK, spec.kv_num_heads, "kv_num_heads", spec.bshd);
  const Operand ov = read_operand(ctx, base + kV, spec.kv_num_heads, "kv_num_heads", spec.bshd);
  if (ok.B != oq.B || ov.B != oq.B || ok.H != ov.H || ok.S != ov.S || ok.D != oq.D) {
    fail("inputs " + ctx.input_name(base + kQ) + " " + q.description() + ", " + ctx.input_name(base + kK) + " " + k.description() +
         " and " + ctx.input_name(base + kV) + " " + v.description() +
         " do not agree (batch, key/value heads and sequence, query and key head size)");
  }
  if (ok.H == 0 || oq.H % ok.H != 0) {
    fail("the " + num(oq.H) + " query heads of " + ctx.input_name(base + kQ) + " are not a multiple of the " + num(ok.H) +
         " key/value heads of " + ctx.input_name(base + kK));
  }
  g.B = oq.B, g.Hq = oq.H, g.Hkv = ok.H, g.Sq = oq.S, g.Skv = ok.S, g.Dh = oq.D, g.Dv = ov.D;
  g.q = oq.strides, g.k = ok.strides, g.v = ov.strides;
  g.y = g.rank3 || spec.y_bshd ? Strides{g.Sq * g.Hq * g.Dv, g.Dv, g.Hq * g.Dv} : Strides{g.Hq * g.Sq * g.Dv, g.Sq * g.Dv, g.Dv};
  g.y_shape = g.rank3 ? Shape{g.B, g.Sq, g.Hq * g.Dv} : spec.y_bshd ? Shape{g.B, g.Sq, g.Hq, g.Dv} : Shape{g.B, g.Hq, g.Sq, g.Dv};
  const bool pk = ctx.has_input(base + kPastKey), pv = ctx.has_input(base + kPastValue);
  if (spec.bshd && (pk || ctx.has_input(base + kNonpad))) {
    fail("input_layout BSHD (ai.onnxtrain.Attention) takes no past_key, past_value or nonpad_kv_seqlen");
  }
  if (pk != pv) fail("past_key and past_value must be given together (input " + ctx.input_name(base + (pk ? kPastKey : kPastValue)) + " alone)");
  g.has_past = pk;
  if (pk) {
    const Tensor& p = ctx.input(base + kPastKey);
    const Tensor& pvt = ctx.input(base + kPastValue);
    g.past = p.rank() == 4 ? p.dim(2) : -1;
    if (!(p.shape() == Shape{g.B, g.Hkv, g.past, g.Dh}) || !(pvt.shape() == Shape{g.B, g.Hkv, g.past, g.Dv}) ||
        p.dtype() != q.dtype() || pvt.dtype() != q.dtype()) {
      fail("inputs " + ctx.input_name(base + kPastKey) + " " + p.description() + " and " + ctx.input_name(base + kPastValue) + " " +
           pvt.description() + " must be " + std::string(dtype_name(q.dtype())) + " [" + num(g.B) + ", " + num(g.Hkv) + ", past, " + num(g.Dh) +
           "] and [" + num(g.B) + ", " + num(g.Hkv) + ", past, " + num(g.Dv) + "]");
    }
  }
  g.total = g.past + g.Skv;
  if (ctx.has_input(base + kNonpad) && pk) {
    fail("input " + ctx.input_name(base + kNonpad) + " (nonpad_kv_seqlen, an external cache) cannot be combined with past_key");
  }
  g.scale = spec.has_scale ? spec.scale : 1.0 / std::sqrt(static_cast<double>(g.Dh));
  return g;
}

template <class C>
Bias<C>::Bias(const KernelContext& ctx, const Spec& spec, const Geometry& g, int base)
    : causal_(spec.is_causal), left_(spec.left_window), right_(spec.right_window), total_(g.total) {
  offset_.assign(static_cast<size_t>(g.B), g.past);
  if (ctx.has_input(base + kNonpad)) {
    const Tensor& n = ctx.input(base + kNonpad);
    if (n.dtype() != DataType::Int64 || !(n.shape() == Shape{g.B})) {
      fail("input " + ctx.input_name(base + kNonpad) + " is " + n.description() + ", expected int64 [" + num(g.B) + "]");
    }
    nonpad_ = n.to_int64_vector("input " + ctx.input_name(base + kNonpad));
    for (size_t b = 0; b < nonpad_.size(); ++b) {
      if (nonpad_[b] < 0 || nonpad_[b] > g.total) {
        fail("input " + ctx.input_name(base + kNonpad) + " holds " + num(nonpad_[b]) + ", outside [0, " + num(g.total) +
             "] (the keys of " + ctx.input_name(base + kK) + ")");
      }
      offset_[b] = nonpad_[b] - g.Sq;
    }
  }
  if (!ctx.has_input(base + kMask)) return;
  const Tensor& m = ctx.input(base + kMask);
  const Shape full{g.B, g.Hq, g.Sq, g.total};
  if (spec.graph_semantics) {  // added to the scores as by Add: float, every dim matching or 1
    const int64_t last = m.rank() >= 1 ? m.shape()[m.rank() - 1] : 0;
    if (!is_floating(m.dtype()) || (last != g.total && last != 1)) {
      fail("input " + ctx.input_name(base + kMask) + " (the scores' addend) is " + m.description() + ", which Add cannot broadcast to " +
           full.to_string() + " (a float tensor whose dims match or are 1)");
    }
    broadcast_keys_ = last == 1 && g.total != 1;
  }
  bool ok = m.rank() >= 1 && m.rank() <= 4 && m.shape()[m.rank() - 1] <= g.total;
  int64_t strides[4] = {0, 0, 0, 1};
  int64_t stride = m.rank() >= 1 ? m.shape()[m.rank() - 1] : 1;
  for (size_t k = 1; ok && k < m.rank(); ++k) {  // dims before the last, right-aligned to [B, Hq, Sq]
    const int64_t dim = m.shape()[m.rank() - 1 - k];
    ok = dim == full[3 - k] || dim == 1;
    strides[3 - k] = dim == 1 ? 0 : stride;
    stride *= dim;
  }
  if (!ok) {
    fail("input " + ctx.input_name(base + kMask) + " (attn_mask) is " + m.description() + ", which does not broadcast to " +
         full.to_string() + " (its last dim may be shorter than the " + num(g.total) + " keys, not longer)");
  }
  has_mask_ = true;
  mb_ = strides[0], mh_ = strides[1], mi_ = strides[2];
  mask_len_ = m.shape()[m.rank() - 1];
  mask_.resize(static_cast<size_t>(m.numel()));
  visit_dtype<AllTypes>(m.dtype(), "input " + ctx.input_name(base + kMask), [&]<class M>() {
    const M* p = m.data<M>();
    for (size_t i = 0; i < mask_.size(); ++i) {
      if constexpr (std::is_same_v<M, bool>) {
        mask_[i] = p[i] ? C(0) : kNegInf;
      } else {
        mask_[i] = static_cast<C>(convert<double>(p[i]));
      }
    }
  });
}

template <class C>
void Bias<C>::row(C* out, int64_t b, int64_t h, int64_t i) const {
  if (broadcast_keys_) {
    std::fill(out, out + total_, mask_[static_cast<size_t>(mask_offset(b, h, i))]);
  } else if (has_mask_) {
    const C* m = mask_.data() + mask_offset(b, h, i);
    for (int64_t j = 0; j < mask_len_; ++j) out[j] = m[j];
    for (int64_t j = mask_len_; j < total_; ++j) out[j] = kNegInf;
  } else {
    std::fill(out, out + total_, C(0));
  }
  // Each constraint adds -inf where it disallows a key (so +inf from a float mask gives NaN,
  // as the spec's sum of biases does).
  const int64_t p = i + offset_[static_cast<size_t>(b)];  // the query's absolute position
  if (causal_) {
    for (int64_t j = std::max<int64_t>(0, p + 1); j < total_; ++j) out[j] += kNegInf;
  }
  if (left_ >= 0) {
    for (int64_t j = 0; j < std::min(total_, p - left_); ++j) out[j] += kNegInf;
  }
  if (right_ >= 0) {
    for (int64_t j = std::max<int64_t>(0, p + right_ + 1); j < total_; ++j) out[j] += kNegInf;
  }
  if (!nonpad_.empty()) {
    for (int64_t j = nonpad_[static_cast<size_t>(b)]; j < total_; ++j) out[j] += kNegInf;
  }
}

template <class C>
int64_t Bias<C>::key_limit(int64_t b, int64_t i) const {
  int64_t limit = total_;
  const int64_t p = i + offset_[static_cast<size_t>(b)];
  if (causal_) limit = std::min(limit, p + 1);
  if (right_ >= 0) limit = std::min(limit, p + right_ + 1);
  if (!nonpad_.empty()) limit = std::min(limit, nonpad_[static_cast<size_t>(b)]);
  return std::max<int64_t>(limit, 0);
}

template class Bias<float>;
template class Bias<double>;

bool gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (M == 0 || N == 0) return true;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < N; ++j) c[i * ldc + j] = beta == 0 ? 0.0f : beta * c[i * ldc + j];
    }
    return true;
  }
  return row_major_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, a, lda, b, ldb, beta, c, ldc) ==
         dnnl_success;
}

bool gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) {
    double* ci = c + i * ldc;
    for (int64_t j = 0; j < N; ++j) ci[j] = beta == 0 ? 0.0 : beta * ci[j];
    for (int64_t k = 0; k < K; ++k) {
      const double av = alpha * (trans_a ? a[k * lda + i] : a[i * lda + k]);
      if (trans_b) {
        for (int64_t j = 0; j < N; ++j) ci[j] += av * b[j * ldb + k];
      } else {
        const double* bk = b + k * ldb;
        for (int64_t j = 0; j < N; ++j) ci[j] += av * bk[j];
      }
    }
  }
  return true;
}

int head_threads(int64_t tasks) {
  const int threads = available_threads();
  return tasks >= threads ? threads : 1;
}

}  // namespace onnxtrain::ops::attention
