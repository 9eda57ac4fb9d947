// RNN, GRU, LSTM: one-layer recurrent networks (ai.onnx opsets 7-28; ONNX operator docs
// "RNN", "GRU", "LSTM"). Opset 14 added `layout`; version 22 only adds bfloat16.
//
// Shapes (D = num_directions, 2 for "bidirectional" else 1; H = hidden_size; G = gates: RNN 1,
// GRU 3 in order z r h, LSTM 4 in order i o f c):
//   X [S, N, I]   W [D, G*H, I]   R [D, G*H, H]   B [D, 2*G*H] = [Wb, Rb] per direction
//   sequence_lens [N] (int32; int64 accepted)   initial_h, initial_c, Y_h, Y_c [D, N, H]
//   P [D, 3*H] (LSTM peepholes, order i o f)    Y [S, D, N, H]
// layout = 1 swaps the first two dims of X, initial_h/c, Y_h/c, and gives Y [N, S, D, H].
// Omitted B, P, initial_h, initial_c are zeros; omitted sequence_lens are all S; hidden_size
// defaults to R's last dim.
//
// With x = X[t], H = H[t-1], C = C[t-1], and b = Wb + Rb per gate:
//   RNN:  H' = f(x W^T + H R^T + b)                                      (default f = Tanh)
//   GRU:  z = f(x Wz^T + H Rz^T + bz),  r = f(x Wr^T + H Rr^T + br)   (default f = Sigmoid,
//         h = g(x Wh^T + (r . H) Rh^T + bh)              linear_before_reset = 0    g = Tanh)
//         h = g(x Wh^T + Wbh + r . (H Rh^T + Rbh))      linear_before_reset != 0
//         H' = (1 - z) . h + z . H
//   LSTM: i = f(x Wi^T + H Ri^T + Pi . C + bi),  f_t = f(x Wf^T + H Rf^T + Pf . C + bf)
//         (input_forget = 1: f_t = 1 - i),  c = g(x Wc^T + H Rc^T + bc),  C' = f_t . C + i . c,
//         o = f(x Wo^T + H Ro^T + Po . C' + bo),  H' = o . h(C')   (default f = Sigmoid,
//                                                                    g = h = Tanh)
// `clip` bounds every gate's pre-activation (the sums above) to [-clip, clip]; as in ONNX
// Runtime it is not applied to C' before h.
//
// Directions: "forward" runs t = 0..len-1, "reverse" runs t = len-1..0, "bidirectional" runs
// both with its own weights (direction index 0 forward, 1 reverse). len is the batch entry's
// sequence length: Y is 0 at t >= len, and Y_h / Y_c hold the state after the entry's last
// step (the initial state when len = 0).
//
// Activations: `activations` lists G' functions per direction (RNN 1: f; GRU 2: f g; LSTM 3:
// f g h), the forward direction's first; a bidirectional node given only G' uses them for
// both. Names (case-insensitive): Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu,
// ScaledTanh, HardSigmoid, Elu, Softsign, Softplus, as defined in the operator docs.
// `activation_alpha` / `activation_beta` are consumed in list order by the functions that take
// them (as ONNX Runtime does); missing values take the defaults of the same-named ONNX ops:
// LeakyRelu alpha 0.01, ThresholdedRelu alpha 1, Elu alpha 1, HardSigmoid 0.2 / 0.5, and
// Affine 1 / 0, ScaledTanh 1 / 1.
//
// X W^T for all time steps is one GEMM per direction; each step adds H R^T (one GEMM over the
// batch) and runs the gate arithmetic per batch entry. float32 GEMMs are oneDNN's sgemm,
// float64 plain loops; float16 / bfloat16 are computed in float32. A float32 LSTM at batch 1
// without a trace runs its steps as dot products and gates in one parallel region instead
// (Recurrence::lstm_rowwise); with 8 or more batch entries per thread, each thread runs the
// whole recurrence of its share of the batch, a single-threaded product per step (oneDNN's
// matmul on the thread's own copy of R in the primitive's layout with AVX-512, else sgemm), with
// no barrier (Recurrence::lstm_batch_split; bench/workloads.py's LSTM at batch 64 on two threads:
// 23.0 -> 21.3 ms with sgemm). A float32 LSTM with 8 or more batch entries, default activations and none of
// clip, input_forget, peepholes, shorter sequences or a trace runs oneDNN's LSTM primitive
// instead (rnn_onednn.h; the same LSTM at batch 64: 17.2-17.7 ms).
// The gradients (rnn_grad.cpp) need each step's gates and states (rnn_common.h: Trace): they
// run the same recurrence again, direction by direction, unless the forward node ran as
// ai.onnxtrain.RNNTraining / GRUTraining / LSTMTraining (the forward node's inputs, attributes
// and outputs, then `trace`: [D, TraceLayout::elements] in the compute type, float32 or
// float64), which runtime/fusion.h's share_rnn_trace makes of a forward node whose gradient node
// reads the same inputs, and which hands the trace to the gradient node.
#include "ops/rnn_common.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <dnnl.hpp>
#include <omp.h>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "core/simd.h"
#include "ops/dnnl_util.h"
#include "ops/factories.h"
#include "ops/matmul_primitive.h"
#include "ops/rnn_onednn.h"

