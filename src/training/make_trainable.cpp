// make_trainable and export_inference (include/onnxtrain/make_trainable.h).
#include "onnxtrain/make_trainable.h"

#include <onnx/onnx_pb.h>
#include <onnx/version_converter/convert.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numbers>
#include <regex>
#include <set>
#include <unordered_map>

#include "autodiff/builder.h"
#include "autodiff/gradient.h"
#include "autodiff/subgraphs.h"
#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "onnxtrain/tensor.h"
#include "training/make_trainable_internal.h"
#include "training/training_metadata.h"

namespace onnxtrain::training {

namespace detail {

onnx::ValueInfoProto value_info(const std::string& name, int32_t elem_type, const std::vector<int64_t>& dims) {
  onnx::ValueInfoProto v;
  v.set_name(name);
  auto* t = v.mutable_type()->mutable_tensor_type();
  t->set_elem_type(elem_type);
  auto* shape = t->mutable_shape();
  for (int64_t d : dims) {
    if (d >= 0) shape->add_dim()->set_dim_value(d);
    else shape->add_dim();
  }
  return v;
}

std::string GraphWriter::node(const std::string& op, const std::vector<std::string>& inputs, const std::string& output,
                              const std::vector<onnx::AttributeProto>& attrs, const std::string& domain) {
  nodes(op, inputs, {output}, attrs, domain);
  return output;
}

void GraphWriter::nodes(const std::string& op, const std::vector<std::string>& inputs, const std::vector<std::string>& outputs,
                        const std::vector<onnx::AttributeProto>& attrs, const std::string& domain) {
  auto* n = g_.add_node();
  n->set_op_type(op);
  if (!domain.empty()) n->set_domain(domain);
  n->set_name(outputs.empty() ? op : outputs[0]);
  for (const auto& i : inputs) n->add_input(i);
  for (const auto& o : outputs) n->add_output(o);
  for (const auto& a : attrs) *n->add_attribute() = a;
}

std::string GraphWriter::scalar(const std::string& name, double value, int32_t elem_type) {
  Tensor t = elem_type == onnx::TensorProto::INT64 ? Tensor::scalar<int64_t>(static_cast<int64_t>(value))
             : elem_type == onnx::TensorProto::DOUBLE ? Tensor::scalar(value)
                                                      : Tensor::scalar(static_cast<float>(value));
  io::tensor_to_proto(t, name, *g_.add_initializer());
  return name;
}

void GraphWriter::initializer(const std::string& name, const Tensor& t) { io::tensor_to_proto(t, name, *g_.add_initializer()); }

std::string Names::claim(const std::string& name) {
  if (!taken_.insert(name).second) {
    throw Error(source_ + ": the training program needs the name '" + name + "', which the model already uses");
  }
  return name;
}

Tensor filled_like(const Param& p, double value) {
  const bool is_double = p.elem_type == onnx::TensorProto::DOUBLE;
  Tensor t = Tensor::zeros(is_double ? DataType::Float64 : DataType::Float32, Shape(p.dims));
  if (value == 0) return t;
  if (is_double) {
    std::fill_n(t.data<double>(), t.numel(), value);
  } else {
    std::fill_n(t.data<float>(), t.numel(), static_cast<float>(value));
  }
  return t;
}

std::vector<std::string> joined(std::initializer_list<std::vector<std::string>> lists) {
  std::vector<std::string> out;
  for (const auto& l : lists) out.insert(out.end(), l.begin(), l.end());
  return out;
}

}  // namespace detail

namespace {

using detail::GraphWriter;
using detail::Param;
using detail::value_info;

onnx::AttributeProto attr_strings(const std::string& name, const std::vector<std::string>& v) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::STRINGS);
  for (const auto& s : v) a.add_strings(s);
  return a;
}

std::vector<int64_t> dims_of(const onnx::TensorProto& t) { return {t.dims().begin(), t.dims().end()}; }

const onnx::ValueInfoProto* find_value(const google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>& list,
                                       const std::string& name) {
  for (const auto& v : list) {
    if (v.name() == name) return &v;
  }
  return nullptr;
}

// The oldest ai.onnx opset the training program is written for; older models are upgraded.
constexpr int kMinOpset = 13;
// The IR version that introduced TrainingInfoProto.
constexpr int kMinIrVersion = 7;

