#include "autodiff/subgraphs.h"

#include <algorithm>
#include <functional>
#include <unordered_set>

#include "autodiff/builder.h"
#include "ir/graph.h"
#include "onnxtrain/error.h"
#include "onnxtrain/io.h"

namespace onnxtrain::autodiff {

namespace {

// Names `graph` defines: its inputs, initializers and node outputs.
std::unordered_set<std::string> defined_names(const onnx::GraphProto& graph) {
  std::unordered_set<std::string> defined;
  for (const auto& v : graph.input()) defined.insert(v.name());
  for (const auto& t : graph.initializer()) defined.insert(t.name());
  for (const auto& n : graph.node()) {
    for (const auto& o : n.output()) {
      if (!o.empty()) defined.insert(o);
    }
  }
  return defined;
}

const onnx::GraphProto* graph_attribute(const onnx::NodeProto& node, const std::string& name) {
  for (const auto& a : node.attribute()) {
    if (a.name() == name && a.has_g()) return &a.g();
  }
  return nullptr;
}

// The value of a Constant node (attribute value, value_int or value_ints), or nullopt.
std::optional<onnx::TensorProto> constant_node_value(const onnx::NodeProto& node) {
  if (node.op_type() != "Constant" || !(node.domain().empty() || node.domain() == "ai.onnx")) return std::nullopt;
  for (const auto& a : node.attribute()) {
    if (a.name() == "value" && a.has_t()) return a.t();
    onnx::TensorProto t;
    t.set_data_type(onnx::TensorProto::INT64);
    if (a.name() == "value_int") {
      t.add_int64_data(a.i());
      return t;
    }
    if (a.name() == "value_ints") {
      t.add_dims(a.ints_size());
      for (int64_t v : a.ints()) t.add_int64_data(v);
      return t;
    }
  }
  return std::nullopt;
}

// The one element of a constant as int64 or bool; nullopt when it holds another type or count.
std::optional<int64_t> scalar_of(const onnx::TensorProto& proto, DataType want, const std::string& what) {
  const Tensor t = io::tensor_from_proto(proto, ".", what);
  if (t.dtype() != want || t.numel() != 1) return std::nullopt;
  if (want == DataType::Bool) return t.data<bool>()[0] ? 1 : 0;
  return t.data<int64_t>()[0];
}

}  // namespace

bool defines(const onnx::GraphProto& graph, const std::string& name) {
  const auto named = [&](const auto& v) { return v.name() == name; };
  if (std::any_of(graph.input().begin(), graph.input().end(), named)) return true;
  if (std::any_of(graph.initializer().begin(), graph.initializer().end(), named)) return true;
  return std::any_of(graph.node().begin(), graph.node().end(), [&](const onnx::NodeProto& n) {
    return std::find(n.output().begin(), n.output().end(), name) != n.output().end();
  });
}

std::optional<onnx::TensorProto> constant_in(const onnx::GraphProto& graph, const std::string& name) {
  for (const auto& v : graph.input()) {
    if (v.name() == name) return std::nullopt;
  }
  for (const auto& t : graph.initializer()) {
    if (t.name() == name) return t;
  }
  for (const auto& n : graph.node()) {
    if (n.output_size() == 1 && n.output(0) == name) return constant_node_value(n);
  }
  return std::nullopt;
}

std::vector<std::string> implicit_inputs(const onnx::NodeProto& node) {
  std::unordered_set<std::string> free;
  for (const auto& a : node.attribute()) {
    if (a.has_g()) ir::collect_free_names(a.g(), free);
    for (const auto& g : a.graphs()) ir::collect_free_names(g, free);
  }
  std::vector<std::string> sorted(free.begin(), free.end());
  std::sort(sorted.begin(), sorted.end());
  return sorted;
}

std::vector<std::string> node_reads(const onnx::NodeProto& node) {
  std::vector<std::string> reads;
  for (const auto& in : node.input()) {
    if (!in.empty()) reads.push_back(in);
  }
  for (auto& name : implicit_inputs(node)) reads.push_back(std::move(name));
  return reads;
}

std::vector<int> topological_order(const onnx::GraphProto& graph) {
  std::unordered_map<std::string, int> producer;
  for (int i = 0; i < graph.node_size(); ++i) {
    for (const auto& o : graph.node(i).output()) {
      if (!o.empty()) producer[o] = i;
    }
  }
  std::vector<int> order, state(static_cast<size_t>(graph.node_size()), 0);
  std::function<void(int)> visit = [&](int i) {
    if (state[static_cast<size_t>(i)] != 0) return;  // done, or on the stack (a cycle)
    state[static_cast<size_t>(i)] = 1;
    for (const auto& in : node_reads(graph.node(i))) {
      const auto it = producer.find(in);
      if (it != producer.end()) visit(it->second);
    }
    state[static_cast<size_t>(i)] = 2;
    order.push_back(i);
  };
  for (int i = 0; i < graph.node_size(); ++i) visit(i);
  return order;
}

onnx::NodeProto copy_node(const onnx::NodeProto& node, std::unordered_map<std::string, std::string>& renames,
                          const std::function<std::string(const std::string&)>& fresh) {
  onnx::NodeProto copy = node;
  for (auto& in : *copy.mutable_input()) {
    const auto it = renames.find(in);
    if (it != renames.end()) in = it->second;
  }
  rename_implicit_inputs(copy, renames);
  for (auto& o : *copy.mutable_output()) {
    if (o.empty()) continue;
    const std::string renamed = fresh(o);
    renames[o] = renamed;
    o = renamed;
  }
  return copy;
}

void rename_implicit_inputs(onnx::NodeProto& node, const std::unordered_map<std::string, std::string>& renames) {
  for (auto& a : *node.mutable_attribute()) {
    if (a.has_g()) rename_enclosing_reads(*a.mutable_g(), renames);
    for (auto& g : *a.mutable_graphs()) rename_enclosing_reads(g, renames);
  }
}

void rename_enclosing_reads(onnx::GraphProto& graph, const std::unordered_map<std::string, std::string>& renames) {
  const std::unordered_set<std::string> defined = defined_names(graph);
  // Names defined here hide the enclosing ones from this graph's own subgraphs too.
  std::unordered_map<std::string, std::string> visible = renames;
  std::erase_if(visible, [&](const auto& entry) { return defined.contains(entry.first); });
  auto rename = [&](std::string& name) {
    const auto it = visible.find(name);
    if (it != visible.end()) name = it->second;
  };
  for (auto& n : *graph.mutable_node()) {
    for (auto& in : *n.mutable_input()) rename(in);
    rename_implicit_inputs(n, visible);
  }
  for (auto& o : *graph.mutable_output()) rename(*o.mutable_name());
}

void prune_to_outputs(onnx::GraphProto& graph) {
  std::unordered_set<std::string> needed;
  for (const auto& o : graph.output()) needed.insert(o.name());
  const std::vector<int> order = topological_order(graph);
  std::vector<bool> keep(static_cast<size_t>(graph.node_size()), false);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const onnx::NodeProto& n = graph.node(*it);
    if (std::none_of(n.output().begin(), n.output().end(), [&](const std::string& o) { return needed.contains(o); })) continue;
    keep[static_cast<size_t>(*it)] = true;
    for (auto& in : node_reads(n)) needed.insert(std::move(in));
  }
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  for (int i = 0; i < graph.node_size(); ++i) {
    if (keep[static_cast<size_t>(i)]) nodes.Add()->Swap(graph.mutable_node(i));
  }
  graph.mutable_node()->Swap(&nodes);
  google::protobuf::RepeatedPtrField<onnx::TensorProto> initializers;
  for (auto& t : *graph.mutable_initializer()) {
    if (needed.contains(t.name())) initializers.Add()->Swap(&t);
  }
  graph.mutable_initializer()->Swap(&initializers);
}