namespace onnxtrain::ops {

namespace rnn {

namespace {

struct ActInfo {
  const char* name;
  ActKind kind;
  bool takes_alpha, takes_beta;
  float alpha, beta;  // defaults
};

constexpr ActInfo kActivations[] = {
    {"Relu", ActKind::Relu, false, false, 0.0f, 0.0f},
    {"Tanh", ActKind::Tanh, false, false, 0.0f, 0.0f},
    {"Sigmoid", ActKind::Sigmoid, false, false, 0.0f, 0.0f},
    {"Affine", ActKind::Affine, true, true, 1.0f, 0.0f},
    {"LeakyRelu", ActKind::LeakyRelu, true, false, 0.01f, 0.0f},
    {"ThresholdedRelu", ActKind::ThresholdedRelu, true, false, 1.0f, 0.0f},
    {"ScaledTanh", ActKind::ScaledTanh, true, true, 1.0f, 1.0f},
    {"HardSigmoid", ActKind::HardSigmoid, true, true, 0.2f, 0.5f},
    {"Elu", ActKind::Elu, true, false, 1.0f, 0.0f},
    {"Softsign", ActKind::Softsign, false, false, 0.0f, 0.0f},
    {"Softplus", ActKind::Softplus, false, false, 0.0f, 0.0f},
};

bool same_name(std::string_view a, std::string_view b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
  });
}

const ActInfo& find_activation(const std::string& name) {
  for (const ActInfo& info : kActivations) {
    if (same_name(info.name, name)) return info;
  }
  std::string known;
  for (const ActInfo& info : kActivations) known += (known.empty() ? "" : ", ") + std::string(info.name);
  throw Error("attribute 'activations' names unknown function '" + name + "'; expected one of " + known);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Attributes

RnnAttrs parse_attrs(const KernelInit& init) {
  RnnAttrs a;
  // ai.onnxtrain's RNNGrad, GRUGrad, LSTMGrad and RNNTraining, GRUTraining, LSTMTraining carry
  // the forward node's attributes verbatim and read `layout` at any opset.
  const bool gradient = init.node().domain == "ai.onnxtrain";
  const std::string& type = init.op_type();
  std::string op = type;
  for (const std::string suffix : {"Grad", "Training"}) {
    if (gradient && op.ends_with(suffix)) op.resize(op.size() - suffix.size());
  }
  a.op = op;
  a.cell = op == "RNN" ? Cell::Rnn : op == "GRU" ? Cell::Gru : Cell::Lstm;

  const std::string direction = init.attr_string("direction", "forward");
  if (direction == "forward") {
    a.direction = Direction::Forward;
  } else if (direction == "reverse") {
    a.direction = Direction::Reverse;
  } else if (direction == "bidirectional") {
    a.direction = Direction::Bidirectional;
    a.num_directions = 2;
  } else {
    throw Error("attribute 'direction' is '" + direction +
                "', expected 'forward', 'reverse' or 'bidirectional'");
  }

  if (init.has_attr("hidden_size")) {
    a.hidden_size = init.attr_int("hidden_size", 0);
    if (*a.hidden_size <= 0) {
      throw Error("attribute 'hidden_size' is " + std::to_string(*a.hidden_size) + ", expected > 0");
    }
  }
  if (init.has_attr("clip")) {
    a.clip = init.attr_float("clip", 0.0f);
    if (!(*a.clip > 0.0f)) {
      throw Error("attribute 'clip' is " + std::to_string(*a.clip) + ", expected a positive threshold");
    }
  }
  if (gradient || init.opset() >= 14) {
    const int64_t layout = init.attr_int("layout", 0);
    if (layout != 0 && layout != 1) {
      throw Error("attribute 'layout' is " + std::to_string(layout) + ", expected 0 or 1");
    }
    a.batch_first = layout == 1;
  }
  if (a.cell == Cell::Gru) a.linear_before_reset = init.attr_int("linear_before_reset", 0) != 0;
  if (a.cell == Cell::Lstm) {
    const int64_t input_forget = init.attr_int("input_forget", 0);
    if (input_forget != 0 && input_forget != 1) {
      throw Error("attribute 'input_forget' is " + std::to_string(input_forget) + ", expected 0 or 1");
    }
    a.input_forget = input_forget == 1;
  }

  // Activations: defaults per cell, or the attribute's list with alpha/beta consumed in order.
  const std::vector<std::string> defaults =
      a.cell == Cell::Rnn   ? std::vector<std::string>{"Tanh"}
      : a.cell == Cell::Gru ? std::vector<std::string>{"Sigmoid", "Tanh"}
                            : std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"};
  a.acts_per_direction = static_cast<int64_t>(defaults.size());
  std::vector<std::string> names = defaults;
  if (const ir::Attribute* attr = init.attr("activations")) {
    if (attr->type != ir::AttributeType::Strings) throw Error("attribute 'activations' must be a list of strings");
    names = attr->strings;
  }
  const auto per_direction = static_cast<size_t>(a.acts_per_direction);
  const auto all = per_direction * static_cast<size_t>(a.num_directions);
  if (names.size() != per_direction && names.size() != all) {
    throw Error("attribute 'activations' has " + std::to_string(names.size()) + " functions, expected " +
                std::to_string(all) + " (" + std::to_string(per_direction) + " per direction) for " + op +
                " with direction '" + direction + "'");
  }
  const std::vector<float> alphas = init.attr_floats("activation_alpha");
  const std::vector<float> betas = init.attr_floats("activation_beta");
  size_t next_alpha = 0, next_beta = 0;
  for (const std::string& name : names) {
    const ActInfo& info = find_activation(name);
    Activation act{info.kind, info.alpha, info.beta};
    if (info.takes_alpha && next_alpha < alphas.size()) act.alpha = alphas[next_alpha++];
    if (info.takes_beta && next_beta < betas.size()) act.beta = betas[next_beta++];
    a.activations.push_back(act);
  }
  if (a.activations.size() < all) {  // one list for both directions
    a.activations.insert(a.activations.end(), a.activations.begin(), a.activations.end());
  }
  return a;
}

bool slope_reads_input(ActKind kind) {
  switch (kind) {
    case ActKind::Relu:
    case ActKind::LeakyRelu:
    case ActKind::ThresholdedRelu:
    case ActKind::HardSigmoid:
    case ActKind::Elu:
    case ActKind::Softsign:
      return true;
    case ActKind::Tanh:
    case ActKind::Sigmoid:
    case ActKind::Affine:
    case ActKind::ScaledTanh:
    case ActKind::Softplus:
      return false;
  }
  return true;
}

bool is_default_lstm(const RnnAttrs& a, bool has_peepholes, int64_t d) {
  return a.cell == Cell::Lstm && !has_peepholes && !a.clip && !a.input_forget &&
         a.act(d, 0).kind == ActKind::Sigmoid && a.act(d, 1).kind == ActKind::Tanh &&
         a.act(d, 2).kind == ActKind::Tanh;
}

bool keeps_pre_activations(const RnnAttrs& a) {
  if (a.clip) return true;
  for (int64_t d = 0; d < a.num_directions; ++d) {
    // LSTM's third function (h) acts on the cell state, which the trace keeps anyway.
    const int64_t gate_functions = a.cell == Cell::Lstm ? 2 : a.acts_per_direction;
    for (int64_t k = 0; k < gate_functions; ++k) {
      if (slope_reads_input(a.act(d, k).kind)) return true;
    }
  }
  return false;
}

bool trace_keeps_inputs(const RnnAttrs& a, const RnnShape& s, const std::vector<int64_t>& lens) {
  if (a.cell == Cell::Gru || s.directions != 1 || a.reverse(0) || s.batch_first) return false;
  return std::all_of(lens.begin(), lens.end(), [&](int64_t len) { return len == s.seq; });
}

TraceLayout trace_layout(const RnnAttrs& a, const RnnShape& s, const std::vector<int64_t>& lens) {
  const int64_t NH = s.batch * s.hidden, gate_values = s.seq * NH * s.gates;
  TraceLayout l;
  const bool inputs = trace_keeps_inputs(a, s, lens);
  l.h_width = inputs ? s.input + s.hidden : s.hidden;
  l.h_column = inputs ? s.input : 0;
  int64_t next = 0;
  auto take = [&](int64_t n) {
    const int64_t offset = next;
    next += n;
    return offset;
  };
  if (keeps_pre_activations(a)) l.pre = take(gate_values);
  l.gates = take(gate_values);
  l.h = take((s.seq + 1) * s.batch * l.h_width);
  if (a.cell == Cell::Lstm) {
    l.c = take((s.seq + 1) * NH);
    l.hc = take(s.seq * NH);
  }
  if (a.cell == Cell::Gru && a.linear_before_reset) l.hr = take(s.seq * NH);
  l.elements = next;
  return l;
}

// ---------------------------------------------------------------------------------------------
// Shapes and inputs

void expect_shape(const KernelContext& ctx, int i, const Shape& want, const std::string& meaning) {
  const Tensor& t = ctx.input(i);
  if (t.shape() != want) {
    fail("input " + ctx.input_name(i) + " has shape " + t.shape().to_string() + ", expected " +
         meaning + " = " + want.to_string());
  }
}

// Checks every input's dtype and shape; returns the problem's sizes.
RnnShape check_inputs(const KernelContext& ctx, const RnnAttrs& a) {
  const Tensor& x = ctx.input(kX);
  if (x.rank() != 3) {
    fail("input " + ctx.input_name(kX) + " has shape " + x.shape().to_string() + ", expected rank 3 " +
         (a.batch_first ? "[batch_size, seq_length, input_size]" : "[seq_length, batch_size, input_size]"));
  }
  for (int i : {kW, kR, kB, kInitialH, kInitialC, kP}) {
    if (i == kInitialC && a.cell != Cell::Lstm) continue;
    if (i == kP && a.cell != Cell::Lstm) continue;
    if (ctx.has_input(i) && ctx.input(i).dtype() != x.dtype()) {
      fail("input " + ctx.input_name(i) + " is " + ctx.input(i).description() + ", expected " +
           std::string(dtype_name(x.dtype())) + " like " + ctx.input_name(kX));
    }
  }
  RnnShape s;
  s.batch_first = a.batch_first;
  s.directions = a.num_directions;
  s.gates = a.gates();
  s.seq = x.dim(a.batch_first ? 1 : 0);
  s.batch = x.dim(a.batch_first ? 0 : 1);
  s.input = x.dim(2);
  const Tensor& r = ctx.input(kR);
  if (a.hidden_size) {
    s.hidden = *a.hidden_size;
  } else if (r.rank() == 3 && r.dim(2) > 0) {
    s.hidden = r.dim(2);
  } else {
    fail("input " + ctx.input_name(kR) + " has shape " + r.shape().to_string() +
         ", expected [num_directions, " + std::to_string(s.gates) + "*hidden_size, hidden_size]");
  }
  const int64_t D = s.directions, GH = s.gates * s.hidden, H = s.hidden;
  const std::string g = std::to_string(s.gates);
  expect_shape(ctx, kW, Shape{D, GH, s.input}, "[num_directions, " + g + "*hidden_size, input_size]");
  expect_shape(ctx, kR, Shape{D, GH, H}, "[num_directions, " + g + "*hidden_size, hidden_size]");
  if (ctx.has_input(kB)) {
    expect_shape(ctx, kB, Shape{D, 2 * GH}, "[num_directions, " + std::to_string(2 * s.gates) + "*hidden_size]");
  }
  const Shape state = s.state_shape();
  const std::string state_meaning =
      a.batch_first ? "[batch_size, num_directions, hidden_size]" : "[num_directions, batch_size, hidden_size]";
  if (ctx.has_input(kInitialH)) expect_shape(ctx, kInitialH, state, state_meaning);
  if (a.cell == Cell::Lstm) {
    if (ctx.has_input(kInitialC)) expect_shape(ctx, kInitialC, state, state_meaning);
    if (ctx.has_input(kP)) expect_shape(ctx, kP, Shape{D, 3 * H}, "[num_directions, 3*hidden_size]");
  }
  return s;
}

// Each batch entry's sequence length, checked against [0, seq_length].
std::vector<int64_t> sequence_lengths(const KernelContext& ctx, const RnnShape& s) {
  if (!ctx.has_input(kSeqLens)) return std::vector<int64_t>(static_cast<size_t>(s.batch), s.seq);
  const Tensor& t = ctx.input(kSeqLens);
  if (t.dtype() != DataType::Int32 && t.dtype() != DataType::Int64) {
    fail("input " + ctx.input_name(kSeqLens) + " is " + t.description() + ", expected int32");
  }
  expect_shape(ctx, kSeqLens, Shape{s.batch}, "[batch_size]");
  std::vector<int64_t> lens = t.to_int64_vector("input " + ctx.input_name(kSeqLens));
  for (size_t b = 0; b < lens.size(); ++b) {
    if (lens[b] < 0 || lens[b] > s.seq) {
      fail("input " + ctx.input_name(kSeqLens) + " holds " + std::to_string(lens[b]) + " at batch entry " +
           std::to_string(b) + ", expected a length in [0, seq_length = " + std::to_string(s.seq) + "]");
    }
  }
  return lens;
}

RnnTensors load_inputs(const KernelContext& ctx, const RnnAttrs& a, bool to_float32) {
  auto take = [&](int i) {
    if (!ctx.has_input(i)) return Tensor();
    return to_float32 ? ctx.input(i).cast(DataType::Float32) : ctx.input(i);
  };
  RnnTensors in;
  in.x = take(kX);
  in.w = take(kW);
  in.r = take(kR);
  in.b = take(kB);
  in.initial_h = take(kInitialH);
  if (a.cell == Cell::Lstm) {
    in.initial_c = take(kInitialC);
    in.p = take(kP);
  }
  return in;
}

// ---------------------------------------------------------------------------------------------
// Matrix products

namespace {
// c [M, N] (+)= op(a) [M, K] op(b) [K, N] by oneDNN's matmul primitive (ops/matmul_primitive.h),
// op transposing a (stored [K, M]) or b (stored [N, K]) where asked, every operand described by
// its leading dimension (accumulate: a sum post-op). The entries are kept per thread (their
// memory objects are rebound per call) by shape. False when oneDNN has no implementation (the
// caller's sgemm then).
bool strided_product(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* a, int64_t lda,
                     const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  namespace du = dnnl_util;
  thread_local std::map<std::array<int64_t, 10>, MatMulEntry> cache;
  const std::array<int64_t, 10> key{M, N, K, lda, ldb, ldc, accumulate ? 1 : 0, omp_get_max_threads(),
                                    trans_a ? 1 : 0, trans_b ? 1 : 0};
  auto it = cache.find(key);
  if (it == cache.end()) {
    if (cache.size() >= 16) cache.clear();  // a handful of shapes per model
    dnnl::primitive_attr attr;
    if (accumulate) {
      du::checked("set a sum post-op", [&] {
        dnnl::post_ops ops;
        ops.append_sum(1.0f);
        attr.set_post_ops(ops);
      });
    }
    const dnnl::memory::dims a_strides = trans_a ? dnnl::memory::dims{1, lda} : dnnl::memory::dims{lda, 1};
    const dnnl::memory::dims b_strides = trans_b ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1};
    it = cache.emplace(key, make_entry(du::strided_f32({M, K}, a_strides), du::strided_f32({K, N}, b_strides),
                                       du::strided_f32({M, N}, {ldc, 1}), attr))
             .first;
  }
  if (it->second.use_reference) return false;
  execute(it->second, a, b, c);
  return true;
}

// H R^T for one thread's rows of a recurrence, rows x GH = [rows, H] x [GH, H]^T, through oneDNN's
// matmul primitive reading R from a copy in the layout the primitive prefers, made once per
// direction and run (R is the same at every step) instead of sgemm, which packs R again at each
// call. One thread's share of bench/workloads.py's LSTM at batch 64 (32 rows, H 256, 4H 1024), 64
// steps on each of two threads at once, with a pass over each step's result between the products
// (a one-off program, AMD EPYC Zen 4, six rounds): 9.6-9.8 ms against sgemm's 12.2-12.3. Kept per
// thread (each thread its own primitive, memories and copy of R); AVX-512 only (elsewhere
// oneDNN's matmul runs the same sgemm).
class PackedRecurrentProduct {
 public:
  // Copies R [GH, H] (row-major) for products of `rows` rows; false where this does not apply
  // (no AVX-512, or oneDNN has no implementation or fails): then run() is not called. Called and
  // run inside parallel regions, so nothing here throws.
  bool pack(const float* R, int64_t rows, int64_t H, int64_t GH) noexcept {
    if (!dnnl_util::has_avx512()) return false;
    try {
      auto& entries = thread_entries();
      const std::array<int64_t, 3> key{rows, H, GH};
      auto it = entries.find(key);
      if (it == entries.end()) {
        if (entries.size() >= 8) entries.clear();  // a handful of shapes per model
        it = entries.emplace(key, plan(rows, H, GH)).first;
      }
      Entry& e = it->second;
      if (!e.planned) return false;
      e.source.set_data_handle(const_cast<float*>(R));
      e.reorder.execute(dnnl_util::cpu_stream(), e.source, e.packed);
      dnnl_util::cpu_stream().wait();
      entry_ = &e;
      return true;
    } catch (...) {  // dnnl::error, std::bad_alloc: the caller's sgemm
      return false;
    }
  }

  // rec [rows, GH] = h [rows, H] R^T, for the rows and the R given to pack(); false, having
  // written nothing the caller keeps, when oneDNN fails (the caller's sgemm then).
  bool run(const float* h, float* rec) noexcept {
    try {
      execute(entry_->product, h, static_cast<const float*>(entry_->packed.get_data_handle()), rec);
      return true;
    } catch (...) {
      return false;
    }
  }

 private:
  struct Entry {
    bool planned = false;
    MatMulEntry product;          // the primitive, its weights read from `packed`
    dnnl::memory source, packed;  // R as stored; R in the primitive's layout
    dnnl::reorder reorder;        // source -> packed
  };

  static std::map<std::array<int64_t, 3>, Entry>& thread_entries() {
    thread_local std::map<std::array<int64_t, 3>, Entry> entries;  // by rows, H, GH
    return entries;
  }

  static Entry plan(int64_t rows, int64_t H, int64_t GH) {
    namespace du = dnnl_util;
    Entry e;
    const dnnl::engine& engine = du::cpu_engine();
    const auto src = du::plain_f32({rows, H}), dst = du::plain_f32({rows, GH});
    const auto r_transposed = du::strided_f32({H, GH}, {1, H});  // R^T, R stored [GH, H]
    const auto wanted = dnnl::memory::desc({H, GH}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::any);
    try {  // no implementation (dnnl::error): sgemm
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, wanted, dst), engine);
      e.product = make_entry(src, pd.weights_desc(), dst, dnnl::primitive_attr());
      if (e.product.use_reference) return e;
      e.source = dnnl::memory(r_transposed, engine, nullptr);
      e.packed = dnnl::memory(pd.weights_desc(), engine);
      e.reorder = dnnl::reorder(e.source, e.packed);
      e.planned = true;
    } catch (const dnnl::error&) {
      e.planned = false;
    }
    return e;
  }