int ai_onnx_opset(const onnx::ModelProto& model) {
  for (const auto& o : model.opset_import()) {
    if (o.domain().empty() || o.domain() == "ai.onnx") return static_cast<int>(o.version());
  }
  return 0;
}

// Float initializers of rank >= 1 on a differentiable path to `output`, in graph order. The walk
// follows only the inputs that the gradient rules differentiate, and never BatchNormalization's
// running statistics (inputs 3 and 4), so shape tensors, indices and buffers are not trainable;
// it follows every value an If's branches or a Loop's body read from the graph.
std::vector<Param> trainable_candidates(const onnx::GraphProto& g, const std::set<std::string>& roots) {
  std::unordered_map<std::string, const onnx::NodeProto*> producer;
  for (const auto& n : g.node()) {
    for (const auto& o : n.output()) producer[o] = &n;
  }
  std::set<std::string> reached;
  std::vector<std::string> stack(roots.begin(), roots.end());
  while (!stack.empty()) {
    const std::string v = stack.back();
    stack.pop_back();
    if (!reached.insert(v).second) continue;
    const auto it = producer.find(v);
    if (it == producer.end()) continue;
    const onnx::NodeProto& n = *it->second;
    const auto* rule = autodiff::find_rule(n.domain() == "ai.onnx" ? "" : n.domain(), n.op_type());
    for (int i = 0; i < n.input_size(); ++i) {
      if (n.input(i).empty()) continue;
      if (rule && (i >= 32 || !(rule->differentiable & (1u << i)))) continue;
      if (n.op_type() == "BatchNormalization" && i >= 3) continue;
      stack.push_back(n.input(i));
    }
    // The values its subgraphs read (an If's branches, a Loop's body).
    if (!rule || rule->enclosing_values) {
      for (auto& name : autodiff::implicit_inputs(n)) stack.push_back(std::move(name));
    }
  }
  std::vector<Param> params;
  for (const auto& t : g.initializer()) {
    const bool floating = t.data_type() == onnx::TensorProto::FLOAT || t.data_type() == onnx::TensorProto::DOUBLE;
    if (floating && t.dims_size() >= 1 && reached.contains(t.name())) params.push_back({t.name(), t.data_type(), dims_of(t)});
  }
  return params;
}

bool full_match_any(const std::vector<std::regex>& patterns, const std::string& name) {
  for (const auto& p : patterns) {
    if (std::regex_match(name, p)) return true;
  }
  return false;
}

std::vector<std::regex> compile(const std::vector<std::string>& patterns, const char* option) {
  std::vector<std::regex> out;
  for (const auto& p : patterns) {
    try {
      out.emplace_back(p);
    } catch (const std::regex_error& e) {
      throw Error(std::string(option) + " '" + p + "' is not a valid regular expression: " + e.what());
    }
  }
  return out;
}

}  // namespace

