// CausalConvWithStateGrad (ai.onnxtrain, emitted by the CausalConvWithState gradient rule in
// autodiff/rules_transformer.cpp): inputs dY, then CausalConvWithState's input, weight, bias,
// past_state (optional ones may be empty), then dPresentState (optional: the gradient flowing into
// present_state); attribute activation. Outputs dInput, dWeight, dBias (each may be omitted).
// With padded = concat(past_state, input) along the sequence (P = k - 1 leading positions),
// z[t] = bias + sum_m weight[m] padded[t + m] and y = act(z):
//   dz[t] = dY[t] act'(z[t])         (silu: s + z s (1 - s), s = sigmoid(z); none: 1)
//   dpadded[t + m] += weight[m] dz[t], dpadded[L + i] += dPresentState[i]; dInput = dpadded[P:]
//   dWeight[c, 0, m] = sum over batch and t of dz[t] padded[t + m];  dBias[c] = sum of dz.
// past_state is not differentiable (the schema's tag). Computes in float32 (float64 for float64).
//
// LinearAttentionGrad (ai.onnxtrain, emitted by the LinearAttention rule): inputs dOutput, then
// LinearAttention's query, key, value, past_state, decay, beta (optional ones may be empty),
// then dPresentState (optional); its attributes. Outputs dQuery, dKey, dValue, dDecay, dBeta
// (each may be omitted; past_state is not differentiable, its schema's tag). Backpropagation
// through the tokens: the forward states S_t are recomputed and kept per head, then from the
// last token back, with dS the gradient of S_t (starting at dPresentState or 0):
//   dq_t = scale S_t do_t;  dS += scale q_t do_t^T              (each query head of the group)
//   S_t = S' + k u^T:  du = dS^T k;  dk = dS u;  dS' = dS
//   delta rules, u = beta (v - S'^T k):  dv = beta du;  dbeta = du . (v - S'^T k);
//     dS' += k (-beta du)^T;  dk += S' (-beta du)
//   gated rules, S' = exp(g) S_{t-1} (per row of S):  dg = exp(g) sum_m dS'[d, m] S_{t-1}[d, m]
//     (summed over the rows for a per-head decay);  dS_{t-1} = exp(g) dS'.
#include <cmath>
#include <string>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/factories.h"
#include "ops/linear_attention.h"

