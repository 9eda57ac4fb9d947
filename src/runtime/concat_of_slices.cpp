// runtime/fusion.h concat_of_slices_to_gather: a Concat of Slices that reorders the blocks of one
// tensor along one axis, as one Gather.
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "autodiff/builder.h"
#include "onnxtrain/tensor.h"
#include "runtime/fusion.h"
#include "runtime/graph_match.h"

namespace onnxtrain::runtime {

using namespace graph_match;  // NOLINT(google-build-using-namespace): the rewrites' shared readers

namespace {

struct Candidate {
  int concat = 0;
  std::vector<int> slices;           // the Slice nodes, in the Concat's input order
  std::vector<OneAxisSlice> bounds;  // theirs
  int64_t concat_axis = 0;
};

}  // namespace

int concat_of_slices_to_gather(onnx::GraphProto& graph, const std::unordered_map<std::string, int>& opsets) {
  const auto opset = opsets.find("");
  if (opset == opsets.end() || opset->second < 10) return 0;  // Slice's bounds as inputs from opset 10
  std::vector<Candidate> candidates;
  {
    Matcher m(graph);
    const std::unordered_set<std::string> named = attribute_named_values(graph);
    for (int i = 0; i < graph.node_size(); ++i) {
      const onnx::NodeProto& concat = graph.node(i);
      if (!is_onnx_op(concat, "Concat") || concat.input_size() < 2 || concat.output_size() != 1) continue;
      Candidate c;
      c.concat = i;
      c.concat_axis = int_attribute(concat, "axis");
      for (const auto& in : concat.input()) {
        const int producer = in.empty() || named.contains(in) || m.sole_reader(in) != i ? -1 : m.producer_index(in);
        const std::optional<OneAxisSlice> slice =
            producer < 0 ? std::nullopt : one_axis_slice(graph, m, graph.node(producer));
        if (!slice || (!c.bounds.empty() && slice->data != c.bounds[0].data)) {
          c.slices.clear();
          break;
        }
        c.slices.push_back(producer);
        c.bounds.push_back(*slice);
      }
      if (!c.slices.empty()) candidates.push_back(std::move(c));
    }
  }
  if (candidates.empty()) return 0;
  const std::map<std::string, onnx::TypeProto> types = inferred_types(graph, opsets);
  ValueNames names(graph);
  std::map<int, std::vector<onnx::NodeProto>> replace;
  std::set<int> dropped;
  int rewritten = 0;
  for (const Candidate& c : candidates) {
    const std::string& data = c.bounds[0].data;
    const auto dim = static_dim(types, data, c.concat_axis);
    if (!dim) continue;
    const int64_t size = dim->first, axis = dim->second;
    // Each Slice along the Concat's axis; its positions [start, end) after Slice's clamping; the
    // blocks, in the Concat's order, must take every position once.
    std::vector<int64_t> indices;
    std::vector<bool> taken(static_cast<size_t>(size), false);
    bool permutation = true;
    for (const OneAxisSlice& s : c.bounds) {
      const auto slice_dim = static_dim(types, data, s.axis);
      if (!slice_dim || slice_dim->second != axis) {
        permutation = false;
        break;
      }
      const auto [start, end] = s.range(size);
      for (int64_t k = start; k < end && permutation; ++k) {
        permutation = !taken[static_cast<size_t>(k)];
        taken[static_cast<size_t>(k)] = true;
        indices.push_back(k);
      }
      if (!permutation) break;
    }
    if (!permutation || static_cast<int64_t>(indices.size()) != size) continue;
    const onnx::NodeProto& concat = graph.node(c.concat);
    const std::string order = names.fresh(concat.output(0) + ".order");
    onnx::NodeProto gather = node_of("Gather", {data, order}, concat.output(0));
    gather.set_name(concat.name().empty() ? concat.output(0) + ".gather" : concat.name());
    *gather.add_attribute() = autodiff::attr_int("axis", axis);
    replace[c.concat] = {constant_node(order, Tensor::from_vector<int64_t>(Shape{size}, indices)), std::move(gather)};
    dropped.insert(c.slices.begin(), c.slices.end());
    ++rewritten;
  }
  if (rewritten > 0) rebuild_nodes(graph, replace, dropped);
  return rewritten;
}

}  // namespace onnxtrain::runtime
