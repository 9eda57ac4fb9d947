// The recurrent sequence mixers of Gated DeltaNet and Mamba models (ONNX operator docs,
// ai.onnx version 27): LinearAttention and CausalConvWithState.
//
// LinearAttention: query [B, T, Hq * dk], key [B, T, Hkv * dk], value [B, T, Hkv * dv] (the
//   attributes q_num_heads and kv_num_heads are required, Hq a multiple of Hkv); a state S
//   [dk, dv] per (batch, key/value head), from past_state [B, Hkv, dk, dv] or zeros. For each
//   token t in order, with k_t, v_t, q_t the head's vectors:
//     gated / gated_delta:  S = exp(g_t) S     (decay g: [B, T, Hkv] per head or [B, T, Hkv * dk]
//                                              per row of S)
//     delta / gated_delta:  u_t = beta_t (v_t - S^T k_t)   (beta [B, T, Hkv] or [B, T, 1])
//     linear / gated:       u_t = v_t
//     S = S + k_t u_t^T;  output_t = scale q_t^T S for every query head of the group
//   scale: the attribute, or 1 / sqrt(dk) when 0. Outputs: output [B, T, Hq * dv] (the query's
//   type) and present_state = S after the last token (past_state's type, else the query's).
//   decay must be given exactly for the gated rules and beta for the delta rules. chunk_size is a
//   tuning hint of the spec; the recurrence runs token by token (exact). Computes in float32
//   (float64 for float64 data, accepted beyond the schema's types so that the gradient rule is
//   checked by finite differences in float64). Backward op LinearAttentionGrad: linear_attention_grad.cpp.
// CausalConvWithState: input [B, C, L], weight [C, 1, k], bias [C], past_state [B, C, k - 1]
//   (zeros when omitted): a depthwise convolution of concat(past_state, input) along the
//   sequence, output[b, c, t] = bias[c] + sum_m weight[c, 0, m] padded[b, c, t + m], then
//   activation 'silu' (alias 'swish'): x sigmoid(x), or 'none'; present_state = the last k - 1
//   positions of the padded sequence. Computes in float32 (float64 for float64 data, accepted
//   beyond the schema's types so that its gradient rule is checked by finite differences in float64).
//   Its backward op CausalConvWithStateGrad: linear_attention_grad.cpp.
#include <cmath>
#include <string>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/factories.h"
#include "ops/linear_attention.h"