onnx::ModelProto make_trainable(const onnx::ModelProto& input_model, const MakeTrainableOptions& opt,
                                const std::string& source) {
  onnx::ModelProto model = input_model;
  if (model.training_info_size() > 0) {
    if (!opt.replace) {
      throw Error(source + ": the model already has training_info; use --replace to write a new training program");
    }
    model.clear_training_info();
  }
  const int opset = ai_onnx_opset(model);
  if (opset < kMinOpset) {
    // The training program's ops (SoftmaxCrossEntropyLoss, ReduceSum with axes as an input, ...)
    // need opset 13; older models are upgraded with ONNX's version converter.
    try {
      model = onnx::version_conversion::ConvertVersion(model, kMinOpset);
    } catch (const std::exception& e) {
      throw Error(source + ": the model imports ai.onnx opset " + std::to_string(opset) + "; make-trainable upgrades it to opset " +
                  std::to_string(kMinOpset) + " with ONNX's version converter, which failed: " + e.what());
    }
  }
  // TrainingInfoProto exists from IR version 7; IR 3 models (whose initializers must also be
  // graph inputs, a rule the program's own initializers would break) are lifted to it. Their
  // initializers stay graph inputs, which IR 4 and later read as inputs with a default.
  if (model.ir_version() < kMinIrVersion) model.set_ir_version(kMinIrVersion);
  const onnx::GraphProto& g = model.graph();
  bool has_training_import = false;
  for (const auto& o : model.opset_import()) has_training_import |= o.domain() == autodiff::kTrainingDomain;
  if (!has_training_import) {
    auto* o = model.add_opset_import();
    o->set_domain(autodiff::kTrainingDomain);
    o->set_version(1);
  }

  // Every name the model uses, so the program's names cannot collide.
  std::set<std::string> taken;
  for (const auto& v : g.input()) taken.insert(v.name());
  for (const auto& t : g.initializer()) taken.insert(t.name());
  for (const auto& n : g.node()) taken.insert(n.output().begin(), n.output().end());
  detail::Names names(std::move(taken), source);
  auto claim = [&](const std::string& name) { return names.claim(name); };

  // The output the loss reads.
  std::string output = opt.output;
  if (output.empty()) {
    if (g.output_size() != 1) {
      throw Error(source + ": the model has " + std::to_string(g.output_size()) +
                  " outputs; choose the one the loss reads with --output");
    }
    output = g.output(0).name();
  }
  const onnx::ValueInfoProto* out_info = find_value(g.output(), output);
  if (!out_info) {
    std::string list;
    for (const auto& o : g.output()) list += (list.empty() ? "" : ", ") + o.name();
    throw Error(source + ": the model has no output '" + output + "' (outputs: " + list + ")");
  }
  const auto& out_type = out_info->type().tensor_type();
  const int32_t out_elem = out_type.elem_type();
  if (out_elem != onnx::TensorProto::FLOAT && out_elem != onnx::TensorProto::DOUBLE) {
    throw Error(source + ": output '" + output + "' is not float32 or float64; no loss reads it");
  }
  std::vector<int64_t> out_dims;
  for (const auto& d : out_type.shape().dim()) out_dims.push_back(d.has_dim_value() ? d.dim_value() : -1);

  onnx::TrainingInfoProto& info = *model.add_training_info();
  onnx::GraphProto& alg_graph = *info.mutable_algorithm();
  alg_graph.set_name("onnxtrain_training_step");
  GraphWriter alg(alg_graph);
  auto P = [](const std::string& s) { return std::string(detail::kPrefix) + s; };

  // ---- the loss ----
  const std::string label = opt.label.empty() ? "label" : opt.label;
  const std::string loss = claim(P("loss"));
  const std::string reduction = opt.reduction == Reduction::Mean ? "mean" : "sum";
  auto reduce = [&](const std::string& x) {
    return alg.node(opt.reduction == Reduction::Mean ? "ReduceMean" : "ReduceSum", {x}, loss,
                    {autodiff::attr_int("keepdims", 0)});
  };
  if (!opt.loss_graph.empty()) {
    const onnx::ModelProto loss_model = io::load_model(opt.loss_graph);
    const onnx::GraphProto& lg = loss_model.graph();
    if (lg.output_size() != 1) throw Error(opt.loss_graph + ": a loss graph has exactly one output (the scalar loss)");
    std::set<std::string> model_outputs;
    for (const auto& o : g.output()) model_outputs.insert(o.name());
    std::map<std::string, std::string> rename;
    for (const auto& in : lg.input()) {
      if (model_outputs.contains(in.name())) continue;
      claim(in.name());
      alg.input(in);  // a label input
    }
    auto renamed = [&](const std::string& n) {
      if (n.empty() || model_outputs.contains(n)) return n;
      if (find_value(lg.input(), n)) return n;
      auto it = rename.find(n);
      if (it == rename.end()) it = rename.emplace(n, claim(P("loss_graph." + n))).first;
      return it->second;
    };
    for (const auto& t : lg.initializer()) {
      onnx::TensorProto copy = t;
      copy.set_name(renamed(t.name()));
      *alg_graph.add_initializer() = copy;
    }
    for (const auto& n : lg.node()) {
      onnx::NodeProto copy = n;
      for (auto& i : *copy.mutable_input()) i = renamed(i);
      for (auto& o : *copy.mutable_output()) o = renamed(o);
      *alg_graph.add_node() = copy;
    }
    alg.node("Identity", {renamed(lg.output(0).name())}, loss);
  } else if (opt.loss == Loss::CrossEntropy || opt.loss == Loss::Nll) {
    if (out_dims.size() < 2) {
      throw Error(source + ": output '" + output + "' has rank " + std::to_string(out_dims.size()) +
                  "; " + (opt.loss == Loss::Nll ? "nll" : "cross_entropy") + " needs [N, C, ...] class scores");
    }
    // The label has the output's dims (symbolic names kept) without the class dim.
    onnx::ValueInfoProto label_info = *out_info;
    label_info.set_name(claim(label));
    label_info.mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::INT64);
    auto* dims = label_info.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim();
    dims->erase(dims->begin() + 1);
    alg.input(label_info);
    alg.node(opt.loss == Loss::CrossEntropy ? "SoftmaxCrossEntropyLoss" : "NegativeLogLikelihoodLoss",
             {output, label}, loss, {autodiff::attr_string("reduction", reduction)});
  } else {
    onnx::ValueInfoProto label_info = *out_info;
    label_info.set_name(claim(label));
    alg.input(label_info);
    const std::string diff = alg.node("Sub", {output, label}, claim(P("loss.diff")));
    if (opt.loss == Loss::Mse) {
      reduce(alg.node("Mul", {diff, diff}, claim(P("loss.squared"))));
    } else if (opt.loss == Loss::L1) {
      reduce(alg.node("Abs", {diff}, claim(P("loss.abs"))));
    } else {
      // max(y, 0) - y label + log(1 + e^-|y|), the numerically stable form PyTorch uses.
      const std::string relu = alg.node("Relu", {output}, claim(P("loss.relu")));
      const std::string yl = alg.node("Mul", {output, label}, claim(P("loss.y_label")));
      const std::string neg_abs = alg.node("Neg", {alg.node("Abs", {output}, claim(P("loss.abs")))}, claim(P("loss.neg_abs")));
      const std::string softplus = alg.node("Softplus", {neg_abs}, claim(P("loss.softplus")));
      reduce(alg.node("Add", {alg.node("Sub", {relu, yl}, claim(P("loss.sub"))), softplus}, claim(P("loss.elementwise"))));
    }
  }
  // ---- the trainable set ----
  const std::vector<Param> candidates = trainable_candidates(g, {output});
  std::vector<Param> params = candidates;
  const auto freeze = compile(opt.freeze, "--freeze");
  const auto train = compile(opt.train, "--train");
  for (size_t k = 0; k < opt.freeze.size(); ++k) {
    if (std::none_of(g.initializer().begin(), g.initializer().end(),
                     [&](const onnx::TensorProto& t) { return std::regex_match(t.name(), freeze[k]); })) {
      throw Error(source + ": --freeze '" + opt.freeze[k] + "' matches no initializer");
    }
  }
  for (size_t k = 0; k < opt.train.size(); ++k) {
    if (std::none_of(params.begin(), params.end(), [&](const Param& p) { return std::regex_match(p.name, train[k]); })) {
      throw Error(source + ": --train '" + opt.train[k] + "' matches no trainable initializer");
    }
  }
  std::erase_if(params, [&](const Param& p) {
    return full_match_any(freeze, p.name) || (!train.empty() && !full_match_any(train, p.name));
  });
  if (params.empty()) throw Error(source + ": nothing to train: no floating-point initializer of rank >= 1 feeds the loss");
  const std::vector<detail::Group> groups = detail::resolve_groups(opt, params, candidates, source);

  // ---- gradients ----
  std::vector<std::string> xs, grads;
  for (const auto& p : params) {
    xs.push_back(p.name);
    grads.push_back(claim(P("grad." + p.name)));
  }
  alg.nodes("Gradient", xs, grads, {attr_strings("xs", xs), autodiff::attr_string("y", loss)}, autodiff::kTrainingDomain);
  const int32_t f = params[0].elem_type;
  for (const auto& p : params) {
    if (p.elem_type != f) throw Error(source + ": trainable initializers mix float32 and float64");
  }
  if (opt.grad_clip_norm) {
    // torch.nn.utils.clip_grad_norm_: scale = min(1, max_norm / (norm + 1e-6)), norm over all.
    std::vector<std::string> squares;
    for (size_t i = 0; i < grads.size(); ++i) {
      squares.push_back(alg.node("ReduceSumSquare", {grads[i]}, claim(P("clip.sq." + params[i].name)),
                                 {autodiff::attr_int("keepdims", 0)}));
    }
    const std::string norm = alg.node("Sqrt", {alg.node("Sum", squares, claim(P("clip.sum")))}, claim(P("clip.norm")));
    const std::string denom = alg.node("Add", {norm, alg.scalar(claim(P("clip.eps")), 1e-6, f)}, claim(P("clip.denom")));
    const std::string ratio = alg.node("Div", {alg.scalar(claim(P("clip.max_norm")), *opt.grad_clip_norm, f), denom},
                                       claim(P("clip.ratio")));
    const std::string scale = alg.node("Min", {ratio, alg.scalar(claim(P("clip.one")), 1.0, f)}, claim(P("clip.scale")));
    for (size_t i = 0; i < grads.size(); ++i) {
      grads[i] = alg.node("Mul", {grads[i], scale}, claim(P("clip.grad." + params[i].name)));
    }
  }

  // ---- learning rates (and cycled momenta) of each group from the iteration counter T ----
  const std::string T = claim(P("step"));
  alg.scalar(T, 0, onnx::TensorProto::INT64);
  const detail::ScheduleValues schedule = detail::write_schedule(alg, names, opt, groups, T);
  std::vector<std::string> group_lrs, group_momenta, group_lr_outputs;
  for (size_t k = 0; k < groups.size(); ++k) {
    const std::string& prefix = groups[k].prefix;
    const std::string index = alg.scalar(claim(P(prefix + "lr.index")), static_cast<double>(k), onnx::TensorProto::INT64);
    // "onnxtrain.param_groups.K.lr" is an output; the group of parameters in no group is internal.
    const std::string lr = claim(P(prefix.empty() ? "lr.group" : prefix + "lr"));
    group_lrs.push_back(alg.node("Gather", {schedule.lrs, index}, lr, {autodiff::attr_int("axis", 0)}));
    if (!prefix.empty()) group_lr_outputs.push_back(lr);
    if (!schedule.momenta.empty()) {
      group_momenta.push_back(alg.node("Gather", {schedule.momenta, index}, claim(P(prefix + "cycled_momentum")),
                                         {autodiff::attr_int("axis", 0)}));
    }
  }
  const std::string lr_out = alg.node("Cast", {group_lrs[0]}, claim(P("lr")), {autodiff::attr_int("to", onnx::TensorProto::FLOAT)});

  // ---- the optimizer ----
  std::vector<std::string> new_params;
  for (const auto& p : params) new_params.push_back(claim(P("new." + p.name)));
  const std::vector<detail::State> states =
      detail::write_update(alg, names, groups, {opt, params, grads, new_params, T, group_lrs, group_momenta});
  const std::string T_new = alg.node("Add", {T, alg.scalar(claim(P("step.one")), 1, onnx::TensorProto::INT64)}, claim(P("step.new")));

  // ---- outputs and bindings ----
  alg.output(value_info(loss, f, {}));
  alg.output(value_info(lr_out, onnx::TensorProto::FLOAT, {}));
  for (const auto& lr : group_lr_outputs) alg.output(value_info(lr, onnx::TensorProto::DOUBLE, {}));
  auto bind = [&](const std::string& key, const std::string& value) {
    auto* b = info.add_update_binding();
    b->set_key(key);
    b->set_value(value);
  };
  for (size_t i = 0; i < params.size(); ++i) {
    alg.output(value_info(new_params[i], params[i].elem_type, params[i].dims));
    bind(params[i].name, new_params[i]);
  }
  for (const auto& s : states) {
    alg.output(value_info(s.next, s.param->elem_type, s.param->dims));
    bind(s.name, s.next);
  }
  alg.output(value_info(T_new, onnx::TensorProto::INT64, {}));
  bind(T, T_new);
  // BatchNormalization in training mode: its running statistics outputs update the initializers.
  std::map<std::string, const onnx::TensorProto*> inits;
  for (const auto& t0 : g.initializer()) inits[t0.name()] = &t0;
  for (const auto& n : g.node()) {
    if (n.op_type() != "BatchNormalization" || n.output_size() < 3) continue;
    for (int k = 1; k <= 2; ++k) {
      const std::string& stat = n.input(2 + k);
      if (n.output(k).empty() || !inits.contains(stat)) continue;
      const std::string out = alg.node("Identity", {n.output(k)}, claim(P("running." + stat)));
      alg.output(value_info(out, inits[stat]->data_type(), dims_of(*inits[stat])));
      bind(stat, out);
    }
  }

  // ---- initialization: optimizer state and counter to zero, weights re-drawn with `init` ----
  onnx::GraphProto& init_graph = *info.mutable_initialization();
  init_graph.set_name("onnxtrain_initialization");
  GraphWriter ini(init_graph);
  auto init_bind = [&](const std::string& key, const std::string& value) {
    auto* b = info.add_initialization_binding();
    b->set_key(key);
    b->set_value(value);
  };
  // A tensor of p's shape and element type filled with `value`: ConstantOfShape of its dims (a
  // few bytes in the file and the session) instead of an initializer holding every element
  // (the BERT encoder with AdamW: 89 MB of zeros, kept in the model and in the planned graph).
  auto fill = [&](const Param& p, double value, const std::string& name) {
    const std::string shape = claim(P("init.shape." + name));
    ini.initializer(shape, Tensor::from_vector<int64_t>(Shape{static_cast<int64_t>(p.dims.size())}, p.dims));
    onnx::AttributeProto attr;
    attr.set_name("value");
    attr.set_type(onnx::AttributeProto::TENSOR);
    Param element = p;
    element.dims = {1};
    io::tensor_to_proto(detail::filled_like(element, value), "", *attr.mutable_t());
    return ini.node("ConstantOfShape", {shape}, claim(P("init.out." + name)), {attr});
  };
  for (const auto& s : states) {
    const std::string out = fill(*s.param, s.initial, s.name);
    ini.output(value_info(out, s.param->elem_type, s.param->dims));
    init_bind(s.name, out);
  }
  {
    const std::string z = ini.scalar(claim(P("init.step")), 0, onnx::TensorProto::INT64);
    const std::string out = ini.node("Identity", {z}, claim(P("init.out.step")));
    ini.output(value_info(out, onnx::TensorProto::INT64, {}));
    init_bind(T, out);
  }
  if (opt.init != Init::Keep) {
    for (const auto& p : params) {
      std::string out;
      if (p.dims.size() == 1) {
        out = fill(p, 0, p.name);
      } else {
        out = claim(P("init.out." + p.name));
        // PyTorch's fan convention for a weight [out, in, k...].
        int64_t receptive = 1;
        for (size_t d = 2; d < p.dims.size(); ++d) receptive *= p.dims[d];
        const double fan_in = static_cast<double>(p.dims[1] * receptive);
        const double fan_out = static_cast<double>(p.dims[0] * receptive);
        std::vector<onnx::AttributeProto> attrs{autodiff::attr_ints("shape", p.dims), autodiff::attr_int("dtype", p.elem_type)};
        if (opt.init == Init::Xavier) {
          const double bound = std::sqrt(6.0 / (fan_in + fan_out));
          attrs.push_back(autodiff::attr_float("low", static_cast<float>(-bound)));
          attrs.push_back(autodiff::attr_float("high", static_cast<float>(bound)));
          ini.node("RandomUniform", {}, out, attrs);
        } else {
          const double std = opt.init == Init::He ? std::sqrt(2.0 / fan_in) : opt.init_std;
          attrs.push_back(autodiff::attr_float("mean", 0.0f));
          attrs.push_back(autodiff::attr_float("scale", static_cast<float>(std)));
          ini.node("RandomNormal", {}, out, attrs);
        }
      }
      ini.output(value_info(out, p.elem_type, p.dims));
      init_bind(p.name, out);
    }
  }
  // The hyperparameters and provenance (training_metadata.h), replacing an older record.
  set_metadata_value(model, kTrainingMetadataKey,
                     detail::training_metadata_json(opt, params, groups, states, T, output, label));
  return model;
}

