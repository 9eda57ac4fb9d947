#include "runtime/plan.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <set>

#include "onnxtrain/error.h"
#include "runtime/profiler.h"

namespace onnxtrain::runtime {

namespace {

std::string domain_label(const std::string& domain) { return domain.empty() ? "ai.onnx" : domain; }

const ops::KernelDef& resolve(const ir::Graph& graph, const ir::Node& node, const OpsetMap& opsets,
                              int& opset) {
  const std::string where = graph.description() + ", " + node.description();
  auto it = opsets.find(node.domain);
  if (it == opsets.end()) {
    throw Error(where + ": the model's opset_import has no entry for domain '" +
                domain_label(node.domain) + "'");
  }
  opset = it->second;
  if (const ops::KernelDef* def = ops::find_kernel(node.domain, node.op_type, opset)) return *def;
  std::string versions;
  for (const ops::KernelDef& def : ops::kernel_table()) {
    if (def.domain != node.domain || def.op_type != node.op_type) continue;
    if (!versions.empty()) versions += ", ";
    versions += std::to_string(def.since) + "-" + std::to_string(def.until);
  }
  if (versions.empty()) {
    throw Error(where + ": unknown operator " + domain_label(node.domain) + "." + node.op_type +
                " (not implemented by onnxtrain; see docs/ops.md)");
  }
  const int version = ops::op_version(node.domain, node.op_type, opset);
  if (version == 0) {
    throw Error(where + ": " + domain_label(node.domain) + " opset " + std::to_string(opset) +
                " defines no operator " + node.op_type + " (onnxtrain implements its versions " +
                versions + ")");
  }
  throw Error(where + ": " + domain_label(node.domain) + "." + node.op_type + " version " +
              std::to_string(version) + " (the model imports opset " + std::to_string(opset) +
              ") is not implemented; onnxtrain implements its versions " + versions);
}

bool has_subgraph(const ir::Node& node) {
  if (!node.implicit_inputs.empty()) return true;
  for (const ir::Attribute& a : node.attributes) {
    if (a.type == ir::AttributeType::Graph || a.type == ir::AttributeType::Graphs) return true;
  }
  return false;
}

// Same dtype, shape and bytes (tensors of string dtype are never the same).
bool same_tensor(const Value& a, const Value& b) {
  if (!a.is_tensor() || !b.is_tensor()) return false;
  const Tensor& x = a.tensor();
  const Tensor& y = b.tensor();
  if (!x.defined() || !y.defined() || x.dtype() != y.dtype() || x.dtype() == DataType::String ||
      x.shape() != y.shape()) {
    return false;
  }
  return x.raw_data() == y.raw_data() || std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

}  // namespace

bool is_random_op(const std::string& op_type) {
  static const std::set<std::string> kRandom = {"RandomNormal",     "RandomUniform", "RandomNormalLike",
                                                "RandomUniformLike", "Bernoulli",     "Multinomial",
                                                "Dropout"};
  return kRandom.contains(op_type);
}

void check_opsets(const OpsetMap& opsets, const std::string& source) {
  for (const auto& [domain, version] : opsets) {
    const ops::OpsetRange* range = ops::find_opset_range(domain);
    if (!range) continue;  // unknown domains fail only if a node uses them
    if (version < range->min || version > range->max) {
      throw Error(source + ": opset " + std::to_string(version) + " of domain " +
                  domain_label(domain) + " is not supported (onnxtrain supports " +
                  std::to_string(range->min) + " to " + std::to_string(range->max) + ")");
    }
  }
}

Plan::Plan(const ir::Graph& graph, const OpsetMap& opsets) : graph_(graph) {
  const auto& order = graph.topological_order();
  std::vector<int> last_use(graph.values().size(), -1);
  steps_.reserve(order.size());
  for (size_t s = 0; s < order.size(); ++s) {
    const ir::Node& node = graph.node(order[s]);
    int opset = 0;
    const ops::KernelDef& def = resolve(graph, node, opsets, opset);
    std::unique_ptr<ops::Kernel> kernel;
    try {
      kernel = def.make(ops::KernelInit(graph, node, opset, &opsets));
    } catch (const Error& e) {
      throw e.with_context(graph.description() + ", " + node.description());
    }
    steps_.push_back(Step{order[s], &def, std::move(kernel), {}, {}});
    if (Profiler::instance().enabled()) steps_.back().label = graph.description() + ", " + node.description();
    for (ir::ValueId v : node.inputs) {
      if (v != ir::kNoValue) last_use[static_cast<size_t>(v)] = static_cast<int>(s);
    }
    for (ir::ValueId v : node.implicit_inputs) last_use[static_cast<size_t>(v)] = static_cast<int>(s);
    for (ir::ValueId v : node.outputs) {
      // An output nobody reads dies right after its producer.
      if (v != ir::kNoValue && last_use[static_cast<size_t>(v)] < 0) {
        last_use[static_cast<size_t>(v)] = static_cast<int>(s);
      }
    }
  }
  std::vector<bool> keep(graph.values().size(), false);
  for (ir::ValueId v : graph.outputs()) keep[static_cast<size_t>(v)] = true;
  // Shape roots and shape-derived nodes (plan.h), in topological order.
  std::vector<bool> shape_value(graph.values().size(), false);
  const auto shape_input = [&](ir::ValueId v) {
    return v == ir::kNoValue || shape_value[static_cast<size_t>(v)] || graph.value(v).is_initializer;
  };
  for (Step& step : steps_) {
    const ir::Node& node = graph.node(step.node);
    const bool graph_output = std::any_of(node.outputs.begin(), node.outputs.end(), [&](ir::ValueId v) {
      return v != ir::kNoValue && keep[static_cast<size_t>(v)];
    });
    if (!node.domain.empty() || node.outputs.empty() || graph_output || has_subgraph(node)) continue;
    if (node.op_type == "Shape" || node.op_type == "Size") {
      step.role = ShapeRole::Root;
    } else if (!is_random_op(node.op_type) && std::all_of(node.inputs.begin(), node.inputs.end(), shape_input)) {
      step.role = ShapeRole::Derived;
    } else {
      continue;
    }
    for (ir::ValueId v : node.outputs) {
      if (v != ir::kNoValue) shape_value[static_cast<size_t>(v)] = true;
    }
  }
  // The initializers shape-derived nodes read, each once.
  std::vector<bool> listed(graph.values().size(), false);
  for (const Step& step : steps_) {
    if (step.role != ShapeRole::Derived) continue;
    for (ir::ValueId v : graph.node(step.node).inputs) {
      if (v == ir::kNoValue || !graph.value(v).is_initializer || listed[static_cast<size_t>(v)]) continue;
      listed[static_cast<size_t>(v)] = true;
      shape_initializers_.push_back(ShapeInitializer{v, graph.initializers().at(v)});
    }
  }
  unchanged_.assign(graph.values().size(), 0);
  for (size_t v = 0; v < last_use.size(); ++v) {
    if (last_use[v] >= 0 && !keep[v]) {
      steps_[static_cast<size_t>(last_use[v])].release.push_back(static_cast<ir::ValueId>(v));
    }
  }
}

void Plan::keep_outputs(Step& step, const std::vector<Value>& values) {
  const ir::Node& node = graph_.node(step.node);
  bool keepable = true;
  int64_t elements = 0;
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    const ir::ValueId v = node.outputs[i];
    if (v == ir::kNoValue) continue;
    const Value& out = values[static_cast<size_t>(v)];
    unchanged_[static_cast<size_t>(v)] = !step.kept_outputs.empty() && same_tensor(out, step.kept_outputs[i]);
    keepable = keepable && out.is_tensor() && out.tensor().dtype() != DataType::String;
    if (keepable) elements += out.tensor().numel();
  }
  kept_elements_ -= step.kept_elements;
  step.kept_elements = 0;
  const bool constant = node.op_type == "Constant";  // its kernel holds the value anyway
  step.kept_outputs.clear();
  const bool fits =
      constant || (elements <= kMaxReusedElements && kept_elements_ + elements <= kMaxReusedElementsPerPlan);
  if (!keepable || !fits) return;
  step.kept_outputs.resize(node.outputs.size());
  if (!constant) {
    step.kept_elements = elements;
    kept_elements_ += elements;
  }
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    if (node.outputs[i] != ir::kNoValue) step.kept_outputs[i] = values[static_cast<size_t>(node.outputs[i])];
  }
}

