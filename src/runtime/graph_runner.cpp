#include "runtime/graph_runner.h"

#include <onnx/onnx_pb.h>

#include <algorithm>

#include "onnxtrain/error.h"

namespace onnxtrain::runtime {

ValueInfo value_info(const ir::Value& v) {
  ValueInfo info;
  info.name = v.name;
  info.type = v.value_type;
  info.dtype = v.type.dtype;
  if (v.type.dims) {
    info.rank_known = true;
    for (const ir::Dim& d : *v.type.dims) {
      info.dims.push_back(d.value);
      info.dim_params.push_back(d.param);
    }
  }
  return info;
}

OpsetMap opsets_of(const onnx::ModelProto& model, const std::string& source) {
  OpsetMap opsets;
  for (const auto& opset : model.opset_import()) {
    const std::string domain = opset.domain() == "ai.onnx" ? "" : opset.domain();
    opsets[domain] = static_cast<int>(opset.version());
  }
  check_opsets(opsets, source);
  opsets.emplace("ai.onnxtrain", 1);  // onnxtrain's backward ops, emitted by the Gradient expansion
  return opsets;
}

namespace {

void check_feed(const ValueInfo& info, const Value& value, const std::string& source) {
  const std::string what = source + ": input '" + info.name + "'";
  if (!value.defined()) throw Error(what + " is fed an undefined value");
  if (!info.type.is_tensor() || !value.is_tensor()) {
    if (!has_type(value, info.type)) {
      throw Error(what + " expects " + info.type_string() + " but was fed " + value.description());
    }
    return;
  }
  const Tensor& t = value.tensor();
  if (info.dtype != DataType::Undefined && t.dtype() != info.dtype) {
    throw Error(what + " expects " + info.type_string() + " but was fed " + t.description());
  }
  if (!info.rank_known) return;
  if (t.rank() != info.dims.size()) {
    throw Error(what + " expects rank " + std::to_string(info.dims.size()) + " (" +
                info.type_string() + ") but was fed " + t.description());
  }
  for (size_t i = 0; i < info.dims.size(); ++i) {
    if (info.dims[i] >= 0 && info.dims[i] != t.dim(i)) {
      throw Error(what + " expects " + info.type_string() + " but was fed " + t.description() +
                  " (dim " + std::to_string(i) + " differs)");
    }
  }
}

// A plan depends on the shapes of the tensors fed; sequences and optionals only on their kind.
void append_shape(std::vector<int64_t>& signature, const Value& v) {
  if (!v.is_tensor()) {
    signature.push_back(-2 - static_cast<int64_t>(v.kind()));
    return;
  }
  signature.push_back(static_cast<int64_t>(v.tensor().rank()));
  signature.insert(signature.end(), v.tensor().shape().begin(), v.tensor().shape().end());
}

}  // namespace

GraphRunner::GraphRunner(ir::Graph graph, OpsetMap opsets, std::string source, uint64_t seed,
                         const std::set<std::string>& supplied)
    : source_(std::move(source)), graph_(std::move(graph)), opsets_(std::move(opsets)), seed_(seed) {
  for (ir::ValueId id : graph_.inputs()) {
    const ir::Value& v = graph_.value(id);
    if (supplied.contains(v.name)) {
      supplied_.insert(id);
    } else if (v.is_initializer) {
      optional_inputs_.push_back(value_info(v));
      optional_ids_.push_back(id);
    } else {
      inputs_.push_back(value_info(v));
      input_ids_.push_back(id);
    }
  }
  for (ir::ValueId id : graph_.outputs()) outputs_.push_back(value_info(graph_.value(id)));
  unused_plan_ = std::make_unique<Plan>(graph_, opsets_);
}

std::unique_ptr<Plan> GraphRunner::take_plan(const std::vector<int64_t>& signature) {
  {
    const std::lock_guard lock(mutex_);
    auto it = idle_plans_.find(signature);
    if (it != idle_plans_.end() && !it->second.empty()) {
      std::unique_ptr<Plan> plan = std::move(it->second.back());
      it->second.pop_back();
      return plan;
    }
    if (unused_plan_) return std::move(unused_plan_);
  }
  return std::make_unique<Plan>(graph_, opsets_);  // every plan of this signature is busy
}

std::vector<Value> GraphRunner::take_values() {
  {
    const std::lock_guard lock(mutex_);
    if (!idle_values_.empty()) {
      std::vector<Value> values = std::move(idle_values_.back());
      idle_values_.pop_back();
      return values;
    }
  }
  return std::vector<Value>(graph_.values().size());
}

void GraphRunner::give_back(Execution& execution) {
  execution.values.assign(execution.values.size(), Value());  // release every reference held
  const std::lock_guard lock(mutex_);
  if (execution.plan) idle_plans_[std::move(execution.signature)].push_back(std::move(execution.plan));
  if (execution.values.size() == graph_.values().size()) idle_values_.push_back(std::move(execution.values));
}

size_t GraphRunner::arena_bytes() const {
  std::lock_guard lock(mutex_);
  size_t bytes = unused_plan_ ? unused_plan_->arena_bytes() : 0;
  for (const auto& [signature, plans] : idle_plans_) {
    for (const auto& plan : plans) bytes = std::max(bytes, plan->arena_bytes());
  }
  return bytes;
}

void GraphRunner::bind_and_run(Execution& execution, const std::map<std::string, const Value*>& feeds,
                               std::span<const Override> overrides, const ops::RunContext* run_context,
                               const AfterStep* after_step) {
  for (const auto& [name, value] : feeds) {
    const ir::ValueId id = graph_.find(name);
    if (id == ir::kNoValue || !graph_.value(id).is_graph_input || supplied_.contains(id)) {
      std::string names;
      for (const auto& info : inputs_) names += (names.empty() ? "" : ", ") + info.name;
      throw Error(source_ + ": '" + name + "' is not an input of the model (inputs: " + names + ")");
    }
  }
  execution.values = take_values();
  std::vector<Value>& values = execution.values;
  for (const auto& [id, tensor] : graph_.initializers()) values[static_cast<size_t>(id)] = tensor;
  for (const Override& o : overrides) values[static_cast<size_t>(o.id)] = o.tensor ? Value(*o.tensor) : *o.value;
  std::vector<int64_t>& signature = execution.signature;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    auto it = feeds.find(inputs_[i].name);
    if (it == feeds.end()) {
      throw Error(source_ + ": missing feed for input '" + inputs_[i].name + "' (" +
                  inputs_[i].type_string() + ")");
    }
    const Value& fed = *it->second;
    const ValueType& declared = inputs_[i].type;
    // A value of type T fed where optional(T) is declared is that optional holding it (a Loop
    // body's optional loop-carried value receives the plain value the previous iteration made).
    if (declared.kind() == ValueType::Kind::Optional && !fed.is_optional() && fed.defined() &&
        has_type(fed, declared.element())) {
      values[static_cast<size_t>(input_ids_[i])] = Value::optional(declared.element(), fed);
    } else {
      check_feed(inputs_[i], fed, source_);
      values[static_cast<size_t>(input_ids_[i])] = fed;
    }
    append_shape(signature, fed);
  }
  for (size_t i = 0; i < optional_inputs_.size(); ++i) {
    auto it = feeds.find(optional_inputs_[i].name);
    if (it == feeds.end()) {
      signature.push_back(-1);
      continue;
    }
    check_feed(optional_inputs_[i], *it->second, source_);
    values[static_cast<size_t>(optional_ids_[i])] = *it->second;
    append_shape(signature, *it->second);
  }
  execution.plan = take_plan(signature);
  ops::RunContext own_context;
  if (!run_context) {
    own_context.seed = seed_;
    own_context.run_index = runs_done_.load();
  }
  execution.plan->run(values, run_context ? *run_context : own_context, after_step);
  if (!run_context) runs_done_.fetch_add(1);
}