namespace {

// What unrolling a Loop or a Scan shares: copies of the body with fresh names, the body's
// initializers as Constant nodes made once, the emitted nodes.
class BodyCopies {
 protected:
  BodyCopies(const onnx::NodeProto& node, const std::string& label, const LoopScope& scope)
      : node_(node), label_(label), scope_(scope) {}

  [[noreturn]] void fail(const std::string& why) const {
    throw Error(scope_.where + ": cannot differentiate through " + label_ + ": " + why);
  }

  // The body's node order and the body names its nodes and outputs read.
  void read_body() {
    body_ = graph_attribute(node_, "body");
    if (!body_) fail("it has no graph attribute 'body'");
    order_ = topological_order(*body_);
    for (const auto& n : body_->node()) {
      for (auto& r : node_reads(n)) reads_.insert(std::move(r));
    }
    for (const auto& o : body_->output()) reads_.insert(o.name());
  }

  std::string constant(const onnx::TensorProto& value, const std::string& hint) {
    onnx::TensorProto t = value;
    t.clear_name();
    const std::string out = scope_.fresh(hint);
    add("Constant", {}, out, {attr_tensor("value", t)});
    return out;
  }

  static onnx::TensorProto int64_scalar(int64_t v) {
    onnx::TensorProto t;
    t.set_data_type(onnx::TensorProto::INT64);
    t.add_int64_data(v);
    return t;
  }

