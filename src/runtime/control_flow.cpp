// If and Loop (ai.onnx; ONNX operator docs "If", "Loop"): branch outputs and loop-carried
// values may be tensors, sequences or optionals; scan outputs are tensors. Their gradients are
// graph rewrites (autodiff/engine.cpp):
// If by the rule in autodiff/rules_control_flow.cpp, Loop by unrolling (autodiff/subgraphs.h).
//   If: runs then_branch or else_branch by the one-element bool `cond` and returns the
//     branch's outputs. Branches take no inputs.
//   Loop(M, cond, v_initial...): runs `body(iteration_num, cond, v...) -> (cond, v..., scan...)`
//     while (M is omitted or iteration_num < M) and (cond is omitted or true). Outputs: the
//     final loop-carried values v, then each scan output stacked over the iterations along a
//     new first axis (an iteration count of 0 gives scan outputs of shape [0], typed as the body
//     declares them).
//   Scan (8; 9 and later): runs `body(state..., scan_slice...) -> (state..., scan_out_slice...)`
//     once per position along the scan axis of the M scan inputs (num_scan_inputs), carrying
//     the N state values; outputs the final states and the K scan output slices stacked along
//     their scan axis. From version 9 the axes and directions are attributes
//     (scan_input_axes/directions, scan_output_axes/directions; a direction of 1 scans from
//     the back, or stacks from the back). Scan-8 has a batch axis 0, scan axis 1, an optional
//     first input sequence_lens and one `directions` attribute for the inputs; each batch
//     entry is scanned on its own and outputs past its length are zero.
//   SequenceMap (17): runs `body` once per element of the input sequence; each further input
//     that is a sequence (of the same length) gives the body its element at the same position,
//     a tensor is given as it is; each body output becomes a sequence of the per-element
//     results.
// Subgraphs read values of the enclosing graphs by name (the node's implicit inputs). Each is
// planned once, when the node is, as its own GraphRunner with the model's opsets; a run feeds
// it the enclosing values it reads as overrides.
//
// Control-flow kernels live in runtime/ because they run graphs; the registry (ops/) names
// their factories like any other.
#include <cstring>
#include <memory>
#include <optional>
#include <unordered_set>

#include "ops/factories.h"
#include "runtime/graph_runner.h"

namespace onnxtrain::ops {

namespace {

// A subgraph attribute planned to run, and which enclosing values it reads.
class Branch {
 public:
  Branch(const KernelInit& init, const char* attribute) {
    const ir::Attribute* a = init.attr(attribute);
    if (!a || a->type != ir::AttributeType::Graph || !a->g) fail("required graph attribute '" + std::string(attribute) + "' is missing");
    const ir::Graph& outer = init.graph();
    std::unordered_set<std::string> visible;
    for (const ir::Value& v : outer.values()) visible.insert(v.name);
    if (!init.opsets()) fail("needs the model's opsets to plan its subgraphs (internal error)");
    const std::string source = outer.description() + ", " + init.node().description() + " " + attribute;
    ir::Graph graph = ir::Graph::from_proto(*a->g, source, outer.base_dir(), visible);
    for (size_t id = 0; id < graph.values().size(); ++id) {
      const ir::Value& v = graph.values()[id];
      if (v.is_outer_scope) reads_.push_back({static_cast<ir::ValueId>(id), outer.find(v.name)});
    }
    for (ir::ValueId id : graph.outputs()) output_names_.push_back(graph.value(id).name);
    runner_ = std::make_unique<runtime::GraphRunner>(std::move(graph), *init.opsets(), source);
  }

  size_t num_outputs() const { return output_names_.size(); }
  const std::vector<runtime::ValueInfo>& inputs() const { return runner_->inputs(); }
  const std::vector<runtime::ValueInfo>& outputs() const { return runner_->outputs(); }