NamedValues GraphRunner::run_values(const NamedValues& feeds, std::span<const Override> overrides,
                                    const ops::RunContext* run_context) {
  std::map<std::string, const Value*> by_name;
  for (const auto& [name, value] : feeds) by_name.emplace(name, &value);
  Execution execution;
  NamedValues result;
  try {
    bind_and_run(execution, by_name, overrides, run_context);
    for (ir::ValueId id : graph_.outputs()) result[graph_.value(id).name] = execution.values[static_cast<size_t>(id)];
  } catch (...) {
    give_back(execution);
    throw;
  }
  give_back(execution);
  return result;
}

NamedTensors GraphRunner::run(const NamedTensors& feeds, std::span<const Override> overrides,
                              const ops::RunContext* run_context, const AfterStep* after_step) {
  // Tensors fed by reference through Values made once per run (cheap: no allocation).
  std::vector<Value> held;
  held.reserve(feeds.size());
  std::map<std::string, const Value*> by_name;
  for (const auto& [name, tensor] : feeds) by_name.emplace(name, &held.emplace_back(tensor));
  Execution execution;
  NamedTensors result;
  try {
    bind_and_run(execution, by_name, overrides, run_context, after_step);
    for (ir::ValueId id : graph_.outputs()) {
      Value& v = execution.values[static_cast<size_t>(id)];
      if (!v.is_tensor()) {
        throw Error(source_ + ": output '" + graph_.value(id).name + "' is a " + v.type().to_string() +
                    " value; run the model with run_values to receive it");
      }
      result[graph_.value(id).name] = std::move(v.tensor());
    }
  } catch (...) {
    give_back(execution);
    throw;
  }
  give_back(execution);
  return result;
}

}  // namespace onnxtrain::runtime