namespace onnxtrain::ops {

namespace {

void run_causal_conv_grad(KernelContext& ctx, bool silu) {
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const Tensor& w = ctx.input(2);
  if (x.rank() != 3 || !(dy.shape() == x.shape()) || dy.dtype() != x.dtype()) {
    fail("inputs " + ctx.input_name(0) + " " + dy.description() + " and " + ctx.input_name(1) + " " + x.description() +
         " must be one type and shape [batch, channels, length]");
  }
  const int64_t B = x.dim(0), C = x.dim(1), L = x.dim(2);
  if (w.rank() != 3 || w.dim(0) != C || w.dim(1) != 1 || w.dim(2) < 1 || w.dtype() != x.dtype()) {
    fail("input " + ctx.input_name(2) + " is " + w.description() + ", expected [" + std::to_string(C) + ", 1, k]");
  }
  const int64_t k = w.dim(2), P = k - 1;
  const Shape state{B, C, P};
  for (int i : {4, 5}) {
    if (ctx.has_input(i) && (!(ctx.input(i).shape() == state) || ctx.input(i).dtype() != x.dtype())) {
      fail("input " + ctx.input_name(i) + " is " + ctx.input(i).description() + ", expected " + state.to_string());
    }
  }
  if (ctx.has_input(3) && (!(ctx.input(3).shape() == Shape{C}) || ctx.input(3).dtype() != x.dtype())) {
    fail("input " + ctx.input_name(3) + " (bias) is " + ctx.input(3).description() + ", expected [" + std::to_string(C) + "]");
  }
  Tensor dx = ctx.allocate_output(0, x.dtype(), x.shape());  // copies: scratch when not asked for
  Tensor dw = ctx.allocate_output(1, x.dtype(), w.shape());
  Tensor db = ctx.allocate_output(2, x.dtype(), Shape{C});
  visit_dtype<FloatTypes>(x.dtype(), "input " + ctx.input_name(1), [&]<class T>() {
    using V = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const T* pg = dy.data<T>();
    const T* px = x.data<T>();
    const T* pw = w.data<T>();
    const T* pb = ctx.has_input(3) ? ctx.input(3).data<T>() : nullptr;
    const T* pp = ctx.has_input(4) ? ctx.input(4).data<T>() : nullptr;
    const T* pdp = ctx.has_input(5) ? ctx.input(5).data<T>() : nullptr;
    T* pdx = dx.data<T>();
    T* pdw = dw.data<T>();
    T* pdb = db.data<T>();
    // Channels in parallel, the batch inside, so that dWeight and dBias need no reduction across threads.
    parallel_for(C, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(B * L * k, 1)), [&](int64_t begin, int64_t end) {
      std::vector<V> padded(static_cast<size_t>(P + L)), dpad(static_cast<size_t>(P + L)), dz(static_cast<size_t>(L));
      for (int64_t c = begin; c < end; ++c) {
        std::vector<V> gw(static_cast<size_t>(k), V(0));
        V gb = 0;
        for (int64_t b = 0; b < B; ++b) {
          const int64_t bc = b * C + c;
          for (int64_t i = 0; i < P; ++i) padded[static_cast<size_t>(i)] = pp ? convert<V>(pp[bc * P + i]) : V(0);
          for (int64_t i = 0; i < L; ++i) padded[static_cast<size_t>(P + i)] = convert<V>(px[bc * L + i]);
          std::fill(dpad.begin(), dpad.end(), V(0));
          for (int64_t i = 0; pdp && i < P; ++i) dpad[static_cast<size_t>(L + i)] += convert<V>(pdp[bc * P + i]);
          for (int64_t t = 0; t < L; ++t) {
            V z = pb ? convert<V>(pb[c]) : V(0);
            for (int64_t m = 0; m < k; ++m) z += convert<V>(pw[c * k + m]) * padded[static_cast<size_t>(t + m)];
            V d = convert<V>(pg[bc * L + t]);
            if (silu) {
              const V s = V(1) / (V(1) + std::exp(-z));
              d *= s + z * s * (V(1) - s);
            }
            dz[static_cast<size_t>(t)] = d;
            gb += d;
            for (int64_t m = 0; m < k; ++m) {
              dpad[static_cast<size_t>(t + m)] += convert<V>(pw[c * k + m]) * d;
              gw[static_cast<size_t>(m)] += d * padded[static_cast<size_t>(t + m)];
            }
          }
          for (int64_t i = 0; i < L; ++i) pdx[bc * L + i] = convert<T>(dpad[static_cast<size_t>(P + i)]);
        }
        for (int64_t m = 0; m < k; ++m) pdw[c * k + m] = convert<T>(gw[static_cast<size_t>(m)]);
        pdb[c] = convert<T>(gb);
      }
    });
  });
}

namespace la = linear_attention;

template <class V>
void run_linear_attention_grad(KernelContext& ctx, const la::Spec& spec) {
  const la::Geometry geo = la::read_geometry(ctx, spec, 1);
  const int64_t B = geo.B, T = geo.T, Hkv = geo.Hkv, dk = geo.dk, dv = geo.dv, n = dk * dv;
  const Tensor& dout_t = ctx.input(0);
  if (!(dout_t.shape() == Shape{B, T, geo.Hq * dv})) {
    fail("input " + ctx.input_name(0) + " is " + dout_t.description() + ", expected " + Shape{B, T, geo.Hq * dv}.to_string() + " (the gradient of output)");
  }
  if (ctx.has_input(7) && !(ctx.input(7).shape() == Shape{B, Hkv, dk, dv})) {
    fail("input " + ctx.input_name(7) + " is " + ctx.input(7).description() + ", expected " + Shape{B, Hkv, dk, dv}.to_string() +
         " (the gradient of present_state)");
  }
  const std::vector<V> dout = la::values<V>(dout_t), q = la::values<V>(ctx.input(1)), k = la::values<V>(ctx.input(2)),
                       v = la::values<V>(ctx.input(3));
  const std::vector<V> past = geo.has_past ? la::values<V>(ctx.input(4)) : std::vector<V>();
  const std::vector<V> decay = geo.has_decay ? la::values<V>(ctx.input(5)) : std::vector<V>();
  const std::vector<V> beta = geo.has_beta ? la::values<V>(ctx.input(6)) : std::vector<V>();
  const std::vector<V> dpresent = ctx.has_input(7) ? la::values<V>(ctx.input(7)) : std::vector<V>();
  std::vector<V> dq(q.size(), V(0)), dk_(k.size(), V(0)), dv_(v.size(), V(0)), ddecay(decay.size(), V(0));
  std::vector<V> dbeta_heads(static_cast<size_t>(B * T * Hkv), V(0));  // per head, summed when beta is shared
  const V scale = static_cast<V>(geo.scale);
  parallel_for(B * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<V> states(static_cast<size_t>((T + 1) * n)), scaled(static_cast<size_t>(n)), u(static_cast<size_t>(dv)),
        r(static_cast<size_t>(dv)), dS(static_cast<size_t>(n)), du(static_cast<size_t>(dv)), work(static_cast<size_t>(n));
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / Hkv, h = bh % Hkv;
      auto g_of = [&](int64_t t) { return geo.has_decay ? decay.data() + geo.g_at(b, t, h) : nullptr; };
      auto beta_of = [&](int64_t t) { return geo.has_beta ? beta[static_cast<size_t>(geo.beta_at(b, t, h))] : V(1); };
      for (int64_t i = 0; i < n; ++i) states[static_cast<size_t>(i)] = geo.has_past ? past[static_cast<size_t>(bh * n + i)] : V(0);
      for (int64_t t = 0; t < T; ++t) {  // S_t for every token
        V* S = states.data() + (t + 1) * n;
        std::copy(S - n, S, S);
        la::step(geo, spec, S, k.data() + geo.k_at(b, t, h), v.data() + geo.v_at(b, t, h), g_of(t), beta_of(t), scaled.data(), u.data(), r.data());
      }
      for (int64_t i = 0; i < n; ++i) dS[static_cast<size_t>(i)] = dpresent.empty() ? V(0) : dpresent[static_cast<size_t>(bh * n + i)];
      for (int64_t t = T - 1; t >= 0; --t) {
        const V* S_t = states.data() + (t + 1) * n;
        const V* S_prev = states.data() + t * n;
        const V* kt = k.data() + geo.k_at(b, t, h);
        const V* vt = v.data() + geo.v_at(b, t, h);
        const std::vector<V>& Sx = scaled;  // S', u and r of this token, recomputed from S_{t-1}
        std::copy(S_prev, S_prev + n, work.begin());
        la::step(geo, spec, work.data(), kt, vt, g_of(t), beta_of(t), scaled.data(), u.data(), r.data());
        for (int64_t hq = h * geo.group(); hq < (h + 1) * geo.group(); ++hq) {
          const V* qt = q.data() + geo.q_at(b, t, hq);
          const V* dot = dout.data() + geo.o_at(b, t, hq);
          V* dqt = dq.data() + geo.q_at(b, t, hq);
          for (int64_t d = 0; d < dk; ++d) {
            V acc = 0;
            for (int64_t m = 0; m < dv; ++m) {
              acc += S_t[d * dv + m] * dot[m];
              dS[static_cast<size_t>(d * dv + m)] += scale * qt[d] * dot[m];
            }
            dqt[d] = scale * acc;
          }
        }
        V* dkt = dk_.data() + geo.k_at(b, t, h);
        V* dvt = dv_.data() + geo.v_at(b, t, h);
        for (int64_t m = 0; m < dv; ++m) {
          V acc = 0;
          for (int64_t d = 0; d < dk; ++d) acc += dS[static_cast<size_t>(d * dv + m)] * kt[d];
          du[static_cast<size_t>(m)] = acc;
        }
        for (int64_t d = 0; d < dk; ++d) {
          V acc = 0;
          for (int64_t m = 0; m < dv; ++m) acc += dS[static_cast<size_t>(d * dv + m)] * u[static_cast<size_t>(m)];
          dkt[d] = acc;
        }
        if (spec.delta) {
          const V bt = beta_of(t);
          V db = 0;
          for (int64_t m = 0; m < dv; ++m) {
            const size_t mi = static_cast<size_t>(m);
            dvt[m] = bt * du[mi];
            db += du[mi] * (vt[m] - r[mi]);
            const V dr = -bt * du[mi];
            for (int64_t d = 0; d < dk; ++d) {
              dS[static_cast<size_t>(d * dv + m)] += kt[d] * dr;
              dkt[d] += Sx[static_cast<size_t>(d * dv + m)] * dr;
            }
          }
          dbeta_heads[static_cast<size_t>((b * T + t) * Hkv + h)] = db;
        } else {
          for (int64_t m = 0; m < dv; ++m) dvt[m] = du[static_cast<size_t>(m)];
        }
        if (spec.gating) {
          const V* g = g_of(t);
          V* dg = ddecay.data() + geo.g_at(b, t, h);
          for (int64_t d = 0; d < dk; ++d) {
            const V a = std::exp(g[geo.decay_per_row ? d : 0]);
            V acc = 0;
            for (int64_t m = 0; m < dv; ++m) {
              acc += dS[static_cast<size_t>(d * dv + m)] * S_prev[d * dv + m];
              dS[static_cast<size_t>(d * dv + m)] *= a;
            }
            dg[geo.decay_per_row ? d : 0] += a * acc;
          }
        }
      }
    }
  });
  auto write = [&](int o, const std::vector<V>& values, int like) {
    if (!ctx.has_output(o)) return;
    const Tensor& t = ctx.input(like);
    Tensor& out = ctx.allocate_output(o, t.dtype(), t.shape());
    visit_dtype<FloatTypes>(t.dtype(), "output", [&]<class U>() {
      for (size_t i = 0; i < values.size(); ++i) out.data<U>()[i] = convert<U>(values[i]);
    });
  };
  write(0, dq, 1);
  write(1, dk_, 2);
  write(2, dv_, 3);
  if (ctx.has_output(3) && !geo.has_decay) fail("output " + ctx.output_name(3) + " asks for the gradient of a decay the node does not have");
  if (ctx.has_output(4) && !geo.has_beta) fail("output " + ctx.output_name(4) + " asks for the gradient of a beta the node does not have");
  write(3, ddecay, 5);
  if (geo.has_beta) {
    std::vector<V> dbeta(static_cast<size_t>(B * T * geo.beta_heads), V(0));
    for (int64_t bt = 0; bt < B * T; ++bt) {
      for (int64_t h = 0; h < Hkv; ++h) {
        dbeta[static_cast<size_t>(bt * geo.beta_heads + (geo.beta_heads == 1 ? 0 : h))] += dbeta_heads[static_cast<size_t>(bt * Hkv + h)];
      }
    }
    write(4, dbeta, 6);
  }
}

}  // namespace

std::unique_ptr<Kernel> make_causal_conv_with_state_grad(const KernelInit& init) {
  const std::string activation = init.attr_string("activation", "none");
  if (activation != "none" && activation != "silu" && activation != "swish") {
    fail("attribute 'activation' = '" + activation + "' is not one of 'silu', 'swish', 'none'");
  }
  const bool silu = activation != "none";
  return make_kernel([silu](KernelContext& ctx) { run_causal_conv_grad(ctx, silu); });
}

std::unique_ptr<Kernel> make_linear_attention_grad(const KernelInit& init) {
  const la::Spec spec = la::parse_spec(init);
  return make_kernel([spec](KernelContext& ctx) {
    if (ctx.input(1).dtype() == DataType::Float64) return run_linear_attention_grad<double>(ctx, spec);
    run_linear_attention_grad<float>(ctx, spec);
  });
}

}  // namespace onnxtrain::ops