  // Runs the subgraph on `feeds` (its inputs by name) and the enclosing values it reads;
  // returns its outputs in order.
  std::vector<Value> run(const KernelContext& ctx, const runtime::NamedValues& feeds = {}) {
    std::vector<runtime::Override> overrides;
    overrides.reserve(reads_.size());
    for (const auto& [inner, outer] : reads_) {
      const Value& v = ctx.value(outer);
      if (!v.defined()) fail("the enclosing value '" + runner_->graph().value(inner).name + "' is not available");
      overrides.push_back({.id = inner, .value = &v});
    }
    runtime::NamedValues out = runner_->run_values(feeds, overrides, &ctx.run_context());
    std::vector<Value> result;
    for (const std::string& name : output_names_) result.push_back(std::move(out.at(name)));
    return result;
  }

 private:
  std::unique_ptr<runtime::GraphRunner> runner_;
  std::vector<std::pair<ir::ValueId, ir::ValueId>> reads_;  // (in the branch, in the enclosing graph)
  std::vector<std::string> output_names_;
};

class IfKernel final : public Kernel {
 public:
  explicit IfKernel(const KernelInit& init) : then_(init, "then_branch"), else_(init, "else_branch") {
    if (!then_.inputs().empty() || !else_.inputs().empty()) fail("If branches take no inputs, but one declares some");
    const size_t n = static_cast<size_t>(init.num_outputs());
    if (then_.num_outputs() != n || else_.num_outputs() != n) {
      fail("the node has " + std::to_string(n) + " outputs but then_branch has " + std::to_string(then_.num_outputs()) +
           " and else_branch " + std::to_string(else_.num_outputs()));
    }
  }

  void run(KernelContext& ctx) override {
    const Tensor& cond = ctx.input(0);
    if (cond.numel() != 1) fail("condition " + ctx.input_name(0) + " must hold one element, got " + cond.description());
    const bool take_then = cond.data<bool>()[0];
    std::vector<Value> out = (take_then ? then_ : else_).run(ctx);
    for (size_t i = 0; i < out.size(); ++i) ctx.set_output_value(static_cast<int>(i), std::move(out[i]));
  }

 private:
  Branch then_, else_;
};

class LoopKernel final : public Kernel {
 public:
  explicit LoopKernel(const KernelInit& init) : body_(init, "body") {
    carried_ = init.num_inputs() - 2;
    if (carried_ < 0) fail("expects inputs M, cond and the loop-carried values, got " + std::to_string(init.num_inputs()));
    if (static_cast<int>(body_.inputs().size()) != carried_ + 2) {
      fail("body has " + std::to_string(body_.inputs().size()) + " inputs, expected " + std::to_string(carried_ + 2) +
           " (iteration_num, cond and " + std::to_string(carried_) + " loop-carried values)");
    }
    if (static_cast<int>(body_.num_outputs()) < carried_ + 1) {
      fail("body has " + std::to_string(body_.num_outputs()) + " outputs, expected at least " + std::to_string(carried_ + 1) +
           " (cond and the loop-carried values)");
    }
    scans_ = static_cast<int>(body_.num_outputs()) - 1 - carried_;
    if (init.num_outputs() > carried_ + scans_) {
      fail("the node has " + std::to_string(init.num_outputs()) + " outputs but the body makes " +
           std::to_string(carried_) + " loop-carried values and " + std::to_string(scans_) + " scan outputs");
    }
  }