const std::map<std::string, Loss>& loss_names() {
  static const std::map<std::string, Loss> names{{"cross_entropy", Loss::CrossEntropy}, {"nll", Loss::Nll},
                                                 {"mse", Loss::Mse}, {"l1", Loss::L1},
                                                 {"bce_with_logits", Loss::BceWithLogits}};
  return names;
}

const std::map<std::string, Reduction>& reduction_names() {
  static const std::map<std::string, Reduction> names{{"mean", Reduction::Mean}, {"sum", Reduction::Sum}};
  return names;
}

const std::map<std::string, Optimizer>& optimizer_names() {
  static const std::map<std::string, Optimizer> names{{"sgd", Optimizer::Sgd},         {"momentum", Optimizer::Momentum},
                                                      {"nesterov", Optimizer::Nesterov}, {"adagrad", Optimizer::Adagrad},
                                                      {"adam", Optimizer::Adam},       {"adamw", Optimizer::AdamW}};
  return names;
}

const std::map<std::string, Schedule>& schedule_names() {
  static const std::map<std::string, Schedule> names{
      {"constant", Schedule::Constant},   {"step", Schedule::Step},
      {"multistep", Schedule::MultiStep}, {"exponential", Schedule::Exponential},
      {"cosine", Schedule::Cosine},       {"cosine_annealing", Schedule::CosineAnnealing},
      {"linear", Schedule::Linear},       {"polynomial", Schedule::Polynomial},
      {"onecycle", Schedule::OneCycle},   {"sequential", Schedule::Sequential}};
  return names;
}

