// What LinearAttention (linear_attention.cpp) and its backward op (linear_attention_grad.cpp)
// share: the attributes, the reading of the inputs' shapes, and one step of the recurrence.
// Semantics: linear_attention.cpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dispatch.h"
#include "ops/kernel.h"

namespace onnxtrain::ops::linear_attention {

struct Spec {
  int64_t q_heads = 0, kv_heads = 0;
  double scale = 0;  // 0: 1 / sqrt(dk)
  bool gating = false, delta = false;
};
Spec parse_spec(const KernelInit& init);

struct Geometry {
  int64_t B = 0, T = 0, Hq = 0, Hkv = 0, dk = 0, dv = 0;
  bool has_decay = false, has_beta = false, has_past = false;
  bool decay_per_row = false;  // decay [B, T, Hkv * dk] rather than [B, T, Hkv]
  int64_t beta_heads = 0;      // beta's last dim: Hkv or 1
  double scale = 0;
  DataType state_type = DataType::Undefined;
  int64_t group() const { return Hq / Hkv; }
  // Offsets of token t of batch b in query [B, T, Hq * dk], key, value, decay and beta.
  int64_t q_at(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * Hq + h) * dk; }
  int64_t k_at(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * Hkv + h) * dk; }
  int64_t v_at(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * Hkv + h) * dv; }
  int64_t o_at(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * Hq + h) * dv; }
  int64_t g_at(int64_t b, int64_t t, int64_t h) const { return decay_per_row ? k_at(b, t, h) : (b * T + t) * Hkv + h; }
  int64_t beta_at(int64_t b, int64_t t, int64_t h) const { return (b * T + t) * beta_heads + (beta_heads == 1 ? 0 : h); }
};
// Validates LinearAttention's inputs at base.. (0: the op, 1: its backward op after dOutput).
Geometry read_geometry(const KernelContext& ctx, const Spec& spec, int base);

// Tensor t's values as V.
template <class V>
std::vector<V> values(const Tensor& t) {
  std::vector<V> out(static_cast<size_t>(t.numel()));
  visit_dtype<FloatTypes>(t.dtype(), "input", [&]<class T>() {
    const T* p = t.data<T>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<V>(convert<double>(p[i]));
  });
  return out;
}

// One token of one key/value head: S [dk, dv] from S_{t-1} to S_t. g: the decay at the token
// (dk values when per row, else one), beta its update rate. Leaves in `scaled` the state after
// the decay (S'), in `u` the outer product's value vector and in `r` S'^T k (delta rules).
template <class V>
void step(const Geometry& geo, const Spec& spec, V* S, const V* k, const V* v, const V* g, V beta, V* scaled, V* u, V* r) {
  const int64_t dk = geo.dk, dv = geo.dv;
  for (int64_t d = 0; d < dk; ++d) {
    const V a = spec.gating ? std::exp(g[geo.decay_per_row ? d : 0]) : V(1);
    for (int64_t m = 0; m < dv; ++m) scaled[d * dv + m] = a * S[d * dv + m];
  }
  for (int64_t m = 0; m < dv; ++m) {
    if (spec.delta) {
      V acc = 0;
      for (int64_t d = 0; d < dk; ++d) acc += scaled[d * dv + m] * k[d];
      r[m] = acc;
      u[m] = beta * (v[m] - acc);
    } else {
      u[m] = v[m];
    }
  }
  for (int64_t d = 0; d < dk; ++d) {
    for (int64_t m = 0; m < dv; ++m) S[d * dv + m] = scaled[d * dv + m] + k[d] * u[m];
  }
}

}  // namespace onnxtrain::ops::linear_attention