  void run(KernelContext& ctx) override {
    std::optional<int64_t> trips;
    if (ctx.has_input(0)) {
      const Tensor& m = ctx.input(0);
      if (m.numel() != 1 || m.dtype() != DataType::Int64) fail("trip count " + ctx.input_name(0) + " must be one int64, got " + m.description());
      trips = m.data<int64_t>()[0];
    }
    bool cond = true;
    if (ctx.has_input(1)) {
      const Tensor& c = ctx.input(1);
      if (c.numel() != 1 || c.dtype() != DataType::Bool) fail("condition " + ctx.input_name(1) + " must be one bool, got " + c.description());
      cond = c.data<bool>()[0];
    }
    const auto& names = body_.inputs();
    std::vector<Value> carried;
    for (int i = 0; i < carried_; ++i) carried.push_back(ctx.input_value(2 + i));
    std::vector<std::vector<Tensor>> scanned(static_cast<size_t>(scans_));
    for (int64_t it = 0; (!trips || it < *trips) && cond; ++it) {
      runtime::NamedValues feeds{{names[0].name, Tensor::scalar<int64_t>(it)}, {names[1].name, Tensor::scalar<bool>(cond)}};
      for (int i = 0; i < carried_; ++i) feeds[names[static_cast<size_t>(2 + i)].name] = carried[static_cast<size_t>(i)];
      std::vector<Value> out = body_.run(ctx, feeds);
      const Tensor& c = out[0].tensor();
      if (!out[0].is_tensor() || c.numel() != 1 || c.dtype() != DataType::Bool) {
        fail("the body's condition output must be one bool, got " + out[0].description());
      }
      cond = c.data<bool>()[0];
      for (int i = 0; i < carried_; ++i) carried[static_cast<size_t>(i)] = std::move(out[static_cast<size_t>(1 + i)]);
      for (int k = 0; k < scans_; ++k) {
        Value& v = out[static_cast<size_t>(1 + carried_ + k)];
        if (!v.is_tensor()) fail("scan output " + std::to_string(k) + " of the body is a " + v.type().to_string() + " value; scan outputs are tensors");
        scanned[static_cast<size_t>(k)].push_back(std::move(v.tensor()));
      }
    }
    for (int i = 0; i < carried_; ++i) {
      if (ctx.has_output(i)) ctx.set_output_value(i, carried[static_cast<size_t>(i)]);
    }
    for (int k = 0; k < scans_; ++k) {
      if (!ctx.has_output(carried_ + k)) continue;
      ctx.set_output(carried_ + k, stack(scanned[static_cast<size_t>(k)], k, scan_dtype(k)));
    }
  }

 private:
  // The element type the body declares for scan output k (float32 when it declares none).
  DataType scan_dtype(int k) const {
    const DataType declared = body_.outputs()[static_cast<size_t>(1 + carried_ + k)].dtype;
    return declared == DataType::Undefined ? DataType::Float32 : declared;
  }

  // The per-iteration values of scan output k stacked along a new first axis; no iteration
  // gives shape [0] of the declared type.
  static Tensor stack(const std::vector<Tensor>& parts, int k, DataType declared) {
    if (parts.empty()) return Tensor(declared, Shape{0});
    const Tensor& first = parts[0];
    Shape shape{static_cast<int64_t>(parts.size())};
    for (int64_t d : first.shape()) shape.push_back(d);
    Tensor out(first.dtype(), shape);
    char* dst = static_cast<char*>(out.raw_data());
    for (const Tensor& p : parts) {
      if (p.dtype() != first.dtype() || !(p.shape() == first.shape())) {
        fail("scan output " + std::to_string(k) + " is " + first.description() + " in the first iteration and " +
             p.description() + " in a later one");
      }
      std::memcpy(dst, p.raw_data(), p.nbytes());
      dst += p.nbytes();
    }
    return out;
  }

