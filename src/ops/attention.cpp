// Attention (ONNX operator doc "Attention", ai.onnx versions 23, 24 and 25): scaled dot-product
// attention with multi-head, grouped-query (GQA) and multi-query heads, 3-D or 4-D inputs, a
// key/value cache (past_key/past_value in, present_key/present_value out), a bool or additive
// attn_mask (its last dim may be shorter than the keys: the rest is masked), is_causal with
// bottom-right alignment, nonpad_kv_seqlen (24+, an external cache), left/right_window_size
// (25), scale (default 1 / sqrt(Dh)), softcap, softmax_precision and qk_matmul_output (mode 0:
// Q K^T scaled, 1: after softcap, 2: plus the bias, 3: the softmax). Shapes and the bias:
// attention.h. Per (batch, query head):
//   S = scale Q K^T;  S = softcap tanh(S / softcap) when softcap > 0;  X = S + bias;
//   P = softmax(X) over the keys, a zero row where every key's bias is -inf;  Y = P V.
// Outputs: Y shaped as Q with Dv for Dh; present_key [B, Hkv, T, Dh]; present_value [B, Hkv,
// T, Dv]; qk_matmul_output [B, Hq, Sq, T].
//
// Element types: Q, K, V, past and outputs of one type (float32, float16, bfloat16, float64;
// a value type other than the query's is not supported). float32 runs both products through
// oneDNN's sgemm, one (batch, head) per thread; float64 plain loops. float16 and bfloat16
// compute in float32 but round to their type where the reference implementation (numpy with
// ml_dtypes) rounds: Q and K scaled by sqrt(scale), each product's result, the softcap and
// bias steps, the softmax's steps in the softmax precision, and P before P V. Deliberate reading
// of the spec: mode 0 is the scaled product before the softcap, as the attribute's doc says.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dispatch.h"
#include "ops/attention.h"
#include "ops/factories.h"
#include "ops/registry.h"

