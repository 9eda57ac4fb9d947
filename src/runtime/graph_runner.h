// runtime::GraphRunner — runs one ir::Graph: checks feeds, keeps Plans per input-shape
// signature, fills initializers (or their current values, for training state) and returns
// the graph outputs. Session and TrainingSession are built on it.
//
// Thread safety: run and run_values may be called from several threads at once. A plan (its
// kernels, their cached primitives and buffers, its memory arena) serves one run at a time:
// each call takes an idle plan of its signature, or makes one when every plan of it is busy,
// and gives it back when done; so memory grows with the number of calls that run at once.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "onnxtrain/session.h"
#include "runtime/plan.h"

namespace onnxtrain::runtime {

// The ValueInfo of a graph value, as the model declares it.
ValueInfo value_info(const ir::Value& value);

// A value the caller supplies for one run: an initializer's replacement or a graph input
// named `supplied` at construction (a training variable: `tensor`), or a value a subgraph
// reads from its enclosing graph (`value`, of any kind). Exactly one of the two is set.
struct Override {
  ir::ValueId id;
  const Tensor* tensor = nullptr;
  const Value* value = nullptr;
};

class GraphRunner {
 public:
  // Makes the first plan (so unknown ops and bad attributes are reported now). `source` names
  // the model in errors. Graph inputs named in `supplied` are not fed: every run's overrides
  // give their values (a training session's variables, held once in its state).
  GraphRunner(ir::Graph graph, OpsetMap opsets, std::string source, uint64_t seed = 0,
              const std::set<std::string>& supplied = {});

  const ir::Graph& graph() const { return graph_; }
  const std::string& source() const { return source_; }
  const std::vector<ValueInfo>& inputs() const { return inputs_; }
  const std::vector<ValueInfo>& optional_inputs() const { return optional_inputs_; }
  const std::vector<ValueInfo>& outputs() const { return outputs_; }
  // Bytes of the largest memory-plan arena among the plans not running now (the kernel outputs
  // of one run laid out by liveness, runtime/memory_plan.h; one plan per shape signature and
  // per call running at once); 0 before the first run.
  size_t arena_bytes() const;

  // Runs the graph; see Session::run for the feed rules. `overrides` replace initializer
  // values for this run. Random ops use `run_context` when given, else the runner's seed and
  // its count of earlier runs that succeeded (calls running at once may see the same count). Returns every graph output by name. run() requires every input
  // and output to be a tensor (an Error names the one that is not); run_values takes any.
  // `after_step`: see Plan::run (nodes of this graph only, not of subgraphs).
  NamedTensors run(const NamedTensors& feeds, std::span<const Override> overrides = {},
                   const ops::RunContext* run_context = nullptr, const AfterStep* after_step = nullptr);
  NamedValues run_values(const NamedValues& feeds, std::span<const Override> overrides = {},
                         const ops::RunContext* run_context = nullptr);

 private:
  // One call's values (indexed by ir::ValueId) and the plan it runs: taken from the idle ones
  // of its signature, given back by the caller.
  struct Execution {
    std::vector<int64_t> signature;
    std::vector<Value> values;
    std::unique_ptr<Plan> plan;
  };
  std::unique_ptr<Plan> take_plan(const std::vector<int64_t>& signature);
  std::vector<Value> take_values();
  void give_back(Execution& execution);
  // Sets the feeds and overrides into the execution's values and its shape signature, then
  // runs a plan of that signature. Gives the plan back on error (the values are cleared).
  void bind_and_run(Execution& execution, const std::map<std::string, const Value*>& feeds,
                    std::span<const Override> overrides, const ops::RunContext* run_context,
                    const AfterStep* after_step = nullptr);

  std::string source_;
  ir::Graph graph_;
  OpsetMap opsets_;
  std::vector<ValueInfo> inputs_, optional_inputs_, outputs_;
  std::vector<ir::ValueId> input_ids_, optional_ids_;
  std::set<ir::ValueId> supplied_;
  uint64_t seed_ = 0;
  std::atomic<uint64_t> runs_done_{0};  // successful runs without a run_context
  mutable std::mutex mutex_;            // guards what follows
  std::unique_ptr<Plan> unused_plan_;   // made at construction; serves the first signature
  std::map<std::vector<int64_t>, std::vector<std::unique_ptr<Plan>>> idle_plans_;
  std::vector<std::vector<Value>> idle_values_;
};

// Domain -> version from ModelProto.opset_import ("ai.onnx" becomes ""), checked.
OpsetMap opsets_of(const onnx::ModelProto& model, const std::string& source);

}  // namespace onnxtrain::runtime
