// AttentionGrad (ai.onnxtrain, emitted by the Attention gradient rule in
// autodiff/rules_transformer.cpp): the gradients of Attention-23/24/25 in one pass per
// (batch, key/value head), recomputing the scores and the softmax instead of keeping them
// (the memory of FlashAttention's backward pass, arXiv 2205.14135, without its tiling).
//
// Inputs: dY, then Attention's inputs Q, K, V, attn_mask, past_key, past_value,
// nonpad_kv_seqlen (optional ones may be empty), then dPresentKey, dPresentValue (optional:
// the gradients flowing into present_key / present_value), then the forward's softmax P
// (optional: its qk_matmul_output in mode 3; float32 and float64 without softcap), which is
// then read instead of made again. Attributes: Attention's.
// Outputs: dQ, dK, dV, dAttnMask (a float mask only), dPastKey, dPastValue; each may be omitted.
// Per query head h of key/value head k (shapes in attention.h), with P the forward softmax:
//   dV_k += P^T dY_h;  dP = dY_h V_k^T;  dX = P (dP - rowsum(P dP));
//   dAttnMask += dX (summed over the dims the mask broadcasts);
//   dS = dX (1 - tanh^2(S / softcap)) with softcap, else dX;
//   dQ_h = scale dS K_k;  dK_k += scale dS^T Q_h,
// and dK, dV of all positions split into the past's part and the new tokens' part (laid out
// as K and V). Rows the mask fully masks have P = 0 and get no gradient. The computation runs
// in float32 (float64 for float64 inputs) at any softmax_precision; float16/bfloat16 results
// are rounded once.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "core/dispatch.h"
#include "ops/attention.h"
#include "ops/factories.h"