const std::map<std::string, ParamGroupNumber>& param_group_numbers() {
  static const std::map<std::string, ParamGroupNumber> fields{
      {"lr", &ParamGroup::lr},
      {"weight_decay", &ParamGroup::weight_decay},
      {"momentum", &ParamGroup::momentum},
      {"dampening", &ParamGroup::dampening},
      {"beta1", &ParamGroup::beta1},
      {"beta2", &ParamGroup::beta2},
      {"eps", &ParamGroup::eps},
      {"lr_decay", &ParamGroup::lr_decay},
      {"initial_accumulator_value", &ParamGroup::initial_accumulator_value},
      {"max_lr", &ParamGroup::max_lr},
      {"base_momentum", &ParamGroup::base_momentum},
      {"max_momentum", &ParamGroup::max_momentum}};
  return fields;
}

const std::map<std::string, SchedulerNumber>& scheduler_numbers() {
  static const std::map<std::string, SchedulerNumber> fields{
      {"gamma", &LrScheduler::gamma},           {"factor", &LrScheduler::factor}, {"start_factor", &LrScheduler::start_factor},
      {"end_factor", &LrScheduler::end_factor}, {"power", &LrScheduler::power},   {"eta_min", &LrScheduler::eta_min}};
  return fields;
}

const std::map<std::string, SchedulerInteger>& scheduler_integers() {
  static const std::map<std::string, SchedulerInteger> fields{{"step_size", &LrScheduler::step_size},
                                                              {"total_iters", &LrScheduler::total_iters},
                                                              {"T_max", &LrScheduler::T_max},
                                                              {"t_max", &LrScheduler::T_max},
                                                              {"total_steps", &LrScheduler::total_steps}};
  return fields;
}

