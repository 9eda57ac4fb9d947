#include "runtime/graph_runner.h"

#include <onnx/onnx_pb.h>

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
    : source_(std::move(source)), graph_(std::move(graph)), opsets_(std::move(opsets)) {
  own_context_.seed = seed;
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

Plan& GraphRunner::plan_for_signature() {
  auto it = plans_.find(signature_);
  if (it != plans_.end()) return *it->second;
  auto plan = unused_plan_ ? std::move(unused_plan_) : std::make_unique<Plan>(graph_, opsets_);
  return *plans_.emplace(signature_, std::move(plan)).first->second;
}

void GraphRunner::bind_and_run(const std::map<std::string, const Value*>& feeds,
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
  values_.assign(graph_.values().size(), Value());
  for (const auto& [id, tensor] : graph_.initializers()) values_[static_cast<size_t>(id)] = tensor;
  for (const Override& o : overrides) values_[static_cast<size_t>(o.id)] = o.tensor ? Value(*o.tensor) : *o.value;
  signature_.clear();
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
      values_[static_cast<size_t>(input_ids_[i])] = Value::optional(declared.element(), fed);
    } else {
      check_feed(inputs_[i], fed, source_);
      values_[static_cast<size_t>(input_ids_[i])] = fed;
    }
    append_shape(signature_, fed);
  }
  for (size_t i = 0; i < optional_inputs_.size(); ++i) {
    auto it = feeds.find(optional_inputs_[i].name);
    if (it == feeds.end()) {
      signature_.push_back(-1);
      continue;
    }
    check_feed(optional_inputs_[i], *it->second, source_);
    values_[static_cast<size_t>(optional_ids_[i])] = *it->second;
    append_shape(signature_, *it->second);
  }
  try {
    plan_for_signature().run(values_, run_context ? *run_context : own_context_, after_step);
    if (!run_context) ++own_context_.run_index;
  } catch (...) {
    values_.assign(values_.size(), Value());
    throw;
  }
}

NamedValues GraphRunner::run_values(const NamedValues& feeds, std::span<const Override> overrides,
                                    const ops::RunContext* run_context) {
  std::map<std::string, const Value*> by_name;
  for (const auto& [name, value] : feeds) by_name.emplace(name, &value);
  bind_and_run(by_name, overrides, run_context);
  NamedValues result;
  for (ir::ValueId id : graph_.outputs()) result[graph_.value(id).name] = values_[static_cast<size_t>(id)];
  values_.assign(values_.size(), Value());  // release every reference held for this run
  return result;
}

NamedTensors GraphRunner::run(const NamedTensors& feeds, std::span<const Override> overrides,
                              const ops::RunContext* run_context, const AfterStep* after_step) {
  // Tensors fed by reference through Values made once per run (cheap: no allocation).
  std::vector<Value> held;
  held.reserve(feeds.size());
  std::map<std::string, const Value*> by_name;
  for (const auto& [name, tensor] : feeds) by_name.emplace(name, &held.emplace_back(tensor));
  bind_and_run(by_name, overrides, run_context, after_step);
  NamedTensors result;
  for (ir::ValueId id : graph_.outputs()) {
    Value& v = values_[static_cast<size_t>(id)];
    if (!v.is_tensor()) {
      const std::string message = source_ + ": output '" + graph_.value(id).name + "' is a " +
                                  v.type().to_string() + " value; run the model with run_values to receive it";
      values_.assign(values_.size(), Value());
      throw Error(message);
    }
    result[graph_.value(id).name] = std::move(v.tensor());
  }
  values_.assign(values_.size(), Value());
  return result;
}

}  // namespace onnxtrain::runtime