  // The body's initializers as Constant nodes, made once and shared by the copies.
  const std::unordered_map<std::string, std::string>& shared_constants() {
    if (!shared_made_) {
      for (const auto& t : body_->initializer()) shared_[t.name()] = constant(t, "loop_initializer");
      shared_made_ = true;
    }
    return shared_;
  }

  // One copy of the body: its nodes read names[v] for each body value v bound there, and record
  // their fresh outputs in `names`; returns the name of body output k in this copy.
  std::function<std::string(int)> copy_body(std::unordered_map<std::string, std::string>& names) {
    for (int i : order_) {
      const onnx::NodeProto& node = body_->node(i);
      onnx::NodeProto copy = copy_node(node, names, scope_.fresh);
      copy.set_name(scope_.fresh(node.name().empty() ? node.op_type() : node.name()));
      nodes_.push_back(std::move(copy));
    }
    return [this, &names](int k) {
      const std::string& o = body_->output(k).name();
      const auto found = names.find(o);
      return found == names.end() ? o : found->second;  // an enclosing value the body returns
    };
  }

  void add(const std::string& type, const std::vector<std::string>& inputs, const std::string& output,
           const std::vector<onnx::AttributeProto>& attrs = {}) {
    onnx::NodeProto n;
    n.set_op_type(type);
    n.set_name(scope_.fresh(type));
    for (const auto& in : inputs) n.add_input(in);
    n.add_output(output);
    for (const auto& a : attrs) *n.add_attribute() = a;
    nodes_.push_back(std::move(n));
  }

  // `parts` stacked along a new axis `axis` (negative: from the back) into `out`.
  void stack(const std::vector<std::string>& parts, int64_t axis, const std::string& out) {
    std::vector<std::string> unsqueezed;
    for (const auto& p : parts) {
      const std::string u = scope_.fresh("scan_unsqueezed");
      if (scope_.opset >= 13) {
        auto& axes = axes_[axis];
        if (axes.empty()) {
          onnx::TensorProto t;
          t.set_data_type(onnx::TensorProto::INT64);
          t.add_dims(1);
          t.add_int64_data(axis);
          axes = constant(t, "scan_axes");
        }
        add("Unsqueeze", {p, axes}, u);
      } else {
        add("Unsqueeze", {p}, u, {attr_ints("axes", {axis})});
      }
      unsqueezed.push_back(u);
    }
    add("Concat", unsqueezed, out, {attr_int("axis", axis)});
  }

  const onnx::NodeProto& node_;
  const std::string& label_;
  const LoopScope& scope_;
  const onnx::GraphProto* body_ = nullptr;
  std::vector<int> order_;
  std::unordered_set<std::string> reads_;  // what the body reads of its own names
  std::vector<onnx::NodeProto> nodes_;

 private:
  std::unordered_map<std::string, std::string> shared_;
  bool shared_made_ = false;
  std::unordered_map<int64_t, std::string> axes_;
};

// Builds the nodes of an unrolled Loop (see unroll_loop).
class Unroller : private BodyCopies {
 public:
  Unroller(const onnx::NodeProto& loop, const std::string& label, const LoopScope& scope)
      : BodyCopies(loop, label, scope), loop_(loop) {}

  std::vector<onnx::NodeProto> run() {
    read_body();
    carried_ = loop_.input_size() - 2;
    if (carried_ < 0) fail("it needs inputs M, cond and the loop-carried values");
    if (body_->input_size() != carried_ + 2) {
      fail("its body has " + std::to_string(body_->input_size()) + " inputs, expected " + std::to_string(carried_ + 2));
    }
    if (body_->output_size() < carried_ + 1) {
      fail("its body has " + std::to_string(body_->output_size()) + " outputs, expected at least " +
           std::to_string(carried_ + 1));
    }
    scans_ = body_->output_size() - 1 - carried_;
    const int64_t trips = trip_count();
    std::vector<std::string> carried;
    for (int j = 0; j < carried_; ++j) carried.push_back(loop_.input(2 + j));
    std::vector<std::vector<std::string>> scanned(static_cast<size_t>(scans_));
    const std::string& iteration = body_->input(0).name();
    const std::string& condition = body_->input(1).name();
    for (int64_t it = 0; it < trips; ++it) {
      std::unordered_map<std::string, std::string> names = shared_constants();
      if (reads_.contains(iteration)) names[iteration] = constant(int64_scalar(it), "iteration");
      if (reads_.contains(condition)) names[condition] = true_constant();
      for (int j = 0; j < carried_; ++j) names[body_->input(2 + j).name()] = carried[static_cast<size_t>(j)];
      const auto value = copy_body(names);
      for (int j = 0; j < carried_; ++j) carried[static_cast<size_t>(j)] = value(1 + j);
      for (int k = 0; k < scans_; ++k) scanned[static_cast<size_t>(k)].push_back(value(1 + carried_ + k));
    }
    for (int j = 0; j < carried_ && j < loop_.output_size(); ++j) {
      if (!loop_.output(j).empty()) add("Identity", {carried[static_cast<size_t>(j)]}, loop_.output(j));
    }
    for (int k = 0; k < scans_ && carried_ + k < loop_.output_size(); ++k) {
      const std::string& out = loop_.output(carried_ + k);
      if (!out.empty()) stack_scan_output(scanned[static_cast<size_t>(k)], k, out);
    }
    return std::move(nodes_);
  }

