#include "ops/rnn_onednn.h"

#include <algorithm>
#include <cstring>

#include "ops/dnnl_util.h"

namespace onnxtrain::ops::rnn {

namespace du = dnnl_util;

namespace {

using dnnl::memory;
using Tag = memory::format_tag;

// The ONNX gate (order i o f c) behind each of the primitive's gates (order i f c o).
constexpr int64_t kOnnxGate[4] = {0, 2, 3, 1};

// One direction's primitive for one problem size, with its memories (data bound per run).
struct Entry {
  bool usable = true;  // false: oneDNN has no implementation for this problem
  dnnl::lstm_forward primitive;
  du::Scratchpad scratchpad;
  memory src_layer, src_iter, src_iter_c, dst_layer, dst_iter, dst_iter_c;
  // W and R copied into the primitive's gate order ([4, H, I] and [4, H, H], tag ldgoi), then
  // reordered into the layouts the primitive chose; the bias [4, H] (Wb + Rb) in its order.
  std::vector<float> staged_w, staged_r, bias_values;
  memory user_weights_layer, user_weights_iter, weights_layer, weights_iter, bias;
  dnnl::reorder reorder_layer, reorder_iter;
  // Constant weights already in `weights_layer`, `weights_iter` and `bias`: their data.
  const float* prepared_w = nullptr;
  const float* prepared_r = nullptr;
  const float* prepared_b = nullptr;
  // Dense [N, H] states: initial h and c, final h and c; Y's direction as [T, N, H] when Y
  // holds two directions.
  std::vector<float> h0, c0, h_last, c_last, y_dense;
  std::unordered_map<int, memory> args;
};

Entry plan(const RnnShape& s, bool reverse, bool dense_y) {
  const memory::dim T = s.seq, N = s.batch, I = s.input, H = s.hidden;
  const dnnl::engine& engine = du::cpu_engine();
  const auto desc = [](memory::dims dims, Tag tag) { return memory::desc(dims, memory::data_type::f32, tag); };
  const Tag sequence = s.batch_first ? Tag::ntc : Tag::tnc;
  const memory::desc src_layer = desc({T, N, I}, sequence);
  const memory::desc dst_layer = desc({T, N, H}, dense_y ? sequence : Tag::tnc);
  const memory::desc state = desc({1, 1, N, H}, Tag::ldnc);
  const memory::desc any_layer = desc({1, 1, I, 4, H}, Tag::any);
  const memory::desc any_iter = desc({1, 1, H, 4, H}, Tag::any);
  const memory::desc bias = desc({1, 1, 4, H}, Tag::ldgo);
  Entry e;
  try {
    const dnnl::lstm_forward::desc d(dnnl::prop_kind::forward_inference,
                                     reverse ? dnnl::rnn_direction::unidirectional_right2left
                                             : dnnl::rnn_direction::unidirectional_left2right,
                                     src_layer, state, state, any_layer, any_iter, bias, dst_layer, state, state);
    const dnnl::lstm_forward::primitive_desc pd(d, du::user_scratchpad(), engine);
    e.primitive = dnnl::lstm_forward(pd);
    e.scratchpad = du::Scratchpad(pd.scratchpad_desc());
    e.src_layer = memory(src_layer, engine, nullptr);
    e.dst_layer = memory(dst_layer, engine, nullptr);
    e.h0.assign(static_cast<size_t>(N * H), 0.0f);
    e.c0 = e.h_last = e.c_last = e.h0;
    e.src_iter = memory(state, engine, e.h0.data());
    e.src_iter_c = memory(state, engine, e.c0.data());
    e.dst_iter = memory(state, engine, e.h_last.data());
    e.dst_iter_c = memory(state, engine, e.c_last.data());
    e.staged_w.resize(static_cast<size_t>(4 * H * I));
    e.staged_r.resize(static_cast<size_t>(4 * H * H));
    e.bias_values.resize(static_cast<size_t>(4 * H));
    e.user_weights_layer = memory(desc({1, 1, I, 4, H}, Tag::ldgoi), engine, e.staged_w.data());
    e.user_weights_iter = memory(desc({1, 1, H, 4, H}, Tag::ldgoi), engine, e.staged_r.data());
    e.weights_layer = memory(pd.weights_layer_desc(), engine);
    e.weights_iter = memory(pd.weights_iter_desc(), engine);
    e.bias = memory(bias, engine, e.bias_values.data());
    e.reorder_layer = dnnl::reorder(e.user_weights_layer, e.weights_layer);
    e.reorder_iter = dnnl::reorder(e.user_weights_iter, e.weights_iter);
    e.args = {{DNNL_ARG_SRC_LAYER, e.src_layer},       {DNNL_ARG_SRC_ITER, e.src_iter},
              {DNNL_ARG_SRC_ITER_C, e.src_iter_c},     {DNNL_ARG_WEIGHTS_LAYER, e.weights_layer},
              {DNNL_ARG_WEIGHTS_ITER, e.weights_iter}, {DNNL_ARG_BIAS, e.bias},
              {DNNL_ARG_DST_LAYER, e.dst_layer},       {DNNL_ARG_DST_ITER, e.dst_iter},
              {DNNL_ARG_DST_ITER_C, e.dst_iter_c}};
    e.scratchpad.add_to(e.args);
  } catch (const dnnl::error&) {
    e.usable = false;
    return e;
  }
  if (!dense_y) e.y_dense.resize(static_cast<size_t>(T * N * H));
  return e;
}

// Copies a [4 * H, cols] ONNX weight (gates i o f c) into `to` in the primitive's gate order.
void stage_gates(const float* from, int64_t H, int64_t cols, float* to) {
  for (int64_t g = 0; g < 4; ++g) {
    std::memcpy(to + g * H * cols, from + kOnnxGate[g] * H * cols, static_cast<size_t>(H * cols) * sizeof(float));
  }
}

}  // namespace

struct OneDnnLstm::Cache {
  du::PrimitiveCache<Entry> entries;
};

OneDnnLstm::OneDnnLstm() : cache_(std::make_unique<Cache>()) {}
OneDnnLstm::~OneDnnLstm() = default;

bool OneDnnLstm::applies(const RnnAttrs& a, const RnnShape& s, const std::vector<int64_t>& lens,
                         const RnnTensors& in) {
  if (a.cell != Cell::Lstm || a.clip || a.input_forget || in.p.defined() || s.batch < kMinBatch || s.seq == 0 ||
      s.input == 0 || s.hidden == 0) {
    return false;
  }
  for (int64_t d = 0; d < s.directions; ++d) {
    if (a.act(d, 0).kind != ActKind::Sigmoid || a.act(d, 1).kind != ActKind::Tanh ||
        a.act(d, 2).kind != ActKind::Tanh) {
      return false;
    }
  }
  return std::all_of(lens.begin(), lens.end(), [&](int64_t len) { return len == s.seq; });
}

bool OneDnnLstm::run(const RnnAttrs& a, const RnnShape& s, const RnnTensors& in, int64_t d, float* y, float* y_h,
                     float* y_c, bool weights_constant) {
  const int64_t N = s.batch, H = s.hidden, I = s.input, D = s.directions;
  const bool reverse = a.reverse(d);
  const bool dense_y = D == 1 && y;  // Y [T, 1, N, H] (or [N, T, 1, H]) is the primitive's dst_layer
  Entry& e = cache_->entries.get(
      du::CacheKey().add(s.seq).add(N).add(I).add(H).add(s.batch_first).add(d).add(reverse).add(dense_y),
      [&] { return plan(s, reverse, dense_y); });
  if (!e.usable) return false;
  const float* w = RnnTensors::of_direction<float>(in.w, d, D);
  const float* r = RnnTensors::of_direction<float>(in.r, d, D);
  const float* b = in.b.defined() ? RnnTensors::of_direction<float>(in.b, d, D) : nullptr;
  dnnl::stream& stream = du::cpu_stream();
  const bool prepared = weights_constant && e.prepared_w == w && e.prepared_r == r && e.prepared_b == b;
  du::checked("run an LSTM", [&] {
    if (!prepared) {
      stage_gates(w, H, I, e.staged_w.data());
      stage_gates(r, H, H, e.staged_r.data());
      for (int64_t g = 0; g < 4; ++g) {
        for (int64_t j = 0; j < H; ++j) {
          const int64_t k = kOnnxGate[g] * H + j;
          e.bias_values[static_cast<size_t>(g * H + j)] = b ? b[k] + b[4 * H + k] : 0.0f;
        }
      }
      e.reorder_layer.execute(stream, e.user_weights_layer, e.weights_layer);
      e.reorder_iter.execute(stream, e.user_weights_iter, e.weights_iter);
      stream.wait();
      e.prepared_w = weights_constant ? w : nullptr;
      e.prepared_r = weights_constant ? r : nullptr;
      e.prepared_b = weights_constant ? b : nullptr;
    }
    load_state(s, in.initial_h, d, e.h0.data());
    load_state(s, in.initial_c, d, e.c0.data());
    e.src_layer.set_data_handle(const_cast<float*>(in.x.data<float>()));
    e.dst_layer.set_data_handle(dense_y ? y : e.y_dense.data());
    char* scratch = du::thread_scratch(e.scratchpad.scratch_bytes());
    e.scratchpad.place(scratch);
    e.primitive.execute(stream, e.args);
    stream.wait();
  });
  if (y_h) store_state(s, e.h_last.data(), d, y_h);
  if (y_c) store_state(s, e.c_last.data(), d, y_c);
  if (y && !dense_y) {  // Y holds both directions: this one's [T, N, H] into its place
    for (int64_t t = 0; t < s.seq; ++t) {
      for (int64_t n = 0; n < N; ++n) std::copy_n(e.y_dense.data() + (t * N + n) * H, H, y + s.y_offset(t, d, n));
    }
  }
  return true;
}

}  // namespace onnxtrain::ops::rnn