namespace onnxtrain::ops {

namespace {

using namespace attention;

template <class C>
using RowSoftmax = void (*)(C*, int64_t);

template <class C>
RowSoftmax<C> pick_softmax(DataType precision) {
  switch (precision) {
    case DataType::Float16: return softmax_row<C, Float16>;
    case DataType::BFloat16: return softmax_row<C, BFloat16>;
    case DataType::Float64: return softmax_row<C, double>;
    default: return softmax_row<C, float>;
  }
}

// Input i (laid out by `s` with `heads` heads and `seq` rows of `d`) as compute type C: its
// own data when T is C, else a converted copy (scaled by `factor` and rounded to T, for Q and
// K of 16-bit types).
template <class T, class C>
const C* as_compute(const Tensor& t, std::vector<C>& buffer, C factor) {
  if constexpr (std::is_same_v<T, C>) {
    return t.data<T>();
  } else {
    const T* p = t.data<T>();
    buffer.resize(static_cast<size_t>(t.numel()));
    const C f = rt<T>(factor);
    for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = rt<T>(static_cast<C>(static_cast<float>(p[i])) * f);
    return buffer.data();
  }
}

// present = concat(past, new) along the sequence, [B, H, P + S, D], in the output tensor.
template <class T>
void write_present(const Tensor* past, const Tensor& fresh, const Strides& s, const Geometry& g, int64_t D, T* out) {
  const T* pn = fresh.data<T>();
  for (int64_t b = 0; b < g.B; ++b) {
    for (int64_t h = 0; h < g.Hkv; ++h) {
      T* o = out + (b * g.Hkv + h) * g.total * D;
      if (past) {
        const T* pp = past->data<T>() + (b * g.Hkv + h) * g.past * D;
        std::copy(pp, pp + g.past * D, o);
      }
      for (int64_t r = 0; r < g.Skv; ++r) {
        const T* src = pn + s.at(b, h) + r * s.s;
        std::copy(src, src + D, o + (g.past + r) * D);
      }
    }
  }
}

template <class T>
void run_attention(KernelContext& ctx, const Spec& spec) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const Geometry g = read_geometry(ctx, spec, 0);
  const Bias<C> bias(ctx, spec, g, 0);
  const DataType dt = ctx.input(kQ).dtype();
  Tensor& y = ctx.allocate_output(0, dt, g.y_shape);
  // The keys and values of all T positions: the present tensors when there is a past (or they
  // are asked for), else the inputs themselves.
  const bool build_present = g.has_past || ctx.has_output(1) || ctx.has_output(2);
  Strides ks = g.k, vs = g.v;
  const Tensor* k_all = &ctx.input(kK);
  const Tensor* v_all = &ctx.input(kV);
  Tensor present_k, present_v;
  if (build_present) {
    present_k = ctx.allocate_output(1, dt, Shape{g.B, g.Hkv, g.total, g.Dh});
    present_v = ctx.allocate_output(2, dt, Shape{g.B, g.Hkv, g.total, g.Dv});
    write_present<T>(g.has_past ? &ctx.input(kPastKey) : nullptr, ctx.input(kK), g.k, g, g.Dh, present_k.data<T>());
    write_present<T>(g.has_past ? &ctx.input(kPastValue) : nullptr, ctx.input(kV), g.v, g, g.Dv, present_v.data<T>());
    ks = {g.Hkv * g.total * g.Dh, g.total * g.Dh, g.Dh};
    vs = {g.Hkv * g.total * g.Dv, g.total * g.Dv, g.Dv};
    k_all = &present_k;
    v_all = &present_v;
  }
  const bool qk_out = ctx.has_output(3);
  Tensor qk;
  if (qk_out) qk = ctx.allocate_output(3, dt, Shape{g.B, g.Hq, g.Sq, g.total});
  // 16-bit types: Q and K scaled by sqrt(scale) before the product, as the reference does.
  const bool prescale = is_half_v<T>;
  const C root = static_cast<C>(std::sqrt(g.scale));
  std::vector<C> qb, kb, vb;
  const C* pq = as_compute<T, C>(ctx.input(kQ), qb, prescale ? root : C(1));
  const C* pk = as_compute<T, C>(*k_all, kb, prescale ? root : C(1));
  const C* pv = as_compute<T, C>(*v_all, vb, C(1));
  const C alpha = prescale ? C(1) : static_cast<C>(g.scale);
  const RowSoftmax<C> softmax = pick_softmax<C>(spec.softmax_precision == DataType::Undefined ? dt : spec.softmax_precision);
  const C cap = static_cast<C>(spec.softcap);
  const bool capped = spec.softcap > 0;
  const int64_t tasks = g.B * g.Hq, T_ = g.total;
  const int threads = head_threads(tasks);
  // One block when no constraint ends the keys early (nor for a debug output of whole rows).
  const bool blocked = (spec.is_causal || spec.right_window >= 0 || ctx.has_input(kNonpad)) && !qk_out;
  const int64_t block = blocked ? kQueryBlock : std::max<int64_t>(g.Sq, 1);
  // No bias and no softcap: each row needs its softmax alone (made in qk_matmul_output itself for
  // qk_matmul_output_mode 3, below).
  const bool plain = bias.none() && !capped && (!qk_out || spec.qk_mode == 3) && std::is_same_v<T, C>;
  bool gemm_ok = true;
#pragma omp parallel num_threads(threads) reduction(&& : gemm_ok)
  {
    std::vector<C> s(static_cast<size_t>(g.Sq * T_)), brow(static_cast<size_t>(T_)),
        out(std::is_same_v<T, C> ? 0 : static_cast<size_t>(g.Sq * g.Dv));
    const int t = omp_get_thread_num();
    for (int64_t task = tasks * t / threads; task < tasks * (t + 1) / threads; ++task) {
      const int64_t b = task / g.Hq, h = task % g.Hq, hk = h / g.group();
      T* qk_rows = qk_out ? qk.data<T>() + task * g.Sq * T_ : nullptr;
      // Blocks of query rows, each against the keys it can attend (all of them for the debug output).
      for (int64_t i0 = 0; i0 < g.Sq; i0 += block) {
        const int64_t i1 = std::min(g.Sq, i0 + block), rows = i1 - i0;
        const int64_t kn = qk_out ? T_ : bias.key_limit(b, i1 - 1);
        // Where the rows need the softmax alone and qk_matmul_output (mode 3) is asked for (the
        // training graph's P for AttentionGrad), the product is written into that output and the
        // softmax made there: no copy of P. One node at BERT's shapes (batch 32, 128 tokens, 4
        // heads of 64, two threads): 3.01-3.18 ms a run against 3.32-3.49 with the copy (three
        // alternating pairs); BERT's training step: the same within its noise (16.1-18.0 ms of
        // Attention a step against 16.5-17.4).
        C* sb = s.data() + i0 * T_;
        if constexpr (std::is_same_v<T, C>) {
          if (plain && qk_rows) sb = qk_rows + i0 * T_;
        }
        gemm_ok = gemm_ok && gemm(false, true, rows, kn, g.Dh, alpha, pq + g.q.at(b, h) + i0 * g.q.s, g.q.s, pk + ks.at(b, hk), ks.s,
                                  C(0), sb, T_);
        for (int64_t i = i0; i < i1; ++i) {
          C* row = sb + (i - i0) * T_;
          if (plain) {  // no bias, no softcap: the softmax alone (in qk_matmul_output when asked for)
            softmax(row, kn);
            if (spec.nan_to_zero) zero_nans(row, kn);
            continue;
          }
          C* br = brow.data();
          bias.row(br, b, h, i);
          if (qk_rows && spec.qk_mode == 0) {
            for (int64_t j = 0; j < T_; ++j) qk_rows[i * T_ + j] = convert<T>(rt<T>(row[j]));
          }
          if (capped) {
            for (int64_t j = 0; j < kn; ++j) row[j] = rt<T>(rt<T>(std::tanh(rt<T>(rt<T>(row[j]) / rt<T>(cap)))) * rt<T>(cap));
            if (qk_rows && spec.qk_mode == 1) {
              for (int64_t j = 0; j < T_; ++j) qk_rows[i * T_ + j] = convert<T>(row[j]);
            }
          } else if (qk_rows && spec.qk_mode == 1) {
            for (int64_t j = 0; j < T_; ++j) qk_rows[i * T_ + j] = convert<T>(rt<T>(row[j]));
          }
          int64_t masked = 0;  // keys whose bias is -inf
#pragma omp simd reduction(+ : masked)
          for (int64_t j = 0; j < kn; ++j) {
            row[j] = rt<T>(rt<T>(row[j]) + br[j]);
            masked += br[j] == -std::numeric_limits<C>::infinity() ? 1 : 0;
          }
          if (qk_rows && spec.qk_mode == 2) {
            for (int64_t j = 0; j < T_; ++j) qk_rows[i * T_ + j] = convert<T>(row[j]);
          }
          if (masked == kn) {  // every key disallowed: a zero row, not NaN (Softmax's NaN with graph_semantics)
            std::fill(row, row + kn, spec.graph_semantics ? std::numeric_limits<C>::quiet_NaN() : C(0));
          } else {
            softmax(row, kn);
            if constexpr (is_half_v<T>) {
              for (int64_t j = 0; j < kn; ++j) row[j] = rt<T>(row[j]);
            }
          }
          if (spec.nan_to_zero) zero_nans(row, kn);
          if (qk_rows && spec.qk_mode == 3) {
            for (int64_t j = 0; j < T_; ++j) qk_rows[i * T_ + j] = convert<T>(row[j]);
          }
        }
        // float32 and float64 write P V where it goes in Y; 16-bit types through `out`, rounded.
        if constexpr (std::is_same_v<T, C>) {
          gemm_ok = gemm_ok && gemm(false, false, rows, g.Dv, kn, C(1), sb, T_, pv + vs.at(b, hk), vs.s, C(0),
                                    y.data<T>() + g.y.at(b, h) + i0 * g.y.s, g.y.s);
        } else {
          gemm_ok = gemm_ok && gemm(false, false, rows, g.Dv, kn, C(1), sb, T_, pv + vs.at(b, hk), vs.s, C(0),
                                    out.data() + i0 * g.Dv, g.Dv);
        }
      }
      if constexpr (!std::is_same_v<T, C>) {
        T* py = y.data<T>() + g.y.at(b, h);
        for (int64_t i = 0; i < g.Sq; ++i) {
          for (int64_t d = 0; d < g.Dv; ++d) py[i * g.y.s + d] = convert<T>(rt<T>(out[static_cast<size_t>(i * g.Dv + d)]));
        }
      }
    }
  }
  if (!gemm_ok) throw Error("oneDNN's sgemm failed in Attention");
}

}  // namespace

std::unique_ptr<Kernel> make_attention(const KernelInit& init) {
  // ai.onnxtrain.Attention (runtime/fusion.h fuse_attention) states Attention's version.
  const bool internal = init.node().domain == "ai.onnxtrain";
  const Spec spec = parse_spec(init, internal ? static_cast<int>(init.attr_int("version", 23)) : op_version("", "Attention", init.opset()));
  return make_kernel([spec](KernelContext& ctx) {
    const DataType dt = ctx.input(kQ).dtype();
    visit_dtype<FloatTypes>(dt, "input " + ctx.input_name(kQ), [&]<class T>() { run_attention<T>(ctx, spec); });
  });
}

}  // namespace onnxtrain::ops