  Entry* entry_ = nullptr;
};
}  // namespace

template <class V>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const V* a, int64_t lda, const V* b,
          int64_t ldb, V* c, int64_t ldc, bool accumulate) {
  if (M == 0 || N == 0) return;
  if constexpr (std::is_same_v<V, float>) {
    // Outside parallel regions only: the per-thread recurrences call this too, on their own rows.
    if (trans_a && !trans_b && transposed_a_prefers_swap(M, N, K) && !omp_in_parallel()) {
      swapped_transposed_a_product(M, N, K, 1.0f, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc);
      return;
    }
    if (trans_a && !trans_b && transposed_a_prefers_matmul(M, N, K) && !omp_in_parallel() &&
        strided_product(true, false, M, N, K, a, lda, b, ldb, c, ldc, accumulate)) {
      return;
    }
    if (!trans_a && trans_b && transposed_b_prefers_matmul(M, N, K) && !omp_in_parallel() &&
        strided_product(false, true, M, N, K, a, lda, b, ldb, c, ldc, accumulate)) {
      return;
    }
  }
  if (K == 0) {
    if (!accumulate) {
      for (int64_t m = 0; m < M; ++m) std::fill(c + m * ldc, c + m * ldc + N, V(0));
    }
    return;
  }
  if constexpr (std::is_same_v<V, float>) {
    const dnnl_status_t st = row_major_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, 1.0f, a, lda, b,
                                             ldb, accumulate ? 1.0f : 0.0f, c, ldc);
    if (st != dnnl_success) {
      throw Error("oneDNN sgemm failed for [" + std::to_string(M) + "x" + std::to_string(K) + "] * [" +
                  std::to_string(K) + "x" + std::to_string(N) + "] (status " +
                  std::to_string(static_cast<int>(st)) + ")");
    }
  } else {
    // Row m of c: dot products with b's rows when b is transposed, else a sum of b's rows.
    const int64_t grain = std::max<int64_t>(1, kParallelGrain / (N * K));
    parallel_for(M, grain, [&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m) {
        V* __restrict out = c + m * ldc;
        if (!accumulate) std::fill(out, out + N, V(0));
        const int64_t a_step = trans_a ? lda : 1;
        const V* a_row = trans_a ? a + m : a + m * lda;
        if (trans_b) {
          for (int64_t n = 0; n < N; ++n) {
            const V* __restrict col = b + n * ldb;
            V dot = 0;
#pragma omp simd reduction(+ : dot)
            for (int64_t k = 0; k < K; ++k) dot += a_row[k * a_step] * col[k];
            out[n] += dot;
          }
        } else {
          for (int64_t k = 0; k < K; ++k) {
            const V av = a_row[k * a_step];
            const V* __restrict row = b + k * ldb;
            for (int64_t n = 0; n < N; ++n) out[n] += av * row[n];
          }
        }
      }
    });
  }
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t,
                          float*, int64_t, bool);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, const double*, int64_t, const double*, int64_t,
                           double*, int64_t, bool);

