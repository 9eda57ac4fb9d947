// runtime::Plan — a graph made ready to run: a kernel instance per node in topological order
// and, for every value, the step after which its buffer is released.
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

 private:
  struct Step {
    ir::NodeId node;
    const ops::KernelDef* def;
    std::unique_ptr<ops::Kernel> kernel;
    std::vector<ir::ValueId> release;  // values dead after this step
    std::string label;                 // graph and node, for the profiler (empty when it is off)
  };
  const ir::Graph& graph_;
  std::vector<Step> steps_;
  MemoryPlan memory_;
};

}  // namespace onnxtrain::runtime
