// The kernel interface: what every operator implementation sees.
//
// A kernel is created once per node when a plan is made (KernelInit: the node, its attributes,
// the model's opset for the node's domain) and run many times (KernelContext: the input
// tensors of this run and a place for the outputs). Parse attributes in the factory, not in
// run(). run() throws onnxtrain::Error for bad input, naming tensors by ctx.input_name(i);
// the executor adds the model, graph and node to the message. Never throw from inside an
// OpenMP parallel region: validate first, then compute.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"
#include "onnxtrain/error.h"
#include "onnxtrain/tensor.h"
#include "onnxtrain/value.h"

namespace onnxtrain::ops {

class KernelInit {
 public:
  // `opsets`: every domain's imported version (for ops that plan subgraphs: If, Loop).
  KernelInit(const ir::Graph& graph, const ir::Node& node, int opset,
             const std::unordered_map<std::string, int>* opsets = nullptr)
      : graph_(graph), node_(node), opset_(opset), opsets_(opsets) {}

  const ir::Node& node() const { return node_; }
  const ir::Graph& graph() const { return graph_; }
  const std::string& op_type() const { return node_.op_type; }
  // The version of the node's domain the model imports (opset_import).
  int opset() const { return opset_; }
  // Every domain's version, or nullptr when the caller did not give them.
  const std::unordered_map<std::string, int>* opsets() const { return opsets_; }
  int num_inputs() const { return static_cast<int>(node_.inputs.size()); }
  int num_outputs() const { return static_cast<int>(node_.outputs.size()); }
  bool has_input(int i) const { return i < num_inputs() && node_.inputs[static_cast<size_t>(i)] != ir::kNoValue; }
  bool has_output(int i) const { return i < num_outputs() && node_.outputs[static_cast<size_t>(i)] != ir::kNoValue; }
  // The declared type of input i (dtype Undefined when the model does not say).
  const ir::TensorType& input_type(int i) const;
  // Whether input i is given and its data is the same at every run, as an inference graph's
  // weights: an initializer no run can replace (not also a graph input, which a feed may
  // override) or the output of a Constant node, which is also what constant folding
  // (runtime/constant_folding.h) leaves of an exporter's Transpose of a weight. False in a
  // training step, whose variables are fed from the session's state.
  bool input_is_constant(int i) const;

  // Attributes. The typed getters throw Error when the attribute has another type; the
  // `required_` variants also when it is absent.
  bool has_attr(std::string_view name) const { return node_.find_attribute(name) != nullptr; }
  const ir::Attribute* attr(std::string_view name) const { return node_.find_attribute(name); }
  int64_t attr_int(std::string_view name, int64_t fallback) const;
  int64_t required_int(std::string_view name) const;
  float attr_float(std::string_view name, float fallback) const;
  std::string attr_string(std::string_view name, const std::string& fallback) const;
  std::vector<int64_t> attr_ints(std::string_view name, std::vector<int64_t> fallback = {}) const;
  std::optional<std::vector<int64_t>> optional_ints(std::string_view name) const;
  std::vector<float> attr_floats(std::string_view name, std::vector<float> fallback = {}) const;
  // nullptr when absent.
  const Tensor* attr_tensor(std::string_view name) const;

 private:
  const ir::Attribute& typed(std::string_view name, ir::AttributeType type) const;

