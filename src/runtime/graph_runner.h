// runtime::GraphRunner — runs one ir::Graph: checks feeds, keeps a Plan per input-shape
// signature, fills initializers (or their current values, for training state) and returns
// the graph outputs. Session and TrainingSession are built on it.
#pragma once

#include <map>
#include <memory>
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

  // Runs the graph; see Session::run for the feed rules. `overrides` replace initializer
  // values for this run. Random ops use `run_context` when given, else the runner's seed and
  // its count of earlier runs. Returns every graph output by name. run() requires every input
  // and output to be a tensor (an Error names the one that is not); run_values takes any.
  // `after_step`: see Plan::run (nodes of this graph only, not of subgraphs).
  NamedTensors run(const NamedTensors& feeds, std::span<const Override> overrides = {},
                   const ops::RunContext* run_context = nullptr, const AfterStep* after_step = nullptr);
  NamedValues run_values(const NamedValues& feeds, std::span<const Override> overrides = {},
                         const ops::RunContext* run_context = nullptr);

 private:
  Plan& plan_for_signature();
  // Sets the feeds and overrides into values_ and the shape signature; then runs.
  void bind_and_run(const std::map<std::string, const Value*>& feeds, std::span<const Override> overrides,
                    const ops::RunContext* run_context, const AfterStep* after_step = nullptr);

  std::string source_;
  ir::Graph graph_;
  OpsetMap opsets_;
  std::vector<ValueInfo> inputs_, optional_inputs_, outputs_;
  std::vector<ir::ValueId> input_ids_, optional_ids_;
  std::set<ir::ValueId> supplied_;
  std::unique_ptr<Plan> unused_plan_;  // made at construction; serves the first signature
  std::map<std::vector<int64_t>, std::unique_ptr<Plan>> plans_;
  std::vector<int64_t> signature_;
  ops::RunContext own_context_;
  std::vector<Value> values_;
};

// Domain -> version from ModelProto.opset_import ("ai.onnx" becomes ""), checked.
OpsetMap opsets_of(const onnx::ModelProto& model, const std::string& source);

}  // namespace onnxtrain::runtime