// ---------------------------------------------------------------------------------------------
// The recurrence

namespace {

template <class V>
class Recurrence {
 public:
  Recurrence(const RnnAttrs& a, const RnnShape& s, const std::vector<int64_t>& lens, const RnnTensors& in,
             Trace<V>* trace, RecurrenceBuffers<V>& buffers)
      : a_(a), s_(s), lens_(lens), in_(in), trace_(trace), xw_(buffers.xw), rec_(buffers.rec), h_(buffers.h),
        c_(buffers.c), bias_(buffers.bias), scratch_(buffers.scratch), wr_(buffers.wr) {
    max_len_ = lens.empty() ? 0 : *std::max_element(lens.begin(), lens.end());
  }

  // Runs direction d and writes Y, Y_h, Y_c where not null (in the layout of the attributes).
  void run(int64_t d, V* y, V* y_h, V* y_c) {
    const int64_t N = s_.batch, H = s_.hidden, GH = s_.gates * H;
    default_cell_ = is_default_lstm(a_, in_.p.defined(), d);
    const int split_threads = rowwise() ? 1 : batch_split_threads();
    inputs_in_steps_ = split_threads > 1 && default_cell_ && s_.input * kInputsInStepsRatio <= H;
    xw_.resize(static_cast<size_t>(inputs_in_steps_ ? 0 : s_.seq * N * GH));
    rec_.resize(static_cast<size_t>(N * GH));
    h_.resize(static_cast<size_t>(N * H));
    c_.resize(static_cast<size_t>(a_.cell == Cell::Lstm ? N * H : 0));
    scratch_.assign(static_cast<size_t>(N * H), V(0));
    if (trace_) trace_->steps = max_len_;
    bias_in_cell_ = std::is_same_v<V, float> && default_cell_ && !rowwise() && in_.b.defined();
    const bool reverse = a_.reverse(d);
    project_inputs(d);
    load_state(s_, in_.initial_h, d, h_.data());
    if (a_.cell == Cell::Lstm) load_state(s_, in_.initial_c, d, c_.data());
    if (rowwise()) {
      lstm_rowwise(d, reverse, y);
    } else if (split_threads > 1) {
      lstm_batch_split(d, reverse, y, split_threads);
    } else {
      for (int64_t step = 0; step < max_len_; ++step) {
        if (trace_) record_states(step);
        switch (a_.cell) {
          case Cell::Rnn: rnn_step(d, step, reverse, y); break;
          case Cell::Gru: gru_step(d, step, reverse, y); break;
          case Cell::Lstm: lstm_step(d, step, reverse, y); break;
        }
      }
    }
    if (trace_) record_states(max_len_);
    if (y_h) store_state(s_, h_.data(), d, y_h);
    if (y_c) store_state(s_, c_.data(), d, y_c);
  }

 private:
  const V* weights(const Tensor& t, int64_t d) const { return RnnTensors::of_direction<V>(t, d, s_.directions); }

