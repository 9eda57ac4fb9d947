// If and Loop (ai.onnx opsets 1-17; ONNX operator docs "If", "Loop"), tensors only (no
// sequence or optional types). Their gradients are graph rewrites (autodiff/engine.cpp):
// If by the rule in autodiff/rules_control_flow.cpp, Loop by unrolling (autodiff/subgraphs.h).
//   If: runs then_branch or else_branch by the one-element bool `cond` and returns the
//     branch's outputs. Branches take no inputs.
//   Loop(M, cond, v_initial...): runs `body(iteration_num, cond, v...) -> (cond, v..., scan...)`
//     while (M is omitted or iteration_num < M) and (cond is omitted or true). Outputs: the
//     final loop-carried values v, then each scan output stacked over the iterations along a
//     new first axis (an iteration count of 0 gives scan outputs of shape [0], typed as the body
//     declares them).
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
  std::vector<Tensor> run(const KernelContext& ctx, const runtime::NamedTensors& feeds = {}) {
    std::vector<runtime::Override> overrides;
    overrides.reserve(reads_.size());
    for (const auto& [inner, outer] : reads_) {
      const Tensor& t = ctx.value(outer);
      if (!t.defined()) fail("the enclosing value '" + runner_->graph().value(inner).name + "' is not available");
      overrides.push_back({inner, &t});
    }
    runtime::NamedTensors out = runner_->run(feeds, overrides, &ctx.run_context());
    std::vector<Tensor> result;
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
    std::vector<Tensor> out = (take_then ? then_ : else_).run(ctx);
    for (size_t i = 0; i < out.size(); ++i) ctx.set_output(static_cast<int>(i), std::move(out[i]));
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
    std::vector<Tensor> carried;
    for (int i = 0; i < carried_; ++i) carried.push_back(ctx.input(2 + i));
    std::vector<std::vector<Tensor>> scanned(static_cast<size_t>(scans_));
    for (int64_t it = 0; (!trips || it < *trips) && cond; ++it) {
      runtime::NamedTensors feeds{{names[0].name, Tensor::scalar<int64_t>(it)}, {names[1].name, Tensor::scalar<bool>(cond)}};
      for (int i = 0; i < carried_; ++i) feeds[names[static_cast<size_t>(2 + i)].name] = carried[static_cast<size_t>(i)];
      std::vector<Tensor> out = body_.run(ctx, feeds);
      if (out[0].numel() != 1 || out[0].dtype() != DataType::Bool) fail("the body's condition output must be one bool, got " + out[0].description());
      cond = out[0].data<bool>()[0];
      for (int i = 0; i < carried_; ++i) carried[static_cast<size_t>(i)] = std::move(out[static_cast<size_t>(1 + i)]);
      for (int k = 0; k < scans_; ++k) scanned[static_cast<size_t>(k)].push_back(std::move(out[static_cast<size_t>(1 + carried_ + k)]));
    }
    for (int i = 0; i < carried_; ++i) {
      if (ctx.has_output(i)) ctx.set_output(i, carried[static_cast<size_t>(i)]);
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

}  // namespace

std::unique_ptr<Kernel> make_if(const KernelInit& init) { return std::make_unique<IfKernel>(init); }
std::unique_ptr<Kernel> make_loop(const KernelInit& init) { return std::make_unique<LoopKernel>(init); }

}  // namespace onnxtrain::ops
