// runtime::Plan — a graph made ready to run: a kernel instance per node in topological order
// and, for every value, the step after which its buffer is released.
//
// Shape arithmetic is computed once per plan, not per run. Exporters compute reshape targets
// from the shapes of the values a run makes (torch.onnx.export: Shape -> Gather -> Unsqueeze
// -> Concat -> Reshape; in a 4-layer BERT encoder ~310 nodes a run besides the Shape and Reshape
// nodes, 198 of them Constants), which constant folding cannot see. A Shape or Size node (a
// shape root) always runs. A node of the ai.onnx domain whose every input is an initializer, a
// shape root's output or another such node's output (a shape-derived node: not random, no
// subgraph, no graph output; Constant nodes are ones) keeps the outputs it computed last; a run
// in which all its inputs are what they were in the run before (shape roots' outputs compared
// byte for byte; initializers bound to the graph's own tensor in both runs, not replaced by a
// run) takes them instead of running its kernel, so the values are the ones the kernel would
// compute. Kept outputs hold at most kMaxReusedElements elements a node and
// kMaxReusedElementsPerPlan in all (a Constant's value whatever its size: its kernel holds it
// anyway), are never of string dtype, and come from the tensor heap, not the plan's arena. A run
// that ends in an error leaves nothing kept.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"
#include "ops/kernel.h"
#include "ops/registry.h"
#include "runtime/memory_plan.h"

namespace onnxtrain::runtime {

// Domain ("" for ai.onnx) -> imported opset version.
using OpsetMap = std::unordered_map<std::string, int>;

// Reads ModelProto.opset_import-style pairs, checks each domain and version onnxtrain knows
// the nodes need. Throws Error naming `source` for an unsupported version.
void check_opsets(const OpsetMap& opsets, const std::string& source);

// Whether an ai.onnx operator draws random numbers (RandomNormal, RandomUniform, their -Like
// forms, Bernoulli, Multinomial, Dropout): its outputs are never computed ahead of a run.
bool is_random_op(const std::string& op_type);

// Called after each step of Plan::run with the node that ran and the values (its outputs set).
using AfterStep = std::function<void(const ir::Node&, const std::vector<Value>&)>;

class Plan {
 public:
  // Creates the kernels (throws Error naming the node for an unknown op, a domain missing from
  // `opsets`, an opset the op has no kernel for, or a bad attribute). `graph` must outlive the
  // plan.
  Plan(const ir::Graph& graph, const OpsetMap& opsets);

  // Runs every step. `values` has a slot per graph value (graph.values().size()); graph
  // inputs and initializers must be set. On return graph outputs are set; other values whose
  // last reader has run are released. Errors name the model, graph and node. `after_step`, when
  // given, is called after each node has run, before values it was the last reader of are
  // released (data-parallel training starts a bucket's allreduce from it).
  void run(std::vector<Value>& values, const ops::RunContext& run_context, const AfterStep* after_step = nullptr);

  size_t num_steps() const { return steps_.size(); }
  // Bytes of the memory plan's arena (MemoryPlan::arena_bytes; 0 before the first run).
  size_t arena_bytes() const { return memory_.arena_bytes(); }
  // Steps of the last run that took the outputs kept from an earlier run instead of running
  // their kernel (the shape-derived nodes above).
  size_t steps_reused() const { return steps_reused_; }

  // The most elements a shape-derived node's kept outputs hold together (512 KiB of int64).
  static constexpr int64_t kMaxReusedElements = 65536;
  // The most elements all kept outputs of a plan hold (4-8 MiB), first come first served.
  static constexpr int64_t kMaxReusedElementsPerPlan = int64_t{1} << 20;

 private:
  enum class ShapeRole { None, Root, Derived };  // the node's part in shape arithmetic (above)
  struct Step {
    ir::NodeId node;
    const ops::KernelDef* def;
    std::unique_ptr<ops::Kernel> kernel;
    std::vector<ir::ValueId> release;  // values dead after this step
    std::string label;                 // graph and node, for the profiler (empty when it is off)
    ShapeRole role = ShapeRole::None;
    // Root and Derived steps: what the kernel computed last, one per output; empty when not kept.
    std::vector<Value> kept_outputs;
    int64_t kept_elements = 0;         // their elements, counted against the plan's limit
  };
  // After a Root or Derived step's kernel ran: marks each output unchanged when it equals the
  // kept one, and keeps the new outputs when they may be kept.
  void keep_outputs(Step& step, const std::vector<Value>& values);

  const ir::Graph& graph_;
  std::vector<Step> steps_;
  MemoryPlan memory_;
  std::vector<char> unchanged_;  // per value, this run: equal to what its step kept
  // An initializer a shape-derived node reads: unchanged in a run that binds the graph's own
  // tensor, as the run before did (a run may replace an initializer's value: GraphRunner's
  // overrides, an initializer that is also a graph input).
  struct ShapeInitializer {
    ir::ValueId id;
    Tensor own;
    bool own_last_run = false;
  };
  std::vector<ShapeInitializer> shape_initializers_;
  bool last_run_completed_ = true;
  size_t steps_reused_ = 0;
  int64_t kept_elements_ = 0;  // counted elements of all kept outputs
};

}  // namespace onnxtrain::runtime