  Branch body_;
  int carried_ = 0, scans_ = 0;
};


// The slice at position i of x along `axis` (x's shape without that axis).
Tensor slice_along(const Tensor& x, size_t axis, int64_t i) {
  Shape shape = x.shape();
  const int64_t n = shape[axis];
  shape.erase(axis);
  Tensor out(x.dtype(), shape);
  const int64_t inner = x.shape().numel(axis + 1, x.rank()) * static_cast<int64_t>(dtype_size(x.dtype()));
  const int64_t outer = x.shape().numel(0, axis);
  const auto* src = static_cast<const char*>(x.raw_data());
  auto* dst = static_cast<char*>(out.raw_data());
  for (int64_t o = 0; o < outer; ++o) {
    std::memcpy(dst + o * inner, src + (o * n + i) * inner, static_cast<size_t>(inner));
  }
  return out;
}

// Copies `slice` into position i of y along `axis`.
void place_along(Tensor& y, size_t axis, int64_t i, const Tensor& slice) {
  const int64_t n = y.dim(axis);
  const int64_t inner = y.shape().numel(axis + 1, y.rank()) * static_cast<int64_t>(dtype_size(y.dtype()));
  const int64_t outer = y.shape().numel(0, axis);
  const auto* src = static_cast<const char*>(slice.raw_data());
  auto* dst = static_cast<char*>(y.raw_data());
  for (int64_t o = 0; o < outer; ++o) {
    std::memcpy(dst + (o * n + i) * inner, src + o * inner, static_cast<size_t>(inner));
  }
}

class ScanKernel final : public Kernel {
 public:
  explicit ScanKernel(const KernelInit& init) : body_(init, "body"), batched_(init.opset() < 9) {
    const int first = batched_ ? 1 : 0;  // Scan-8's sequence_lens
    scan_inputs_ = static_cast<int>(init.required_int("num_scan_inputs"));
    states_ = init.num_inputs() - first - scan_inputs_;
    if (scan_inputs_ < 1 || states_ < 0) {
      fail("num_scan_inputs is " + std::to_string(scan_inputs_) + " but the node has " +
           std::to_string(init.num_inputs() - first) + " state and scan inputs");
    }
    if (static_cast<int>(body_.inputs().size()) != states_ + scan_inputs_) {
      fail("body has " + std::to_string(body_.inputs().size()) + " inputs, expected " +
           std::to_string(states_ + scan_inputs_) + " (the states and one slice per scan input)");
    }
    scan_outputs_ = static_cast<int>(body_.num_outputs()) - states_;
    if (scan_outputs_ < 0 || init.num_outputs() != states_ + scan_outputs_) {
      fail("body has " + std::to_string(body_.num_outputs()) + " outputs and the node " +
           std::to_string(init.num_outputs()) + "; both must be the " + std::to_string(states_) +
           " states followed by the scan outputs");
    }
    auto list = [&](const char* name, int count) {
      std::vector<int64_t> v = init.attr_ints(name, std::vector<int64_t>(static_cast<size_t>(count), 0));
      if (static_cast<int>(v.size()) != count) {
        fail("attribute '" + std::string(name) + "' has " + std::to_string(v.size()) + " values, expected " + std::to_string(count));
      }
      return v;
    };
    if (batched_) {
      in_directions_ = list("directions", scan_inputs_);
      in_axes_.assign(static_cast<size_t>(scan_inputs_), 1);
      out_axes_.assign(static_cast<size_t>(scan_outputs_), 1);
      out_directions_.assign(static_cast<size_t>(scan_outputs_), 0);
    } else {
      in_axes_ = list("scan_input_axes", scan_inputs_);
      in_directions_ = list("scan_input_directions", scan_inputs_);
      out_axes_ = list("scan_output_axes", scan_outputs_);
      out_directions_ = list("scan_output_directions", scan_outputs_);
    }
  }

  void run(KernelContext& ctx) override {
    const int first = batched_ ? 1 : 0;
    std::vector<Tensor> states, inputs;
    for (int i = 0; i < states_; ++i) states.push_back(ctx.input(first + i));
    for (int i = 0; i < scan_inputs_; ++i) inputs.push_back(ctx.input(first + states_ + i));
    if (!batched_) {
      std::vector<Tensor> outputs = scan(ctx, states, inputs, -1);
      for (int i = 0; i < states_ + scan_outputs_; ++i) ctx.set_output(i, std::move(outputs[static_cast<size_t>(i)]));
      return;
    }
    // Scan-8: every batch entry on its own, its outputs stacked along axis 0.
    const int64_t batch = inputs[0].rank() > 0 ? inputs[0].dim(0) : 0;
    std::vector<int64_t> lengths;
    if (ctx.has_input(0)) lengths = ctx.input(0).to_int64_vector("sequence_lens " + ctx.input_name(0));
    if (!lengths.empty() && static_cast<int64_t>(lengths.size()) != batch) {
      fail("sequence_lens " + ctx.input_name(0) + " has " + std::to_string(lengths.size()) + " values for a batch of " +
           std::to_string(batch));
    }
    std::vector<std::vector<Tensor>> per_batch;
    for (int64_t b = 0; b < batch; ++b) {
      std::vector<Tensor> s, in;
      for (const Tensor& t : states) s.push_back(slice_along(check_batch(t, batch, ctx), 0, b));
      for (const Tensor& t : inputs) in.push_back(slice_along(check_batch(t, batch, ctx), 0, b));
      per_batch.push_back(scan(ctx, s, in, lengths.empty() ? -1 : lengths[static_cast<size_t>(b)]));
    }
    for (int i = 0; i < states_ + scan_outputs_; ++i) {
      if (batch == 0) fail("Scan-8 with a batch of 0 is not supported");
      const Tensor& part = per_batch[0][static_cast<size_t>(i)];
      Shape shape = part.shape();
      shape.insert(0, batch);
      Tensor y(part.dtype(), shape);
      for (int64_t b = 0; b < batch; ++b) place_along(y, 0, b, per_batch[static_cast<size_t>(b)][static_cast<size_t>(i)]);
      ctx.set_output(i, std::move(y));
    }
  }