  void record_states(int64_t step) { record_states(step, 0, s_.batch); }
  // The states of batch entries [b0, b1) before `step` (rows of the trace's h and c), and under
  // trace_keeps_inputs X's row of time `step` before each h (every entry runs every step there).
  // Measured with the backward pass reading them (rnn_grad.cpp weight_gradients) instead of
  // copying [X, H_prev] into its own buffer, bench/workloads.py's LSTM: LSTMGrad 37.5-37.8 ms a
  // step against 38.3-38.4, LSTMTraining 22.0-22.6 against 21.8-22.4 (the X rows copied here;
  // the first layer's step products read these rows instead of a copy of their own), the step's
  // kernels 61.4-62.2 against 62.0-62.7 (ONNXTRAIN_PROFILE, 33 minus 3 steps, three alternating
  // pairs); LSTMGrad keeps no [X, H_prev] buffer (4.7 and 8.4 MB at the two layers), the traces
  // grow by X's rows (0.5 and 4.2 MB).
  void record_states(int64_t step, int64_t b0, int64_t b1) {
    const int64_t H = s_.hidden, NH = s_.batch * H;
    if (trace_->h_column == 0) {
      std::copy(h_.begin() + b0 * H, h_.begin() + b1 * H, trace_->h + step * NH + b0 * H);
    } else {  // trace_keeps_inputs: rows [X[step], H], every entry at time step (none after the last)
      for (int64_t b = b0; b < b1; ++b) input_row(step < s_.seq ? step : -1, b, trace_->h_row(step, b, s_.batch) - s_.input);
    }
    if (a_.cell == Cell::Lstm) std::copy(c_.begin() + b0 * H, c_.begin() + b1 * H, trace_->c + step * NH + b0 * H);
  }
  // row [I + H] = [X row of time t (left as it is for t < 0), h_'s row] of batch entry b.
  void input_row(int64_t t, int64_t b, V* row) const {
    const int64_t I = s_.input, H = s_.hidden;
    if (t >= 0) std::copy_n(in_.x.data<V>() + s_.x_row(t, b) * I, I, row);
    std::copy_n(h_.data() + b * H, H, row + I);
  }
  // Keeps n values of batch entry b at `step` in `to` ([steps, batch, width]) from `column` on.
  void record(V* to, int64_t width, int64_t step, int64_t b, int64_t column, const V* g, int64_t n) {
    if (to) std::copy(g, g + n, to + (step * s_.batch + b) * width + column);
  }
  // g[0..n) = act(clip(g)) for gate columns [column, column + n) of entry b at `step`.
  void apply_gate(const Activation& act, int64_t step, int64_t b, int64_t column, V* g, int64_t n) {
    const int64_t GH = s_.gates * s_.hidden;
    if (trace_) record(trace_->pre, GH, step, b, column, g, n);
    maybe_clip(g, n);
    activate(act, g, n);
    if (trace_) record(trace_->gates, GH, step, b, column, g, n);
  }

  // xw_ = X W^T + bias for every time step, rows ordered like X's. The bias is Wb + Rb, except
  // GRU's Rbh under linear_before_reset, which the step adds inside r . (...). Under
  // bias_in_cell_ xw_ is X W^T alone and default_lstm_cell adds bias_ as it reads a row: that
  // saves a pass over xw_ ([S * N, 4H], 16.8 MB for bench/workloads.py's LSTM at batch 64),
  // and the sums are the same, (x W^T + bias) + h R^T in that order.
  void project_inputs(int64_t d) {
    const int64_t rows = s_.seq * s_.batch, GH = s_.gates * s_.hidden, H = s_.hidden;
    if (!inputs_in_steps_) {
      gemm<V>(false, true, rows, GH, s_.input, in_.x.data<V>(), s_.input, weights(in_.w, d), s_.input, xw_.data(), GH,
              false);
    }
    if (!in_.b.defined()) return;
    const V* wb = weights(in_.b, d);
    const V* rb = wb + GH;
    bias_.resize(static_cast<size_t>(GH));
    for (int64_t j = 0; j < GH; ++j) bias_[static_cast<size_t>(j)] = wb[j] + rb[j];
    if (a_.cell == Cell::Gru && a_.linear_before_reset) {
      for (int64_t j = 2 * H; j < 3 * H; ++j) bias_[static_cast<size_t>(j)] = wb[j];
    }
    if (bias_in_cell_) return;
    parallel_for(rows, std::max<int64_t>(1, kParallelGrain / GH), [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        V* __restrict out = xw_.data() + row * GH;
        const V* __restrict bias = bias_.data();
        for (int64_t j = 0; j < GH; ++j) out[j] += bias[j];
      }
    });
  }

  template <class F>
  void for_active(int64_t step, bool reverse, int64_t work_per_entry, F&& f) const {
    rnn::for_active(lens_, step, reverse, work_per_entry, std::forward<F>(f));
  }

  void maybe_clip(V* x, int64_t n) const {
    if (a_.clip) clip_to(x, n, static_cast<V>(*a_.clip));
  }

  // rec_ = h_ R^T for the rows [first, first + count) of R (in gate rows).
  void recurrent_product(int64_t d, const V* h, int64_t first_row, int64_t count) {
    const int64_t H = s_.hidden, GH = s_.gates * H;
    gemm<V>(false, true, s_.batch, count, H, h, H, weights(in_.r, d) + first_row * H, H, rec_.data() + first_row, GH,
            false);
  }

  void rnn_step(int64_t d, int64_t step, bool reverse, V* y) {
    const int64_t H = s_.hidden;
    recurrent_product(d, h_.data(), 0, H);
    const Activation& f = a_.act(d, 0);
    for_active(step, reverse, 4 * H, [&](int64_t b, int64_t t) {
      V* __restrict g = rec_.data() + b * H;
      const V* __restrict x = xw_.data() + s_.x_row(t, b) * H;
      for (int64_t j = 0; j < H; ++j) g[j] += x[j];
      apply_gate(f, step, b, 0, g, H);
      std::copy(g, g + H, h_.data() + b * H);
      if (y) std::copy(g, g + H, y + s_.y_offset(t, d, b));
    });
  }

  void gru_step(int64_t d, int64_t step, bool reverse, V* y) {
    const int64_t H = s_.hidden, GH = 3 * H;
    const Activation& f = a_.act(d, 0);
    const Activation& g_act = a_.act(d, 1);
    const bool lbr = a_.linear_before_reset;
    // z and r (and, before the reset, H Rh^T).
    recurrent_product(d, h_.data(), 0, lbr ? GH : 2 * H);
    for_active(step, reverse, 8 * H, [&](int64_t b, int64_t t) {
      V* __restrict g = rec_.data() + b * GH;
      const V* __restrict x = xw_.data() + s_.x_row(t, b) * GH;
      for (int64_t j = 0; j < 2 * H; ++j) g[j] += x[j];
      apply_gate(f, step, b, 0, g, 2 * H);
      if (!lbr) {  // scratch = r . H, the input of the hidden gate's product
        const V* __restrict r = g + H;
        const V* __restrict h = h_.data() + b * H;
        V* __restrict rh = scratch_.data() + b * H;
        for (int64_t j = 0; j < H; ++j) rh[j] = r[j] * h[j];
      }
    });
    if (!lbr) recurrent_product(d, scratch_.data(), 2 * H, H);
    const V* rbh = lbr && in_.b.defined() ? weights(in_.b, d) + GH + 2 * H : nullptr;
    for_active(step, reverse, 8 * H, [&](int64_t b, int64_t t) {
      V* __restrict g = rec_.data() + b * GH;
      const V* __restrict x = xw_.data() + s_.x_row(t, b) * GH + 2 * H;
      const V* __restrict z = g;
      const V* __restrict r = g + H;
      V* __restrict hh = g + 2 * H;
      if (lbr) {
        if (rbh) {
          for (int64_t j = 0; j < H; ++j) hh[j] += rbh[j];
        }
        if (trace_) record(trace_->hr, H, step, b, 0, hh, H);
        for (int64_t j = 0; j < H; ++j) hh[j] = x[j] + r[j] * hh[j];
      } else {
        for (int64_t j = 0; j < H; ++j) hh[j] += x[j];
      }
      apply_gate(g_act, step, b, 2 * H, hh, H);
      V* __restrict h = h_.data() + b * H;
      for (int64_t j = 0; j < H; ++j) h[j] = (V(1) - z[j]) * hh[j] + z[j] * h[j];
      if (y) std::copy(h, h + H, y + s_.y_offset(t, d, b));
    });
  }