void Plan::run(std::vector<Value>& values, const ops::RunContext& run_context, const AfterStep* after_step) {
  const bool profile = Profiler::instance().enabled();
  memory_.begin_run();
  std::fill(unchanged_.begin(), unchanged_.end(), 0);
  // What a step kept belongs to the inputs of the last run it saw; a run cut short by an error
  // saw only some steps.
  if (!last_run_completed_) {
    for (Step& step : steps_) {
      step.kept_outputs.clear();
      step.kept_elements = 0;
    }
    kept_elements_ = 0;
  }
  last_run_completed_ = false;
  for (ShapeInitializer& init : shape_initializers_) {
    const Value& v = values[static_cast<size_t>(init.id)];
    const bool own = v.is_tensor() && v.tensor().raw_data() == init.own.raw_data() &&
                     v.tensor().dtype() == init.own.dtype() && v.tensor().shape() == init.own.shape();
    unchanged_[static_cast<size_t>(init.id)] = own && init.own_last_run;
    init.own_last_run = own;
  }
  steps_reused_ = 0;
  for (size_t s = 0; s < steps_.size(); ++s) {
    Step& step = steps_[s];
    const ir::Node& node = graph_.node(step.node);
    memory_.set_step(static_cast<int>(s));
    if (step.role == ShapeRole::Derived && !step.kept_outputs.empty()) {
      bool reuse = true;
      for (ir::ValueId v : node.inputs) reuse = reuse && (v == ir::kNoValue || unchanged_[static_cast<size_t>(v)]);
      if (reuse) {
        for (size_t i = 0; i < node.outputs.size(); ++i) {
          const ir::ValueId v = node.outputs[i];
          if (v == ir::kNoValue) continue;
          values[static_cast<size_t>(v)] = step.kept_outputs[i];
          unchanged_[static_cast<size_t>(v)] = 1;
        }
        ++steps_reused_;
        if (after_step) (*after_step)(node, values);
        for (ir::ValueId v : step.release) values[static_cast<size_t>(v)] = Value();
        continue;
      }
    }
    // Kept outputs come from the heap: a step that runs in one run and not in the next must not
    // move the arena's allocation order.
    ops::KernelContext ctx(graph_, node, values, run_context, step.role == ShapeRole::None ? &memory_ : nullptr);
    try {
      const int ti = step.def->type_input;
      if (!step.def->types.empty() && ctx.has_input(ti) && ctx.input_value(ti).is_tensor()) {
        const DataType dt = ctx.input(ti).dtype();
        if (!step.def->types.contains(dt)) {
          throw Error("input " + ctx.input_name(ti) + " has element type " +
                      std::string(dtype_name(dt)) + ", which " + node.op_type +
                      " does not support (supported: " + step.def->types.to_string() + ")");
        }
      }
      if (profile) {
        const auto start = std::chrono::steady_clock::now();
        step.kernel->run(ctx);
        const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start);
        Profiler::instance().record(node.domain.empty() ? node.op_type : node.domain + "." + node.op_type, step.label,
                                    ns.count());
      } else {
        step.kernel->run(ctx);
      }
      for (ir::ValueId v : node.outputs) {
        if (v != ir::kNoValue && !values[static_cast<size_t>(v)].defined()) {
          throw std::logic_error("the kernel did not produce output '" + graph_.value(v).name + "'");
        }
      }
      if (step.role != ShapeRole::None) keep_outputs(step, values);
    } catch (const Error& e) {
      throw e.with_context(graph_.description() + ", " + node.description());
    } catch (const std::bad_alloc&) {
      throw Error(graph_.description() + ", " + node.description() + ": out of memory");
    } catch (const std::exception& e) {
      throw std::runtime_error(graph_.description() + ", " + node.description() +
                               ": internal error: " + e.what());
    }
    if (after_step) (*after_step)(node, values);
    for (ir::ValueId v : step.release) values[static_cast<size_t>(v)] = Value();
  }
  memory_.end_run();
  last_run_completed_ = true;
}

}  // namespace onnxtrain::runtime