 private:
  const Tensor& check_batch(const Tensor& t, int64_t batch, const KernelContext& ctx) const {
    if (t.rank() == 0 || t.dim(0) != batch) {
      fail("Scan-8 inputs share batch axis 0 of size " + std::to_string(batch) + ", but one is " + t.description() +
           " (node " + ctx.node().description() + ")");
    }
    return t;
  }

  // One scan over `inputs` (without a batch axis) from `states`; `length` < 0 scans every
  // position. Returns the final states and the stacked scan outputs.
  std::vector<Tensor> scan(const KernelContext& ctx, std::vector<Tensor> states, const std::vector<Tensor>& inputs,
                           int64_t length) {
    std::vector<size_t> axes(inputs.size());
    int64_t n = -1;
    for (size_t k = 0; k < inputs.size(); ++k) {
      const auto rank = static_cast<int64_t>(inputs[k].rank()) + (batched_ ? 1 : 0);
      int64_t axis = in_axes_[k];
      if (axis < -rank || axis >= rank) fail("scan input " + std::to_string(k) + " " + inputs[k].description() + " has no axis " + std::to_string(axis));
      axis = (axis < 0 ? axis + rank : axis) - (batched_ ? 1 : 0);
      axes[k] = static_cast<size_t>(axis);
      const int64_t len = inputs[k].dim(axes[k]);
      if (n >= 0 && len != n) fail("scan inputs differ in length along their scan axes (" + std::to_string(n) + " and " + std::to_string(len) + ")");
      n = len;
    }
    const int64_t steps = length < 0 ? n : length;
    if (steps > n) fail("sequence length " + std::to_string(length) + " exceeds the scan axis length " + std::to_string(n));
    const auto& names = body_.inputs();
    std::vector<std::vector<Tensor>> slices(static_cast<size_t>(scan_outputs_));
    for (int64_t t = 0; t < steps; ++t) {
      runtime::NamedValues feeds;
      for (int i = 0; i < states_; ++i) feeds[names[static_cast<size_t>(i)].name] = states[static_cast<size_t>(i)];
      for (size_t k = 0; k < inputs.size(); ++k) {
        const int64_t pos = in_directions_[k] ? steps - 1 - t : t;
        feeds[names[static_cast<size_t>(states_) + k].name] = slice_along(inputs[k], axes[k], pos);
      }
      std::vector<Value> out = body_.run(ctx, feeds);
      for (size_t i = 0; i < out.size(); ++i) {
        if (!out[i].is_tensor()) fail("the body's output " + std::to_string(i) + " is a " + out[i].type().to_string() + " value; Scan carries tensors");
      }
      for (int i = 0; i < states_; ++i) states[static_cast<size_t>(i)] = out[static_cast<size_t>(i)].tensor();
      for (int k = 0; k < scan_outputs_; ++k) slices[static_cast<size_t>(k)].push_back(out[static_cast<size_t>(states_ + k)].tensor());
    }
    std::vector<Tensor> result = std::move(states);
    for (int k = 0; k < scan_outputs_; ++k) result.push_back(stack(slices[static_cast<size_t>(k)], k, n, steps));
    return result;
  }