  // g[j] = x[j] + R[j, :] . h for j in [first, end), R row-major [*, K]: eight rows at a time,
  // each with its own vector accumulator (one chain per row would wait on the FMA latency),
  // their lanes summed as one vector (simd::lane_sums). bench/workloads.py's 2-layer LSTM at
  // batch 1 (AMD EPYC Zen 4): the recurrence alone 1.56 -> 1.36 ms on one thread and 0.73 ->
  // 0.66 on two against a scalar sum of each accumulator's lanes.
  static void recurrent_dots(const V* R, const V* h, int64_t K, int64_t first, int64_t end, const V* x, V* g) {
    int64_t j = first;
    if constexpr (std::is_same_v<V, float>) {
      constexpr int W = 8;
      using F = simd::Floats<W>;
      if (K % W == 0) {
        for (; j + 8 <= end; j += 8) {
          F acc[8] = {};
          for (int64_t k = 0; k < K; k += W) {
            const F hv = simd::load<W>(h + k);
            for (int r = 0; r < 8; ++r) acc[r] += simd::load<W>(R + (j + r) * K + k) * hv;
          }
          simd::store<8>(g + j, simd::load<8>(x + j) + simd::lane_sums(acc));
        }
      }
    }
    for (; j < end; ++j) {
      const V* __restrict row = R + j * K;
      V dot = 0;
      for (int64_t k = 0; k < K; ++k) dot += row[k] * h[k];
      g[j] = x[j] + dot;
    }
  }

  // Whether the LSTM runs as lstm_rowwise: float32 without a trace (inference) at batch 1, where
  // H R^T is one row of dot products per gate unit. bench/workloads.py's 2-layer LSTM (hidden
  // 256, sequence 64), 2 threads, alternating runs: 0.85-1.14 ms through sgemm, 0.75-1.03 ms
  // this way (ONNX Runtime 0.74-1.06 in the same minutes).
  bool rowwise() const {
    return std::is_same_v<V, float> && a_.cell == Cell::Lstm && !trace_ && s_.batch <= kRowwiseBatch;
  }
  static constexpr int64_t kRowwiseBatch = 1;  // at batch 2 sgemm was faster (1.06 against 1.48 ms)

  // The whole sequence of an LSTM direction in one parallel region: each thread owns hidden
  // units [j0, j1) and, per step, computes their rows of the four gates (dot products of its
  // rows of R, which stay in its core's cache from step to step, with every entry's H[t-1]),
  // the gate arithmetic of lstm_step and its part of H[t], then waits at one barrier (the
  // general path forks twice per step: sgemm, then the gate loop). H[t-1] and H[t] alternate
  // between h_ and scratch_; the gates go to rec_, [N, 4H] as in lstm_step.
  void lstm_rowwise(int64_t d, bool reverse, V* y) {
    const int64_t N = s_.batch, H = s_.hidden, GH = 4 * H;
    const V* R = weights(in_.r, d);
    const V* p = in_.p.defined() ? weights(in_.p, d) : nullptr;
    const Activation& f = a_.act(d, 0);
    const Activation& g_act = a_.act(d, 1);
    const Activation& h_act = a_.act(d, 2);
    V* states[2] = {h_.data(), scratch_.data()};
    const int threads = static_cast<int>(
        std::clamp<int64_t>(available_threads(), 1, std::max<int64_t>(1, H / 16)));
#pragma omp parallel num_threads(threads)
    {
      const int64_t count = omp_get_num_threads(), id = omp_get_thread_num();
      const int64_t j0 = H * id / count, j1 = H * (id + 1) / count, n = j1 - j0;
      for (int64_t step = 0; step < max_len_; ++step) {
        const V* __restrict prev = states[step % 2];
        V* __restrict next = states[(step + 1) % 2];
        std::array<int64_t, kRowwiseBatch> times{};  // each entry's t, -1 once its sequence ended
        for (int64_t b = 0; b < N; ++b) times[b] = time_of(step, lens_[static_cast<size_t>(b)], reverse);
        for (int64_t b = 0; b < N; ++b) {
          if (times[b] < 0) continue;
          const V* h = prev + b * H;
          const V* x = xw_.data() + s_.x_row(times[b], b) * GH;
          for (int64_t q = 0; q < 4; ++q) {
            recurrent_dots(R, h, H, q * H + j0, q * H + j1, x, rec_.data() + b * GH);
          }
        }
        for (int64_t b = 0; b < N; ++b) {
          const int64_t t = times[b];
          if (t < 0) {  // the entry's sequence has ended: its state stays
            std::copy(prev + b * H + j0, prev + b * H + j1, next + b * H + j0);
            continue;
          }
          V* __restrict g = rec_.data() + b * GH;
          V* __restrict gi = g + j0;
          V* __restrict go = g + H + j0;
          V* __restrict gf = g + 2 * H + j0;
          V* __restrict gc = g + 3 * H + j0;
          V* __restrict c = c_.data() + b * H + j0;
          if (p) {
            for (int64_t j = 0; j < n; ++j) gi[j] += p[j0 + j] * c[j];
            for (int64_t j = 0; j < n; ++j) gf[j] += p[2 * H + j0 + j] * c[j];
          }
          apply_gate(f, step, b, 0, gi, n);
          if (a_.input_forget) {
            for (int64_t j = 0; j < n; ++j) gf[j] = V(1) - gi[j];
          } else {
            apply_gate(f, step, b, 2 * H, gf, n);
          }
          apply_gate(g_act, step, b, 3 * H, gc, n);
          for (int64_t j = 0; j < n; ++j) c[j] = gf[j] * c[j] + gi[j] * gc[j];
          if (p) {
            for (int64_t j = 0; j < n; ++j) go[j] += p[H + j0 + j] * c[j];
          }
          apply_gate(f, step, b, H, go, n);
          std::copy(c, c + n, gc);  // h(C[t]) where the candidate was: it is used up
          activate(h_act, gc, n);
          V* __restrict out = next + b * H + j0;
          for (int64_t j = 0; j < n; ++j) out[j] = go[j] * gc[j];
          if (y) std::copy(out, out + n, y + s_.y_offset(t, d, b) + j0);
        }
#pragma omp barrier
      }
    }
    if (max_len_ % 2 == 1) std::copy(scratch_.begin(), scratch_.end(), h_.begin());
  }

  void lstm_step(int64_t d, int64_t step, bool reverse, V* y) {
    recurrent_product(d, h_.data(), 0, 4 * s_.hidden);
    for_active(step, reverse, 16 * s_.hidden, [&](int64_t b, int64_t t) { lstm_cell(d, step, b, t, y); });
  }

  // Whether, and on how many threads, the LSTM runs as lstm_batch_split: float32 (oneDNN's
  // sgemm per thread) with at least kSplitRows batch entries per thread.
  int batch_split_threads() const {
    if (!std::is_same_v<V, float> || a_.cell != Cell::Lstm || omp_in_parallel()) return 1;
    return static_cast<int>(std::min<int64_t>(omp_get_max_threads(), s_.batch / kSplitRows));
  }
  static constexpr int64_t kSplitRows = 8;
  // lstm_batch_split takes X[t] W^T into each step's product (inputs_in_steps_) where
  // input_size * kInputsInStepsRatio <= hidden_size.
  static constexpr int64_t kInputsInStepsRatio = 4;