  const ir::Graph& graph_;
  const ir::Node& node_;
  int opset_;
  const std::unordered_map<std::string, int>* opsets_;
};

// What a run shares with its kernels: the seed of random ops and which run this is.
// Random kernels draw from Philox keyed by (seed, node) and counted by run_index
// (core/rng.h), so a run is reproducible from these two numbers.
struct RunContext {
  uint64_t seed = 0;
  uint64_t run_index = 0;
  // The training session's NaN guard is on: kernels that can check what they write for NaN and
  // Inf while writing it (checks_outputs_for_nan_guard) do, and fail on any, so the session need
  // not read those outputs again (training/training_session.cpp).
  bool nan_guard = false;
  // Data-parallel training with train --sync-batch-norm (TrainingOptions::sync_batch_norm): in
  // place, each element becomes its sum over the ranks. ai.onnxtrain.SyncBatchNormalization and
  // its Grad call it (ops/sync_batch_norm.cpp); every rank runs the same nodes in the same order,
  // so the ranks' calls match. Empty: one process.
  std::function<void(std::span<double>)> sum_across_ranks;
};

// Whether the kernel of op `op_type` in `domain` ("ai.onnx.preview.training", "ai.onnxtrain")
// checks all its outputs for NaN and Inf when RunContext::nan_guard is set, failing with an
// Error that names them: Adam, ScaledAdam and Momentum (ops/optimizers.cpp).
bool checks_outputs_for_nan_guard(const std::string& domain, const std::string& op_type);

// Where allocate_output gets memory (the runtime's memory plan, runtime/memory_plan.h).
class OutputAllocator {
 public:
  virtual ~OutputAllocator() = default;
  // Uninitialized storage for `shape` elements of `dtype`.
  virtual Tensor allocate(DataType dtype, const Shape& shape) = 0;
};

class KernelContext {
 public:
  // Outputs come from `allocator`, or from the tensor heap when it is null.
  KernelContext(const ir::Graph& graph, const ir::Node& node, std::vector<Value>& values,
                const RunContext& run, OutputAllocator* allocator = nullptr)
      : graph_(graph), node_(node), values_(values), run_(run), allocator_(allocator) {}

  int num_inputs() const { return static_cast<int>(node_.inputs.size()); }
  // False for an omitted optional input.
  bool has_input(int i) const {
    return i < num_inputs() && node_.inputs[static_cast<size_t>(i)] != ir::kNoValue;
  }
  // Input i as a tensor; has_input(i) must be true and the value a tensor (an Error names the
  // input otherwise).
  const Tensor& input(int i) const;
  // Input i as any value (tensor, sequence, optional); has_input(i) must be true.
  const Value& input_value(int i) const;
  // The ONNX name of input i, for messages ("'X'"), or "input i" when omitted.
  std::string input_name(int i) const;

  int num_outputs() const { return static_cast<int>(node_.outputs.size()); }
  // False when the graph does not ask for output i (an omitted optional output).
  bool has_output(int i) const {
    return i < num_outputs() && node_.outputs[static_cast<size_t>(i)] != ir::kNoValue;
  }
  // Allocates output i (uninitialized) and returns it for the kernel to fill. For an output the
  // graph does not ask for, returns a scratch tensor that is dropped after the node.
  Tensor& allocate_output(int i, DataType dtype, const Shape& shape);
  // Sets output i to an existing tensor (a view of an input, for Reshape-like ops).
  void set_output(int i, Tensor tensor);
  // Sets output i to a value of any kind (sequence and optional ops).
  void set_output_value(int i, Value value);
  std::string output_name(int i) const;

  const ir::Node& node() const { return node_; }
  const RunContext& run_context() const { return run_; }
  // Any value of the graph by id: what a subgraph reads from the enclosing graph (the node's
  // implicit inputs). Undefined if it has been released (never for implicit inputs).
  const Value& value(ir::ValueId id) const { return values_[static_cast<size_t>(id)]; }

 private:
  const ir::Graph& graph_;
  const ir::Node& node_;
  std::vector<Value>& values_;
  const RunContext& run_;
  OutputAllocator* allocator_;
  std::deque<Tensor> scratch_;  // one per omitted output allocated, kept until the node ends
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual void run(KernelContext& ctx) = 0;
};

using KernelFactory = std::unique_ptr<Kernel> (*)(const KernelInit&);

// Kernels that are one function of the context need no class of their own:
//   return make_kernel([](KernelContext& ctx) { ... });
template <class F>
class FunctionKernel final : public Kernel {
 public:
  explicit FunctionKernel(F f) : f_(std::move(f)) {}
  void run(KernelContext& ctx) override { f_(ctx); }

 private:
  F f_;
};
template <class F>
std::unique_ptr<Kernel> make_kernel(F f) {
  return std::make_unique<FunctionKernel<F>>(std::move(f));
}

// Shorthand for kernel errors: "input 'X' <message>".
[[noreturn]] void fail(const std::string& message);

// The value of input i as an integer scalar (0-D, or 1-D of one element; int32 or int64), as
// ops take sizes, lengths and axes (DFT's dft_length, the window ops' size, CumProd's axis);
// `role` names it in the Error for anything else.
int64_t int_scalar(const KernelContext& ctx, int i, const std::string& role);

}  // namespace onnxtrain::ops