namespace onnxtrain::ops {

namespace linear_attention {

namespace {

std::string num(int64_t v) { return std::to_string(v); }

void require_rank3(const KernelContext& ctx, int i, int64_t B, int64_t T, int64_t last, const char* what) {
  const Tensor& t = ctx.input(i);
  if (t.rank() != 3 || t.dim(0) != B || t.dim(1) != T || (last >= 0 && t.dim(2) != last)) {
    fail("input " + ctx.input_name(i) + " (" + what + ") is " + t.description() + ", expected [" + num(B) + ", " + num(T) + ", " +
         (last >= 0 ? num(last) : std::string("heads * head size")) + "]");
  }
}

}  // namespace

Spec parse_spec(const KernelInit& init) {
  Spec spec;
  spec.q_heads = init.required_int("q_num_heads");
  spec.kv_heads = init.required_int("kv_num_heads");
  if (spec.q_heads <= 0 || spec.kv_heads <= 0 || spec.q_heads % spec.kv_heads != 0) {
    fail("attribute 'q_num_heads' = " + num(spec.q_heads) + " must be a positive multiple of 'kv_num_heads' = " + num(spec.kv_heads));
  }
  spec.scale = init.attr_float("scale", 0.0f);
  const std::string rule = init.attr_string("update_rule", "gated_delta");
  if (rule != "linear" && rule != "gated" && rule != "delta" && rule != "gated_delta") {
    fail("attribute 'update_rule' = '" + rule + "' is not one of 'linear', 'gated', 'delta', 'gated_delta'");
  }
  spec.gating = rule == "gated" || rule == "gated_delta";
  spec.delta = rule == "delta" || rule == "gated_delta";
  return spec;
}

Geometry read_geometry(const KernelContext& ctx, const Spec& spec, int base) {
  const Tensor& q = ctx.input(base);
  if (q.rank() != 3 || q.dim(2) % spec.q_heads != 0) {
    fail("input " + ctx.input_name(base) + " (query) is " + q.description() + ", expected [B, T, q_num_heads * dk] with q_num_heads = " +
         num(spec.q_heads));
  }
  Geometry g;
  g.B = q.dim(0), g.T = q.dim(1), g.Hq = spec.q_heads, g.Hkv = spec.kv_heads, g.dk = q.dim(2) / g.Hq;
  require_rank3(ctx, base + 1, g.B, g.T, g.Hkv * g.dk, "key");
  require_rank3(ctx, base + 2, g.B, g.T, -1, "value");
  const Tensor& v = ctx.input(base + 2);
  if (v.dim(2) % g.Hkv != 0) fail("input " + ctx.input_name(base + 2) + " (value) is " + v.description() + ": its last dim is not a multiple of kv_num_heads");
  g.dv = v.dim(2) / g.Hkv;
  for (int i = base + 1; i <= base + 2; ++i) {
    if (ctx.input(i).dtype() != q.dtype()) fail("input " + ctx.input_name(i) + " is " + ctx.input(i).description() + ", expected the query's type");
  }
  g.has_decay = ctx.has_input(base + 4), g.has_beta = ctx.has_input(base + 5);
  if (g.has_decay != spec.gating || g.has_beta != spec.delta) {
    fail("update_rule needs " + std::string(spec.gating ? "decay" : "no decay") + " and " + (spec.delta ? "beta" : "no beta") +
         "; the node gives " + (g.has_decay ? "decay" : "no decay") + " and " + (g.has_beta ? "beta" : "no beta"));
  }
  if (g.has_decay) {
    const Tensor& d = ctx.input(base + 4);
    require_rank3(ctx, base + 4, g.B, g.T, -1, "decay");
    if (d.dim(2) != g.Hkv && d.dim(2) != g.Hkv * g.dk) {
      fail("input " + ctx.input_name(base + 4) + " (decay) is " + d.description() + ", expected last dim kv_num_heads or kv_num_heads * dk");
    }
    g.decay_per_row = d.dim(2) != g.Hkv;
  }
  if (g.has_beta) {
    const Tensor& bt = ctx.input(base + 5);
    require_rank3(ctx, base + 5, g.B, g.T, -1, "beta");
    if (bt.dim(2) != g.Hkv && bt.dim(2) != 1) fail("input " + ctx.input_name(base + 5) + " (beta) is " + bt.description() + ", expected last dim kv_num_heads or 1");
    g.beta_heads = bt.dim(2);
  }
  g.state_type = q.dtype();
  g.has_past = ctx.has_input(base + 3);
  if (g.has_past) {
    const Tensor& p = ctx.input(base + 3);
    if (!(p.shape() == Shape{g.B, g.Hkv, g.dk, g.dv}) || !is_floating(p.dtype())) {
      fail("input " + ctx.input_name(base + 3) + " (past_state) is " + p.description() + ", expected " + Shape{g.B, g.Hkv, g.dk, g.dv}.to_string());
    }
    g.state_type = p.dtype();
  }
  g.scale = spec.scale != 0 ? spec.scale : 1.0 / std::sqrt(static_cast<double>(g.dk));
  return g;
}

}  // namespace linear_attention

namespace {

namespace la = linear_attention;

template <class V>
void run_linear_attention(KernelContext& ctx, const la::Spec& spec) {
  const la::Geometry geo = la::read_geometry(ctx, spec, 0);
  const int64_t B = geo.B, T = geo.T, Hq = geo.Hq, Hkv = geo.Hkv, dk = geo.dk, dv = geo.dv;
  std::vector<V> state = geo.has_past ? la::values<V>(ctx.input(3)) : std::vector<V>(static_cast<size_t>(B * Hkv * dk * dv), V(0));
  const std::vector<V> q = la::values<V>(ctx.input(0)), k = la::values<V>(ctx.input(1)), v = la::values<V>(ctx.input(2));
  const std::vector<V> decay = geo.has_decay ? la::values<V>(ctx.input(4)) : std::vector<V>();
  const std::vector<V> beta = geo.has_beta ? la::values<V>(ctx.input(5)) : std::vector<V>();
  const V scale = static_cast<V>(geo.scale);
  std::vector<V> out(static_cast<size_t>(B * T * Hq * dv));
  parallel_for(B * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<V> scaled(static_cast<size_t>(dk * dv)), u(static_cast<size_t>(dv)), r(static_cast<size_t>(dv));
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / Hkv, h = bh % Hkv;
      V* S = state.data() + bh * dk * dv;
      for (int64_t t = 0; t < T; ++t) {
        la::step(geo, spec, S, k.data() + geo.k_at(b, t, h), v.data() + geo.v_at(b, t, h),
                 geo.has_decay ? decay.data() + geo.g_at(b, t, h) : nullptr, geo.has_beta ? beta[static_cast<size_t>(geo.beta_at(b, t, h))] : V(1),
                 scaled.data(), u.data(), r.data());
        for (int64_t hq = h * geo.group(); hq < (h + 1) * geo.group(); ++hq) {  // output_t = scale q_t^T S
          const V* qt = q.data() + geo.q_at(b, t, hq);
          V* o = out.data() + geo.o_at(b, t, hq);
          for (int64_t m = 0; m < dv; ++m) o[m] = 0;
          for (int64_t d = 0; d < dk; ++d) {
            for (int64_t m = 0; m < dv; ++m) o[m] += qt[d] * S[d * dv + m];
          }
          for (int64_t m = 0; m < dv; ++m) o[m] *= scale;
        }
      }
    }
  });
  Tensor y = ctx.allocate_output(0, ctx.input(0).dtype(), Shape{B, T, Hq * dv});
  Tensor present = ctx.allocate_output(1, geo.state_type, Shape{B, Hkv, dk, dv});
  visit_dtype<FloatTypes>(y.dtype(), "output", [&]<class U>() {
    for (size_t i = 0; i < out.size(); ++i) y.data<U>()[i] = convert<U>(out[i]);
  });
  visit_dtype<FloatTypes>(geo.state_type, "present_state", [&]<class U>() {
    for (size_t i = 0; i < state.size(); ++i) present.data<U>()[i] = convert<U>(state[i]);
  });
}