  // The whole sequence of an LSTM direction in one parallel region, the batch split between the
  // threads: batch entries are independent through time, so each thread runs the recurrence of
  // its rows [b0, b1) alone, step after step (H R^T for its rows through a single-threaded product,
  // then lstm_cell per row), with no barrier between steps; the general path forks twice per
  // step (sgemm over the batch, then the gate loop). The product is PackedRecurrentProduct's at
  // the steps where all the thread's rows run (where the first and the last of them do), sgemm
  // at the others and where that does not apply. bench/workloads.py's LSTM training step
  // (LSTMTraining, both layers, 2 threads, three alternating pairs of 8-step profiles):
  // 42.2-43.8 -> 37.0-41.0 ms against sgemm at every step. Its results, and the trace, are the
  // general path's up to float32 rounding in the products (their sums over a thread's rows may be
  // blocked otherwise than over the whole batch); the gate arithmetic per row is lstm_cell, as
  // there.
  // Under inputs_in_steps_ (a default LSTM whose input size is at most a quarter of its hidden
  // size, kInputsInStepsRatio) there is no X W^T for all steps beforehand: each step's product is
  // [X[t], H] [W, R]^T over rows of I + H (X's row copied beside H's), so its output holds both
  // terms and the cell adds only the bias. The product grows by I / H, but the pass writing xw_
  // ([S * N, 4H]) and the cells' reads of it go: bench/workloads.py's LSTM, whose first layer
  // has I = 32 and H = 256, 4096 rows: that layer's steps' products 5.8 ms a thread against 5.15,
  // its forward pass 8.5-8.6 ms against 8.1 plus 0.87 for X W^T (ONNXTRAIN_PROFILE runs of 30
  // steps, timed inside the kernel); at I = H (its second layer) the steps' products grow by as
  // much as X W^T takes at once, and LSTMTraining took 24.1-24.5 ms a step against 22.3-22.6 with
  // both layers so (three alternating pairs). The sums are X W^T + H R^T in one product, then + bias
  // (instead of (X W^T + bias) + H R^T): the same up to float32 rounding.
  void lstm_batch_split(int64_t d, bool reverse, V* y, int threads) {
    const int64_t N = s_.batch, H = s_.hidden, GH = 4 * H, I = s_.input;
    // The step's product: H R^T, or [X[t], H] [W, R]^T under inputs_in_steps_ (K = I + H).
    const int64_t K = inputs_in_steps_ ? I + H : H;
    const V* R = weights(in_.r, d);
    if (inputs_in_steps_) {  // [W, R]: each gate row of W, then R's
      const V* W = weights(in_.w, d);
      wr_.resize(static_cast<size_t>(GH * K));
      for (int64_t g = 0; g < GH; ++g) {
        std::copy(W + g * I, W + (g + 1) * I, wr_.data() + g * K);
        std::copy(R + g * H, R + (g + 1) * H, wr_.data() + g * K + I);
      }
      R = wr_.data();
    }
#pragma omp parallel num_threads(threads)
    {
      const int64_t count = omp_get_num_threads(), id = omp_get_thread_num();
      const int64_t b0 = N * id / count, b1 = N * (id + 1) / count;
      PackedRecurrentProduct packed;
      bool use_packed = false;  // the thread's rows through `packed`
      if constexpr (std::is_same_v<V, float>) use_packed = packed.pack(R, b1 - b0, K, GH);
      // Under inputs_in_steps_: the product's rows [X[t], H] of the thread's entries, which
      // record_states writes into the trace under trace_keeps_inputs, else into xh.
      const bool rows_in_trace = inputs_in_steps_ && trace_ && trace_->h_column == I;
      std::vector<V> xh(inputs_in_steps_ && !rows_in_trace ? static_cast<size_t>((b1 - b0) * K) : 0);
      for (int64_t step = 0; step < max_len_; ++step) {
        if (trace_) record_states(step, b0, b1);
        // Entries are sorted by nothing: find the span of this thread's rows still running.
        int64_t first = b1, last = b0;
        for (int64_t b = b0; b < b1; ++b) {
          if (time_of(step, lens_[static_cast<size_t>(b)], reverse) >= 0) {
            first = std::min(first, b);
            last = b + 1;
          }
        }
        if (first >= last) continue;
        const V* rows = h_.data() + b0 * H;  // the product's row of entry b0
        if (rows_in_trace) {
          rows = trace_->h_row(step, b0, N) - I;
        } else if (inputs_in_steps_) {
          for (int64_t b = first; b < last; ++b) {
            input_row(time_of(step, lens_[static_cast<size_t>(b)], reverse), b, xh.data() + (b - b0) * K);
          }
          rows = xh.data();
        }
        bool done = false;
        if constexpr (std::is_same_v<V, float>) {
          done = use_packed && first == b0 && last == b1 && packed.run(rows, rec_.data() + b0 * GH);
        }
        if (!done) {
          gemm<V>(false, true, last - first, GH, K, rows + (first - b0) * K, K, R, K, rec_.data() + first * GH, GH,
                  false);
        }
        for (int64_t b = first; b < last; ++b) {
          const int64_t t = time_of(step, lens_[static_cast<size_t>(b)], reverse);
          if (t >= 0) lstm_cell(d, step, b, t, y);
        }
      }
    }
  }

  // lstm_cell for a float32 default LSTM: the gates i, o, f (contiguous) through one sigmoid call
  // and c through one tanh, written straight into the trace's row (or in place without a trace),
  // and h(C[t]) likewise, instead of four gate passes each followed by a copy into the trace.
  // The same functions on the same values: the results are lstm_cell's.
  void default_lstm_cell(int64_t step, int64_t b, int64_t t, V* y, int64_t d) {
    const int64_t H = s_.hidden, GH = 4 * H;
    V* __restrict g = rec_.data() + b * GH;
    if (inputs_in_steps_) {  // g holds X[t] W^T + H R^T
      if (bias_in_cell_) {
        const V* __restrict bias = bias_.data();
        for (int64_t j = 0; j < GH; ++j) g[j] += bias[j];
      }
    } else if (bias_in_cell_) {
      const V* __restrict x = xw_.data() + s_.x_row(t, b) * GH;
      const V* __restrict bias = bias_.data();
      for (int64_t j = 0; j < GH; ++j) g[j] += x[j] + bias[j];
    } else {
      const V* __restrict x = xw_.data() + s_.x_row(t, b) * GH;
      for (int64_t j = 0; j < GH; ++j) g[j] += x[j];
    }
    V* __restrict gates = trace_ ? trace_->gates + (step * s_.batch + b) * GH : g;
    vmath::sigmoid(g, gates, 3 * H);
    vmath::tanh(g + 3 * H, gates + 3 * H, H);
    const V *__restrict gi = gates, *__restrict go = gates + H, *__restrict gf = gates + 2 * H,
                        *__restrict gc = gates + 3 * H;
    V* __restrict c = c_.data() + b * H;
    for (int64_t j = 0; j < H; ++j) c[j] = gf[j] * c[j] + gi[j] * gc[j];
    V* __restrict hc = trace_ ? trace_->hc + (step * s_.batch + b) * H : scratch_.data() + b * H;
    vmath::tanh(c, hc, H);
    V* __restrict h = h_.data() + b * H;
    for (int64_t j = 0; j < H; ++j) h[j] = go[j] * hc[j];
    if (y) std::copy(h, h + H, y + s_.y_offset(t, d, b));
  }

