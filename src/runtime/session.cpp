#include "onnxtrain/session.h"

#include <omp.h>
#include <onnx/onnx_pb.h>

#include "ir/graph.h"
#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "runtime/plan.h"

namespace onnxtrain::runtime {

std::string ValueInfo::type_string() const {
  std::string s(dtype == DataType::Undefined ? "?" : std::string(dtype_name(dtype)));
  if (!rank_known) return s + "[...]";
  s += "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ",";
    s += dims[i] >= 0 ? std::to_string(dims[i]) : (dim_params[i].empty() ? "?" : dim_params[i]);
  }
  return s + "]";
}

namespace {

ValueInfo value_info(const ir::Value& v) {
  ValueInfo info;
  info.name = v.name;
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

void check_feed(const ValueInfo& info, const Tensor& t, const std::string& source) {
  const std::string what = source + ": input '" + info.name + "'";
  if (!t.defined()) throw Error(what + " is fed an undefined tensor");
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

}  // namespace

struct Session::Impl {
  std::string source;
  ir::Graph graph;
  OpsetMap opsets;
  std::vector<ValueInfo> inputs, optional_inputs, outputs;
  std::vector<ir::ValueId> input_ids, optional_ids;
  std::unique_ptr<Plan> unused_plan;  // made at load to validate the graph; serves the first run
  std::map<std::vector<int64_t>, std::unique_ptr<Plan>> plans;
  std::vector<int64_t> signature;
  std::vector<Tensor> values;

  Impl(const onnx::ModelProto& model, const SessionOptions& options,
       const std::filesystem::path& base_dir, const std::string& source_name)
      : source(source_name) {
    if (options.threads > 0) omp_set_num_threads(options.threads);
    for (const auto& opset : model.opset_import()) {
      const std::string domain = opset.domain() == "ai.onnx" ? "" : opset.domain();
      opsets[domain] = static_cast<int>(opset.version());
    }
    check_opsets(opsets, source);
    graph = ir::Graph::from_proto(model.graph(), source, base_dir);
    for (ir::ValueId id : graph.inputs()) {
      const ir::Value& v = graph.value(id);
      if (v.is_initializer) {
        optional_inputs.push_back(value_info(v));
        optional_ids.push_back(id);
      } else {
        inputs.push_back(value_info(v));
        input_ids.push_back(id);
      }
    }
    for (ir::ValueId id : graph.outputs()) outputs.push_back(value_info(graph.value(id)));
    unused_plan = std::make_unique<Plan>(graph, opsets);
  }

  Plan& plan_for_signature() {
    auto it = plans.find(signature);
    if (it != plans.end()) return *it->second;
    auto plan = unused_plan ? std::move(unused_plan) : std::make_unique<Plan>(graph, opsets);
    return *plans.emplace(signature, std::move(plan)).first->second;
  }

  NamedTensors run(const NamedTensors& feeds) {
    for (const auto& [name, tensor] : feeds) {
      const ir::ValueId id = graph.find(name);
      if (id == ir::kNoValue || !graph.value(id).is_graph_input) {
        std::string names;
        for (const auto& info : inputs) names += (names.empty() ? "" : ", ") + info.name;
        throw Error(source + ": '" + name + "' is not an input of the model (inputs: " + names + ")");
      }
    }
    values.assign(graph.values().size(), Tensor());
    for (const auto& [id, tensor] : graph.initializers()) values[static_cast<size_t>(id)] = tensor;
    signature.clear();
    for (size_t i = 0; i < inputs.size(); ++i) {
      auto it = feeds.find(inputs[i].name);
      if (it == feeds.end()) {
        throw Error(source + ": missing feed for input '" + inputs[i].name + "' (" +
                    inputs[i].type_string() + ")");
      }
      check_feed(inputs[i], it->second, source);
      values[static_cast<size_t>(input_ids[i])] = it->second;
      signature.push_back(static_cast<int64_t>(it->second.rank()));
      signature.insert(signature.end(), it->second.shape().begin(), it->second.shape().end());
    }
    for (size_t i = 0; i < optional_inputs.size(); ++i) {
      auto it = feeds.find(optional_inputs[i].name);
      if (it == feeds.end()) {
        signature.push_back(-1);
        continue;
      }
      check_feed(optional_inputs[i], it->second, source);
      values[static_cast<size_t>(optional_ids[i])] = it->second;
      signature.push_back(static_cast<int64_t>(it->second.rank()));
      signature.insert(signature.end(), it->second.shape().begin(), it->second.shape().end());
    }
    plan_for_signature().run(values);
    NamedTensors result;
    for (ir::ValueId id : graph.outputs()) {
      result[graph.value(id).name] = values[static_cast<size_t>(id)];
    }
    values.assign(values.size(), Tensor());  // release every reference held for this run
    return result;
  }
};

Session::Session(const std::filesystem::path& path, SessionOptions options) {
  const onnx::ModelProto model = io::load_model(path);
  impl_ = std::make_unique<Impl>(model, options, path.parent_path().empty() ? "." : path.parent_path(),
                                 path.string());
}

Session::Session(const onnx::ModelProto& model, SessionOptions options,
                 const std::filesystem::path& base_dir, const std::string& source)
    : impl_(std::make_unique<Impl>(model, options, base_dir, source)) {}

Session::~Session() = default;
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;

const std::vector<ValueInfo>& Session::inputs() const { return impl_->inputs; }
const std::vector<ValueInfo>& Session::optional_inputs() const { return impl_->optional_inputs; }
const std::vector<ValueInfo>& Session::outputs() const { return impl_->outputs; }

NamedTensors Session::run(const NamedTensors& feeds) { return impl_->run(feeds); }

}  // namespace onnxtrain::runtime