 private:
  // M, when the loop ends by it alone (see unroll_loop); 0 for a constant false condition.
  int64_t trip_count() {
    const std::string& m = loop_.input(0);
    if (m.empty()) fail("the trip count is not known when the graph is planned (input M is omitted)");
    const auto m_value = scope_.constant(m);
    if (!m_value) {
      fail("the trip count is not known when the graph is planned (M '" + m +
           "' is computed or fed, not an initializer or Constant)");
    }
    const auto trips = scalar_of(*m_value, DataType::Int64, "trip count '" + m + "'");
    if (!trips) fail("the trip count M '" + m + "' is not one int64");
    int64_t n = std::max<int64_t>(*trips, 0);
    if (!loop_.input(1).empty()) {
      const std::string& cond = loop_.input(1);
      const auto c = scope_.constant(cond);
      const auto value = c ? scalar_of(*c, DataType::Bool, "condition '" + cond + "'") : std::nullopt;
      if (!value) fail("the loop ends on a condition computed from data (input cond '" + cond + "' is not a constant)");
      if (*value == 0) n = 0;
    }
    const auto body_cond = body_condition();
    if (!body_cond) {
      fail("the loop ends on a condition computed from data (the body's condition output '" + body_->output(0).name() +
           "' is neither a constant nor its condition input passed through)");
    }
    if (!*body_cond) n = std::min<int64_t>(n, 1);
    return n;
  }

  // The body's condition output when it does not depend on data: passed through from the
  // condition input (true while the loop runs), or a constant; followed through Identity nodes.
  std::optional<bool> body_condition() const {
    std::string name = body_->output(0).name();
    const std::unordered_set<std::string> defined = defined_names(*body_);
    for (int hops = 0; hops <= body_->node_size(); ++hops) {
      if (name == body_->input(1).name()) return true;
      std::optional<onnx::TensorProto> value;
      if (defined.contains(name)) {
        value = constant_in(*body_, name);
        if (!value) {
          const auto producer = std::find_if(body_->node().begin(), body_->node().end(), [&](const onnx::NodeProto& n) {
            return n.op_type() == "Identity" && n.output_size() == 1 && n.output(0) == name;
          });
          if (producer == body_->node().end()) return std::nullopt;
          name = producer->input(0);
          continue;
        }
      } else {
        value = scope_.constant(name);
      }
      if (!value) return std::nullopt;
      const auto b = scalar_of(*value, DataType::Bool, "condition '" + name + "'");
      if (!b) return std::nullopt;
      return *b != 0;
    }
    return std::nullopt;
  }

  std::string true_constant() {
    if (true_.empty()) {
      onnx::TensorProto t;
      t.set_data_type(onnx::TensorProto::BOOL);
      t.add_int32_data(1);
      true_ = constant(t, "loop_condition");
    }
    return true_;
  }

  // Scan output k of every copy stacked along a new first axis into `out` (a Constant of shape
  // [0] for zero iterations, as the Loop kernel gives).
  void stack_scan_output(const std::vector<std::string>& parts, int k, const std::string& out) {
    if (parts.empty()) {
      const auto& type = body_->output(1 + carried_ + k).type();
      const int elem = type.has_tensor_type() && type.tensor_type().elem_type() != 0 ? type.tensor_type().elem_type()
                                                                                      : onnx::TensorProto::FLOAT;
      onnx::TensorProto empty;
      empty.set_data_type(elem);
      empty.add_dims(0);
      add("Constant", {}, out, {attr_tensor("value", empty)});
      return;
    }
    stack(parts, 0, out);
  }

  const onnx::NodeProto& loop_;
  int carried_ = 0, scans_ = 0;
  std::string true_;
};

// Builds the nodes of an unrolled Scan (see unroll_scan).
class ScanUnroller : private BodyCopies {
 public:
  ScanUnroller(const onnx::NodeProto& scan, const std::string& label, const LoopScope& scope)
      : BodyCopies(scan, label, scope) {}