  // One LSTM step of batch entry b at time t: rec_'s row b holds H[t-1] R^T; adds X W^T + bias,
  // runs the gates and updates c_ and h_'s rows b (and y's, the trace's).
  void lstm_cell(int64_t d, int64_t step, int64_t b, int64_t t, V* y) {
    if constexpr (std::is_same_v<V, float>) {
      if (default_cell_) {
        default_lstm_cell(step, b, t, y, d);
        return;
      }
    }
    const int64_t H = s_.hidden, GH = 4 * H;
    const Activation& f = a_.act(d, 0);
    const Activation& g_act = a_.act(d, 1);
    const Activation& h_act = a_.act(d, 2);
    const V* p = in_.p.defined() ? weights(in_.p, d) : nullptr;
    V* __restrict g = rec_.data() + b * GH;
    const V* __restrict x = xw_.data() + s_.x_row(t, b) * GH;
    for (int64_t j = 0; j < GH; ++j) g[j] += x[j];
    V* __restrict gi = g;
    V* __restrict go = g + H;
    V* __restrict gf = g + 2 * H;
    V* __restrict gc = g + 3 * H;
    V* __restrict c = c_.data() + b * H;
    if (p) {  // peepholes on C[t-1] for i and f
      for (int64_t j = 0; j < H; ++j) gi[j] += p[j] * c[j];
      for (int64_t j = 0; j < H; ++j) gf[j] += p[2 * H + j] * c[j];
    }
    apply_gate(f, step, b, 0, gi, H);
    if (a_.input_forget) {
      for (int64_t j = 0; j < H; ++j) gf[j] = V(1) - gi[j];
      if (trace_) record(trace_->gates, GH, step, b, 2 * H, gf, H);
    } else {
      apply_gate(f, step, b, 2 * H, gf, H);
    }
    apply_gate(g_act, step, b, 3 * H, gc, H);
    for (int64_t j = 0; j < H; ++j) c[j] = gf[j] * c[j] + gi[j] * gc[j];
    if (p) {  // the output gate's peephole sees C[t]
      for (int64_t j = 0; j < H; ++j) go[j] += p[H + j] * c[j];
    }
    apply_gate(f, step, b, H, go, H);
    V* __restrict hc = scratch_.data() + b * H;
    std::copy(c, c + H, hc);
    activate(h_act, hc, H);
    if (trace_) record(trace_->hc, H, step, b, 0, hc, H);
    V* __restrict h = h_.data() + b * H;
    for (int64_t j = 0; j < H; ++j) h[j] = go[j] * hc[j];
    if (y) std::copy(h, h + H, y + s_.y_offset(t, d, b));
  }

  const RnnAttrs& a_;
  const RnnShape& s_;
  const std::vector<int64_t>& lens_;
  const RnnTensors& in_;
  Trace<V>* trace_;
  int64_t max_len_ = 0;
  bool default_cell_ = false;  // this direction is a default LSTM: float32 runs default_lstm_cell
  bool bias_in_cell_ = false;  // default_lstm_cell adds bias_ to xw_'s rows (project_inputs)
  bool inputs_in_steps_ = false;  // X[t] W^T in each step's product, no xw_ (lstm_batch_split)
  std::vector<V>& xw_;       // [S * N, G*H]: X W^T + bias (X W^T under bias_in_cell_)
  std::vector<V>& rec_;      // [N, G*H]: H R^T, then the gates of the step in place
  std::vector<V>& h_;        // [N, H]: the state of the current direction
  std::vector<V>& c_;        // LSTM: [N, H]
  std::vector<V>& bias_;     // [G*H]
  std::vector<V>& scratch_;  // [N, H]: GRU's r . H, LSTM's h(C)
  std::vector<V>& wr_;       // under inputs_in_steps_: [G*H, I + H], W's and R's rows side by side
};

}  // namespace

template <class V>
void run_direction(const RnnAttrs& a, const RnnShape& s, const std::vector<int64_t>& lens, const RnnTensors& in,
                   int64_t d, V* y, V* y_h, V* y_c, Trace<V>* trace, RecurrenceBuffers<V>& buffers) {
  Recurrence<V>(a, s, lens, in, trace, buffers).run(d, y, y_h, y_c);
}

template void run_direction<float>(const RnnAttrs&, const RnnShape&, const std::vector<int64_t>&, const RnnTensors&,
                                   int64_t, float*, float*, float*, Trace<float>*, RecurrenceBuffers<float>&);
template void run_direction<double>(const RnnAttrs&, const RnnShape&, const std::vector<int64_t>&, const RnnTensors&,
                                    int64_t, double*, double*, double*, Trace<double>*, RecurrenceBuffers<double>&);

}  // namespace rnn

namespace {

using namespace rnn;

class RnnKernel final : public Kernel {
 public:
  RnnKernel(RnnAttrs attrs, bool training, bool weights_constant)
      : a_(std::move(attrs)), training_(training), weights_constant_(weights_constant) {}

  void run(KernelContext& ctx) override {
    const RnnShape s = check_inputs(ctx, a_);
    const std::vector<int64_t> lens = sequence_lengths(ctx, s);
    const DataType dtype = ctx.input(kX).dtype();
    const int num_outputs = a_.cell == Cell::Lstm ? 3 : 2;

    visit_dtype<FloatTypes>(dtype, a_.op + " input " + ctx.input_name(kX), [&]<class T>() {
      using V = compute_t<T>;
      const RnnTensors in = load_inputs(ctx, a_, is_half_v<T>);
      // Outputs: the kernel's own for float32/float64, float32 tensors cast at the end for halves.
      Tensor out[3];
      V* ptr[3] = {nullptr, nullptr, nullptr};
      for (int i = 0; i < num_outputs; ++i) {
        if (!ctx.has_output(i)) continue;
        const Shape shape = i == kY ? s.y_shape() : s.state_shape();
        out[i] = is_half_v<T> ? Tensor(DataType::Float32, shape) : ctx.allocate_output(i, dtype, shape);
        ptr[i] = out[i].template data<V>();
      }
      if (ptr[kY]) std::fill(ptr[kY], ptr[kY] + out[kY].numel(), V(0));
      const TraceLayout layout = trace_layout(a_, s, lens);
      V* trace = training_ && ctx.has_output(num_outputs)
                     ? ctx.allocate_output(num_outputs, dtype_of<V>, Shape{s.directions, layout.elements}).template data<V>()
                     : nullptr;
      bool onednn = false;
      if constexpr (std::is_same_v<V, float>) onednn = !trace && OneDnnLstm::applies(a_, s, lens, in);
      for (int64_t d = 0; d < s.directions; ++d) {
        if constexpr (std::is_same_v<V, float>) {
          if (onednn && onednn_.run(a_, s, in, d, ptr[kY], ptr[kYh], ptr[kYc], weights_constant_)) continue;
        }
        Trace<V> view = trace ? layout.view(trace + d * layout.elements, 0) : Trace<V>{};
        run_direction<V>(a_, s, lens, in, d, ptr[kY], ptr[kYh], ptr[kYc], trace ? &view : nullptr, buffers_.template get<V>());
      }
      if constexpr (is_half_v<T>) {
        for (int i = 0; i < num_outputs; ++i) {
          if (ctx.has_output(i)) ctx.set_output(i, out[i].cast(dtype));
        }
      }
    });
  }

 private:
  RnnAttrs a_;
  bool training_;  // RNNTraining / GRUTraining / LSTMTraining: one more output, the trace
  // W, R and B are initializers no run replaces (an inference graph's weights).
  bool weights_constant_;
  BuffersByType<RecurrenceBuffers> buffers_;
  OneDnnLstm onednn_;  // float32 LSTMs that OneDnnLstm::applies()
};

}  // namespace

std::unique_ptr<Kernel> make_rnn(const KernelInit& init) {
  const bool training = init.node().domain == "ai.onnxtrain";
  const int outputs = init.op_type().starts_with("LSTM") ? 3 : 2;
  if (training && init.num_outputs() != outputs + 1) {
    fail(init.op_type() + " has " + std::to_string(init.num_outputs()) + " outputs, expected " +
         std::to_string(outputs + 1) + " (the forward op's, then trace)");
  }
  const bool weights_constant =
      init.input_is_constant(kW) && init.input_is_constant(kR) && (!init.has_input(kB) || init.input_is_constant(kB));
  return std::make_unique<RnnKernel>(parse_attrs(init), training, weights_constant);
}

}  // namespace onnxtrain::ops