// --- CausalConvWithState ---

void run_causal_conv(KernelContext& ctx, bool silu) {
  const Tensor& x = ctx.input(0);
  const Tensor& w = ctx.input(1);
  if (x.rank() != 3) fail("input " + ctx.input_name(0) + " is " + x.description() + ", expected [batch, channels, length]");
  const int64_t B = x.dim(0), C = x.dim(1), L = x.dim(2);
  if (w.rank() != 3 || w.dim(0) != C || w.dim(1) != 1 || w.dim(2) < 1 || w.dtype() != x.dtype()) {
    fail("input " + ctx.input_name(1) + " is " + w.description() + ", expected " + std::string(dtype_name(x.dtype())) + " [" + la::num(C) +
         ", 1, k] (depthwise, k >= 1)");
  }
  const int64_t k = w.dim(2), P = k - 1;
  if (ctx.has_input(2) && (!(ctx.input(2).shape() == Shape{C}) || ctx.input(2).dtype() != x.dtype())) {
    fail("input " + ctx.input_name(2) + " (bias) is " + ctx.input(2).description() + ", expected [" + la::num(C) + "]");
  }
  if (ctx.has_input(3) && (!(ctx.input(3).shape() == Shape{B, C, P}) || ctx.input(3).dtype() != x.dtype())) {
    fail("input " + ctx.input_name(3) + " (past_state) is " + ctx.input(3).description() + ", expected " + Shape{B, C, P}.to_string());
  }
  Tensor y = ctx.allocate_output(0, x.dtype(), x.shape());
  Tensor present = ctx.allocate_output(1, x.dtype(), Shape{B, C, P});
  visit_dtype<FloatTypes>(x.dtype(), "input " + ctx.input_name(0), [&]<class T>() {
    using V = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const T* px = x.data<T>();
    const T* pw = w.data<T>();
    const T* pb = ctx.has_input(2) ? ctx.input(2).data<T>() : nullptr;
    const T* pp = ctx.has_input(3) ? ctx.input(3).data<T>() : nullptr;
    T* py = y.data<T>();
    T* ps = present.data<T>();
    parallel_for(B * C, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(L * k, 1)), [&](int64_t begin, int64_t end) {
      std::vector<V> padded(static_cast<size_t>(P + L));
      for (int64_t bc = begin; bc < end; ++bc) {
        const int64_t c = bc % C;
        for (int64_t i = 0; i < P; ++i) padded[static_cast<size_t>(i)] = pp ? convert<V>(pp[bc * P + i]) : V(0);
        for (int64_t i = 0; i < L; ++i) padded[static_cast<size_t>(P + i)] = convert<V>(px[bc * L + i]);
        for (int64_t t = 0; t < L; ++t) {
          V acc = pb ? convert<V>(pb[c]) : V(0);
          for (int64_t m = 0; m < k; ++m) acc += convert<V>(pw[c * k + m]) * padded[static_cast<size_t>(t + m)];
          if (silu) acc = acc / (V(1) + std::exp(-acc));
          py[bc * L + t] = convert<T>(acc);
        }
        for (int64_t i = 0; i < P; ++i) ps[bc * P + i] = convert<T>(padded[static_cast<size_t>(L + i)]);
      }
    });
  });
}

}  // namespace

std::unique_ptr<Kernel> make_linear_attention(const KernelInit& init) {
  const la::Spec spec = la::parse_spec(init);
  return make_kernel([spec](KernelContext& ctx) {
    if (ctx.input(0).dtype() == DataType::Float64) return run_linear_attention<double>(ctx, spec);
    run_linear_attention<float>(ctx, spec);
  });
}

std::unique_ptr<Kernel> make_causal_conv_with_state(const KernelInit& init) {
  const std::string activation = init.attr_string("activation", "none");
  if (activation != "none" && activation != "silu" && activation != "swish") {
    fail("attribute 'activation' = '" + activation + "' is not one of 'silu', 'swish', 'none'");
  }
  const bool silu = activation != "none";
  return make_kernel([silu](KernelContext& ctx) { run_causal_conv(ctx, silu); });
}

}  // namespace onnxtrain::ops