  std::vector<onnx::NodeProto> run() {
    if (scope_.opset < 9) fail("Scan-8 (a batch axis and sequence_lens) is not unrolled; export at opset 9 or later");
    read_body();
    int64_t inputs = -1;
    for (const auto& a : node_.attribute()) {
      if (a.name() == "num_scan_inputs") inputs = a.i();
    }
    const int m = static_cast<int>(inputs);
    const int states = node_.input_size() - m;
    const int outputs = body_->output_size() - states;
    if (m < 1 || states < 0 || outputs < 0 || body_->input_size() != states + m) {
      fail("its inputs, body and num_scan_inputs do not agree");
    }
    const auto ints = [&](const char* name, int count) {
      std::vector<int64_t> v(static_cast<size_t>(count), 0);
      for (const auto& a : node_.attribute()) {
        if (a.name() == name) v.assign(a.ints().begin(), a.ints().end());
      }
      if (static_cast<int>(v.size()) != count) fail("attribute '" + std::string(name) + "' has the wrong length");
      return v;
    };
    const auto in_axes = ints("scan_input_axes", m), in_dirs = ints("scan_input_directions", m);
    const auto out_axes = ints("scan_output_axes", outputs), out_dirs = ints("scan_output_directions", outputs);
    const int64_t n = scan_length(node_.input(states), in_axes[0]);
    std::vector<std::string> carried(node_.input().begin(), node_.input().begin() + states);
    std::vector<std::vector<std::string>> scanned(static_cast<size_t>(outputs));
    for (int64_t t = 0; t < n; ++t) {
      std::unordered_map<std::string, std::string> names = shared_constants();
      for (int j = 0; j < states; ++j) names[body_->input(j).name()] = carried[static_cast<size_t>(j)];
      for (int k = 0; k < m; ++k) {
        const std::string& slot = body_->input(states + k).name();
        if (!reads_.contains(slot)) continue;
        const std::string slice = scope_.fresh("scan_slice");
        const std::string at = constant(int64_scalar(in_dirs[static_cast<size_t>(k)] ? n - 1 - t : t), "scan_position");
        add("Gather", {node_.input(states + k), at}, slice, {attr_int("axis", in_axes[static_cast<size_t>(k)])});
        names[slot] = slice;
      }
      const auto value = copy_body(names);
      for (int j = 0; j < states; ++j) carried[static_cast<size_t>(j)] = value(j);
      for (int k = 0; k < outputs; ++k) scanned[static_cast<size_t>(k)].push_back(value(states + k));
    }
    for (int j = 0; j < states && j < node_.output_size(); ++j) {
      if (!node_.output(j).empty()) add("Identity", {carried[static_cast<size_t>(j)]}, node_.output(j));
    }
    for (int k = 0; k < outputs && states + k < node_.output_size(); ++k) {
      const std::string& out = node_.output(states + k);
      if (out.empty()) continue;
      auto& parts = scanned[static_cast<size_t>(k)];
      if (out_dirs[static_cast<size_t>(k)]) std::reverse(parts.begin(), parts.end());
      stack(parts, out_axes[static_cast<size_t>(k)], out);
    }
    return std::move(nodes_);
  }

 private:
  // The length of `input` along `axis`, known when the graph is planned.
  int64_t scan_length(const std::string& input, int64_t axis) const {
    const auto dims = scope_.static_dims ? scope_.static_dims(input) : std::nullopt;
    if (!dims) fail("the shape of scan input '" + input + "' is not known when the graph is planned");
    const auto rank = static_cast<int64_t>(dims->size());
    if (axis < -rank || axis >= rank) fail("scan input '" + input + "' has no axis " + std::to_string(axis));
    const int64_t n = (*dims)[static_cast<size_t>(axis < 0 ? axis + rank : axis)];
    if (n < 0) {
      fail("the length of scan input '" + input + "' along axis " + std::to_string(axis) +
           " is not known when the graph is planned (a symbolic dim)");
    }
    if (n == 0) fail("scan input '" + input + "' is empty along its scan axis");
    return n;
  }
};

}  // namespace

std::vector<onnx::NodeProto> unroll_loop(const onnx::NodeProto& loop, const std::string& label, const LoopScope& scope) {
  return Unroller(loop, label, scope).run();
}

std::vector<onnx::NodeProto> unroll_scan(const onnx::NodeProto& scan, const std::string& label, const LoopScope& scope) {
  return ScanUnroller(scan, label, scope).run();
}

}  // namespace onnxtrain::autodiff