namespace onnxtrain::ops {

namespace {

using namespace attention;

constexpr int kBase = 1;  // AttentionGrad's inputs: dY, then Attention's
constexpr int kDPresentKey = 8, kDPresentValue = 9, kProbabilities = 10;

// Tensor t (laid out by s) as compute type C: its own data when T is C, else a converted copy.
template <class T, class C>
const C* view_as(const Tensor& t, std::vector<C>& buffer) {
  if constexpr (std::is_same_v<T, C>) {
    return t.data<T>();
  } else {
    const T* p = t.data<T>();
    buffer.resize(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<C>(convert<double>(p[i]));
    return buffer.data();
  }
}

// The keys (or values) of all positions as C [B, Hkv, total, D]: past then new tokens.
template <class T, class C>
void all_positions(const KernelContext& ctx, int past_i, int new_i, const Strides& s, const Geometry& g, int64_t D, std::vector<C>& out) {
  out.resize(static_cast<size_t>(g.B * g.Hkv * g.total * D));
  const T* pn = ctx.input(new_i).data<T>();
  const T* pp = g.has_past ? ctx.input(past_i).data<T>() : nullptr;
  for (int64_t b = 0; b < g.B; ++b) {
    for (int64_t h = 0; h < g.Hkv; ++h) {
      C* o = out.data() + (b * g.Hkv + h) * g.total * D;
      for (int64_t k = 0; pp && k < g.past * D; ++k) o[k] = static_cast<C>(convert<double>(pp[(b * g.Hkv + h) * g.past * D + k]));
      for (int64_t r = 0; r < g.Skv; ++r) {
        for (int64_t d = 0; d < D; ++d) o[(g.past + r) * D + d] = static_cast<C>(convert<double>(pn[s.at(b, h) + r * s.s + d]));
      }
    }
  }
}

// Accumulator [B, Hkv, total, D] starting from the gradient flowing into present_* (or zeros).
template <class T, class C>
void present_gradient(const KernelContext& ctx, int i, const Geometry& g, int64_t D, std::vector<C>& out) {
  out.assign(static_cast<size_t>(g.B * g.Hkv * g.total * D), C(0));
  if (!ctx.has_input(i)) return;
  const Tensor& t = ctx.input(i);
  const Shape want{g.B, g.Hkv, g.total, D};
  if (!(t.shape() == want) || t.dtype() != ctx.input(kBase + kQ).dtype()) {
    fail("input " + ctx.input_name(i) + " is " + t.description() + ", expected " + std::string(dtype_name(ctx.input(kBase + kQ).dtype())) + " " +
         want.to_string() + " (the gradient of a present output)");
  }
  const T* p = t.data<T>();
  for (size_t k = 0; k < out.size(); ++k) out[k] = static_cast<C>(convert<double>(p[k]));
}

// Output `o` (laid out as K or V by `s`) and the past's gradient `past_o` from the accumulator.
template <class T, class C>
void split_positions(KernelContext& ctx, int o, int past_o, const std::vector<C>& all, const Strides& s, const Geometry& g, int64_t D) {
  if (ctx.has_output(o)) {
    T* out = ctx.allocate_output(o, ctx.input(kBase + (o == 1 ? kK : kV)).dtype(), ctx.input(kBase + (o == 1 ? kK : kV)).shape()).template data<T>();
    for (int64_t b = 0; b < g.B; ++b) {
      for (int64_t h = 0; h < g.Hkv; ++h) {
        const C* src = all.data() + ((b * g.Hkv + h) * g.total + g.past) * D;
        for (int64_t r = 0; r < g.Skv; ++r) {
          for (int64_t d = 0; d < D; ++d) out[s.at(b, h) + r * s.s + d] = convert<T>(src[r * D + d]);
        }
      }
    }
  }
  if (ctx.has_output(past_o)) {
    if (!g.has_past) fail("output " + ctx.output_name(past_o) + " asks for the gradient of a past input the node does not have");
    T* out = ctx.allocate_output(past_o, ctx.input(kBase + kQ).dtype(), Shape{g.B, g.Hkv, g.past, D}).template data<T>();
    for (int64_t bh = 0; bh < g.B * g.Hkv; ++bh) {
      for (int64_t k = 0; k < g.past * D; ++k) out[bh * g.past * D + k] = convert<T>(all[static_cast<size_t>(bh * g.total * D + k)]);
    }
  }
}

// Buffers kept by the kernel between runs (the same shapes come again: no fresh pages each run).
template <class C>
struct Buffers {
  std::vector<C> k_all, v_all, dk_all, dv_all, dq, dmask;
};
struct Scratch {
  Buffers<float> f;
  Buffers<double> d;
  template <class C>
  Buffers<C>& get() {
    if constexpr (std::is_same_v<C, float>) {
      return f;
    } else {
      return d;
    }
  }
};

template <class T>
void run_attention_grad(KernelContext& ctx, const Spec& spec, Scratch& scratch) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const Geometry g = read_geometry(ctx, spec, kBase);
  const Bias<C> bias(ctx, spec, g, kBase);
  const Tensor& q_t = ctx.input(kBase + kQ);
  const Shape& y_shape = g.y_shape;
  const Tensor& dy_t = ctx.input(0);
  if (!(dy_t.shape() == y_shape) || dy_t.dtype() != q_t.dtype()) {
    fail("input " + ctx.input_name(0) + " is " + dy_t.description() + ", expected " + std::string(dtype_name(q_t.dtype())) + " " + y_shape.to_string() +
         " (the gradient of Y)");
  }
  const bool want_mask = ctx.has_output(3);
  if (want_mask && (!bias.has_mask() || !is_floating(ctx.input(kBase + kMask).dtype()))) {
    fail("output " + ctx.output_name(3) + " asks for the gradient of attn_mask, which needs a floating-point mask");
  }
  std::vector<C> qb, dyb;
  const C* pq = view_as<T, C>(q_t, qb);
  const C* pdy = view_as<T, C>(dy_t, dyb);
  Buffers<C>& buf = scratch.get<C>();
  // Without a past or the gradients of the present outputs, float32 and float64 read K and V
  // where they lie and write dQ, dK and dV straight into the outputs (laid out as Q, K and V):
  // no copies, and nothing done outside the threads. Otherwise through buffers [B, Hkv, total,
  // D] of all positions, split afterwards. At BERT's shapes (batch 32, 128 tokens, 4 heads of
  // 64; two Xeon vCPUs, in a training step): 17 ms a call through the copies, 10 without.
  const bool in_place = std::is_same_v<T, C> && !g.has_past && !ctx.has_input(kDPresentKey) && !ctx.has_input(kDPresentValue);
  for (int o : {4, 5}) {
    if (ctx.has_output(o) && !g.has_past) fail("output " + ctx.output_name(o) + " asks for the gradient of a past input the node does not have");
  }
  const C *kbase = nullptr, *vbase = nullptr;
  C *dkbase = nullptr, *dvbase = nullptr, *dqbase = nullptr;
  Strides ks, vs;  // of K and V as read, and of dK and dV as written
  if (in_place) {
    if constexpr (std::is_same_v<T, C>) {
      const Tensor &k_t = ctx.input(kBase + kK), &v_t = ctx.input(kBase + kV);
      kbase = k_t.data<T>(), vbase = v_t.data<T>();
      ks = g.k, vs = g.v;
      const auto output_or = [&](int o, const Tensor& like, std::vector<C>& spare) -> C* {
        if (ctx.has_output(o)) return ctx.allocate_output(o, like.dtype(), like.shape()).template data<T>();
        spare.resize(static_cast<size_t>(like.numel()));  // written, not returned
        return spare.data();
      };
      dqbase = output_or(0, q_t, buf.dq);
      dkbase = output_or(1, k_t, buf.dk_all);
      dvbase = output_or(2, v_t, buf.dv_all);
    }
  } else {
    all_positions<T, C>(ctx, kBase + kPastKey, kBase + kK, g.k, g, g.Dh, buf.k_all);
    all_positions<T, C>(ctx, kBase + kPastValue, kBase + kV, g.v, g, g.Dv, buf.v_all);
    present_gradient<T, C>(ctx, kDPresentKey, g, g.Dh, buf.dk_all);
    present_gradient<T, C>(ctx, kDPresentValue, g, g.Dv, buf.dv_all);
    buf.dq.resize(static_cast<size_t>(q_t.numel()));
    kbase = buf.k_all.data(), vbase = buf.v_all.data(), dkbase = buf.dk_all.data(), dvbase = buf.dv_all.data(), dqbase = buf.dq.data();
    ks = {g.Hkv * g.total * g.Dh, g.total * g.Dh, g.Dh};
    vs = {g.Hkv * g.total * g.Dv, g.total * g.Dv, g.Dv};
  }
  const int64_t T_ = g.total, tasks = g.B * g.Hkv;
  // Input 10: the forward's softmax P [B, Hq, Sq, total] (its qk_matmul_output in mode 3, which
  // runtime/fusion.h share_attention_probabilities hands over), so that P is not made again.
  const C* probs = nullptr;
  if (ctx.has_input(kProbabilities)) {
    const Tensor& pt = ctx.input(kProbabilities);
    if (!std::is_same_v<T, C> || spec.softcap > 0 || pt.dtype() != q_t.dtype() || !(pt.shape() == Shape{g.B, g.Hq, g.Sq, T_})) {
      fail("input " + ctx.input_name(kProbabilities) + " is " + pt.description() + ", expected the forward's softmax, " +
           std::string(dtype_name(q_t.dtype())) + " " + Shape{g.B, g.Hq, g.Sq, T_}.to_string() + " of float32 or float64 without softcap");
    }
    if constexpr (std::is_same_v<T, C>) probs = pt.data<T>();
  }
  const int threads = head_threads(tasks);
  const int64_t mask_n = want_mask ? ctx.input(kBase + kMask).numel() : 0;
  std::vector<C>& dmask = buf.dmask;
  dmask.assign(static_cast<size_t>(threads * mask_n), C(0));
  const C scale = static_cast<C>(g.scale), cap = static_cast<C>(spec.softcap);
  const bool capped = spec.softcap > 0;
  // Blocks of query rows when the keys they attend end early (see attention.h), else one block.
  const bool blocked = spec.is_causal || spec.right_window >= 0 || ctx.has_input(kBase + kNonpad);
  const int64_t block = blocked ? kQueryBlock : std::max<int64_t>(g.Sq, 1);
  const bool plain = bias.none() && !capped;  // rows need neither a bias nor the softcap
  bool gemm_ok = true;
#pragma omp parallel num_threads(threads) reduction(&& : gemm_ok)
  {
    const size_t n = static_cast<size_t>(std::min(g.Sq, block) * T_);
    std::vector<C> p(n), dp(n), th(capped ? n : 0), brow(static_cast<size_t>(T_));
    const int t = omp_get_thread_num();
    C* dm = dmask.data() + t * mask_n;
    for (int64_t task = tasks * t / threads; task < tasks * (t + 1) / threads; ++task) {
      const int64_t b = task / g.Hkv, hk = task % g.Hkv;
      const C* kk = kbase + ks.at(b, hk);
      const C* vv = vbase + vs.at(b, hk);
      C* dkk = dkbase + ks.at(b, hk);
      C* dvv = dvbase + vs.at(b, hk);
      // The products below add into dK and dV (the buffers start as the present gradients). In
      // place with every block attending all keys, the first query head's products write them
      // instead (beta 0), so no zeros are written first: at BERT's shapes (one query head per
      // key/value head, dK and dV 32 KB per head, two threads, operands out of cache) a one-off
      // program took 7.0-7.4 ms a layer against 7.5-8.3 with the zeros; BERT's step 24.9-26.7 ms of
      // AttentionGrad against 26.8-31.5 (three alternating pairs). The same values (only the sign
      // of a zero may differ: beta 0 writes -0 where 0 + -0 gave +0).
      const bool write_first = in_place && !blocked && g.Sq > 0;
      if (in_place && !write_first) {
        for (int64_t r = 0; r < T_; ++r) {
          std::fill(dkk + r * ks.s, dkk + r * ks.s + g.Dh, C(0));
          std::fill(dvv + r * vs.s, dvv + r * vs.s + g.Dv, C(0));
        }
      }
      for (int64_t h = hk * g.group(); h < (hk + 1) * g.group(); ++h) {
        for (int64_t i0 = 0; i0 < g.Sq; i0 += block) {  // blocks of query rows against the keys they can attend
          const int64_t rows = std::min(g.Sq - i0, block), kn = blocked ? bias.key_limit(b, i0 + rows - 1) : T_;
          const C* qh = pq + g.q.at(b, h) + i0 * g.q.s;
          const C* dyh = pdy + g.y.at(b, h) + i0 * g.y.s;
          // P: the forward's (input 10) where it is given, else made again from S.
          const C* pp = probs ? probs + ((b * g.Hq + h) * g.Sq + i0) * T_ : p.data();
          if (!probs) {
            gemm_ok = gemm_ok && gemm(false, true, rows, kn, g.Dh, scale, qh, g.q.s, kk, ks.s, C(0), p.data(), T_);
            for (int64_t r = 0; r < rows; ++r) {  // P = softmax(softcap(S) + bias), zero rows where all masked
              C* row = p.data() + r * T_;
              if (plain) {  // no bias, no softcap
                softmax_row<C, C>(row, kn);
                if (spec.nan_to_zero) zero_nans(row, kn);
                continue;
              }
              C* br = brow.data();
              bias.row(br, b, h, i0 + r);
              if (capped) {
                C* tr = th.data() + r * T_;
                for (int64_t j = 0; j < kn; ++j) {
                  tr[j] = std::tanh(row[j] / cap);
                  row[j] = cap * tr[j];
                }
              }
              int64_t masked = 0;
#pragma omp simd reduction(+ : masked)
              for (int64_t j = 0; j < kn; ++j) {
                masked += br[j] == -std::numeric_limits<C>::infinity() ? 1 : 0;
                row[j] += br[j];
              }
              if (masked == kn) {  // zeros; NaN as Softmax gives with graph_semantics
                std::fill(row, row + kn, spec.graph_semantics && !spec.nan_to_zero ? std::numeric_limits<C>::quiet_NaN() : C(0));
                continue;
              }
              softmax_row<C, C>(row, kn);
              if (spec.nan_to_zero) zero_nans(row, kn);
            }
          }
          gemm_ok = gemm_ok && gemm(false, true, rows, kn, g.Dv, C(1), dyh, g.y.s, vv, vs.s, C(0), dp.data(), T_);
          const C beta = write_first && h == hk * g.group() ? C(0) : C(1);  // one block: i0 is 0
          gemm_ok = gemm_ok && gemm(true, false, kn, g.Dv, rows, C(1), pp, T_, dyh, g.y.s, beta, dvv, vs.s);
          for (int64_t r = 0; r < rows; ++r) {  // dX = P (dP - rowsum(P dP)), then through the softcap
            const C* pr = pp + r * T_;
            C* dr = dp.data() + r * T_;
            C dot = 0;
#pragma omp simd reduction(+ : dot)
            for (int64_t j = 0; j < kn; ++j) dot += pr[j] * dr[j];
#pragma omp simd
            for (int64_t j = 0; j < kn; ++j) dr[j] = pr[j] * (dr[j] - dot);
            if (want_mask) {
              C* mr = dm + bias.mask_offset(b, h, i0 + r);
              if (bias.mask_broadcasts_keys()) {  // one addend for the whole row
                C row_sum = 0;
                for (int64_t j = 0; j < kn; ++j) row_sum += dr[j];
                mr[0] += row_sum;
              } else {
                for (int64_t j = 0; j < std::min(kn, bias.mask_len()); ++j) mr[j] += dr[j];
              }
            }
            if (capped) {
              const C* tr = th.data() + r * T_;
              for (int64_t j = 0; j < kn; ++j) dr[j] *= C(1) - tr[j] * tr[j];
            }
          }
          gemm_ok = gemm_ok && gemm(false, false, rows, g.Dh, kn, scale, dp.data(), T_, kk, ks.s, C(0), dqbase + g.q.at(b, h) + i0 * g.q.s,
                                    g.q.s);
          gemm_ok = gemm_ok && gemm(true, false, kn, g.Dh, rows, scale, dp.data(), T_, qh, g.q.s, beta, dkk, ks.s);
        }
      }
    }
  }
  if (!gemm_ok) throw Error("oneDNN's sgemm failed in AttentionGrad");
  if (!in_place) {
    if (ctx.has_output(0)) {
      T* out = ctx.allocate_output(0, q_t.dtype(), q_t.shape()).template data<T>();
      for (size_t k = 0; k < buf.dq.size(); ++k) out[k] = convert<T>(buf.dq[k]);
    }
    split_positions<T, C>(ctx, 1, 4, buf.dk_all, g.k, g, g.Dh);
    split_positions<T, C>(ctx, 2, 5, buf.dv_all, g.v, g, g.Dv);
  }
  if (want_mask) {
    const Tensor& m = ctx.input(kBase + kMask);
    Tensor& out = ctx.allocate_output(3, m.dtype(), m.shape());
    visit_dtype<FloatTypes>(m.dtype(), "input " + ctx.input_name(kBase + kMask), [&]<class M>() {
      M* pm = out.data<M>();
      for (int64_t k = 0; k < mask_n; ++k) {
        C sum = 0;
        for (int t = 0; t < threads; ++t) sum += dmask[static_cast<size_t>(t * mask_n + k)];
        pm[k] = convert<M>(sum);
      }
    });
  }
}

}  // namespace

std::unique_ptr<Kernel> make_attention_grad(const KernelInit& init) {
  const Spec spec = parse_spec(init, static_cast<int>(init.attr_int("version", 24)));  // Attention's version
  return make_kernel([spec, scratch = std::make_shared<Scratch>()](KernelContext& ctx) {
    const DataType dt = ctx.input(kBase + kQ).dtype();
    visit_dtype<FloatTypes>(dt, "input " + ctx.input_name(kBase + kQ), [&]<class T>() { run_attention_grad<T>(ctx, spec, *scratch); });
  });
}

}  // namespace onnxtrain::ops