  // The slices of scan output k stacked along its axis (n positions, `steps` of them filled,
  // the rest zero), from the back when its direction is 1.
  Tensor stack(const std::vector<Tensor>& parts, int k, int64_t n, int64_t steps) const {
    const DataType declared = body_.outputs()[static_cast<size_t>(states_ + k)].dtype;
    if (parts.empty()) return Tensor::zeros(declared == DataType::Undefined ? DataType::Float32 : declared, Shape{n});
    const Tensor& first = parts[0];
    const auto rank = static_cast<int64_t>(first.rank()) + 1 + (batched_ ? 1 : 0);
    int64_t axis = out_axes_[static_cast<size_t>(k)];
    if (axis < -rank || axis >= rank) fail("scan_output_axes value " + std::to_string(axis) + " is outside the output's rank " + std::to_string(rank));
    axis = (axis < 0 ? axis + rank : axis) - (batched_ ? 1 : 0);
    Shape shape = first.shape();
    shape.insert(static_cast<size_t>(axis), n);
    Tensor y = Tensor::zeros(first.dtype(), shape);
    for (int64_t t = 0; t < steps; ++t) {
      const Tensor& p = parts[static_cast<size_t>(t)];
      if (p.dtype() != first.dtype() || !(p.shape() == first.shape())) {
        fail("scan output " + std::to_string(k) + " is " + first.description() + " in the first iteration and " + p.description() + " in a later one");
      }
      place_along(y, static_cast<size_t>(axis), out_directions_[static_cast<size_t>(k)] ? steps - 1 - t : t, p);
    }
    return y;
  }

  Branch body_;
  bool batched_;
  int states_ = 0, scan_inputs_ = 0, scan_outputs_ = 0;
  std::vector<int64_t> in_axes_, in_directions_, out_axes_, out_directions_;
};


class SequenceMapKernel final : public Kernel {
 public:
  explicit SequenceMapKernel(const KernelInit& init) : body_(init, "body") {
    if (static_cast<int>(body_.inputs().size()) != init.num_inputs()) {
      fail("body has " + std::to_string(body_.inputs().size()) + " inputs but the node has " +
           std::to_string(init.num_inputs()));
    }
    if (static_cast<int>(body_.num_outputs()) != init.num_outputs()) {
      fail("body has " + std::to_string(body_.num_outputs()) + " outputs but the node has " +
           std::to_string(init.num_outputs()));
    }
  }

  void run(KernelContext& ctx) override {
    const Value& s = ctx.input_value(0);
    if (!s.is_sequence()) fail("input " + ctx.input_name(0) + " must be a sequence, got " + s.description());
    const size_t n = s.elements().size();
    for (int i = 1; i < ctx.num_inputs(); ++i) {
      const Value& v = ctx.input_value(i);
      if (v.is_sequence() && v.elements().size() != n) {
        fail("input " + ctx.input_name(i) + " is a sequence of " + std::to_string(v.elements().size()) +
             " elements, but " + ctx.input_name(0) + " has " + std::to_string(n));
      }
    }
    const auto& names = body_.inputs();
    std::vector<std::vector<Value>> results(body_.num_outputs());
    for (size_t k = 0; k < n; ++k) {
      runtime::NamedValues feeds;
      for (int i = 0; i < ctx.num_inputs(); ++i) {
        const Value& v = ctx.input_value(i);
        feeds[names[static_cast<size_t>(i)].name] = v.is_sequence() ? v.elements()[k] : v;
      }
      std::vector<Value> out = body_.run(ctx, feeds);
      for (size_t j = 0; j < out.size(); ++j) results[j].push_back(std::move(out[j]));
    }
    for (size_t j = 0; j < results.size(); ++j) {
      // The element type: the body's declared output type, else the first result's.
      ValueType element = body_.outputs()[j].type;
      if (element.is_tensor() && element.dtype() == DataType::Undefined && !results[j].empty()) {
        element = results[j][0].type();
      }
      ctx.set_output_value(static_cast<int>(j), Value::sequence(element, std::move(results[j])));
    }
  }

 private:
  Branch body_;
};

}  // namespace

std::unique_ptr<Kernel> make_if(const KernelInit& init) { return std::make_unique<IfKernel>(init); }
std::unique_ptr<Kernel> make_loop(const KernelInit& init) { return std::make_unique<LoopKernel>(init); }
std::unique_ptr<Kernel> make_scan(const KernelInit& init) { return std::make_unique<ScanKernel>(init); }
std::unique_ptr<Kernel> make_sequence_map(const KernelInit& init) { return std::make_unique<SequenceMapKernel>(init); }

}  // namespace onnxtrain::ops