void throw_choice_error(const std::string& option, const std::string& name, const std::string& valid) {
  throw Error(option + ": '" + name + "' is not one of " + valid);
}

void set_init(MakeTrainableOptions& options, const std::string& text, const std::string& option) {
  if (text == "keep" || text == "xavier" || text == "he") {
    options.init = text == "keep" ? Init::Keep : text == "xavier" ? Init::Xavier : Init::He;
    return;
  }
  if (text.rfind("normal:", 0) == 0) {
    size_t used = 0;
    double std = 0;
    try {
      std = std::stod(text.substr(7), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text.size() - 7) throw Error(option + ": normal:STD needs a number, got '" + text + "'");
    options.init = Init::Normal;
    options.init_std = std;
    return;
  }
  throw Error(option + ": expected keep, xavier, he or normal:STD, got '" + text + "'");
}

onnx::ModelProto export_inference(const onnx::ModelProto& input) {
  onnx::ModelProto model = input;
  model.clear_training_info();
  bool uses_training_ops = false;
  for (const auto& n : model.graph().node()) uses_training_ops |= n.domain() == autodiff::kTrainingDomain;
  if (!uses_training_ops) {
    auto* imports = model.mutable_opset_import();
    for (int i = imports->size() - 1; i >= 0; --i) {
      if (imports->Get(i).domain() == autodiff::kTrainingDomain) imports->DeleteSubrange(i, 1);
    }
  }
  return model;
}

}  // namespace onnxtrain::training
