#include "onnxtrain/session.h"

#include <omp.h>
#include <onnx/onnx_pb.h>

#include <algorithm>

#include "autodiff/gradient.h"
#include "onnxtrain/io.h"
#include "runtime/fusion.h"
#include "runtime/graph_runner.h"

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
// The model's graph, with Gradient nodes replaced by their backward nodes, and fused.
ir::Graph inference_graph(const onnx::ModelProto& model, const std::filesystem::path& base_dir,
                          const std::string& source, bool fuse) {
  const bool expand = autodiff::has_gradient_nodes(model.graph());
  // Copying the graph (initializers included) pays only where fuse_conv_pool may match.
  fuse = fuse && std::any_of(model.graph().node().begin(), model.graph().node().end(),
                             [](const onnx::NodeProto& n) { return n.op_type() == "MaxPool"; });
  if (!expand && !fuse) return ir::Graph::from_proto(model.graph(), source, base_dir);
  onnx::GraphProto graph = model.graph();
  if (expand) autodiff::expand_gradients(graph, opsets_of(model, source), source + ", graph '" + graph.name() + "'");
  if (fuse) fuse_conv_pool(graph);
  return ir::Graph::from_proto(graph, source, base_dir);
}
}  // namespace

struct Session::Impl {
  GraphRunner runner;
  Impl(const onnx::ModelProto& model, const std::filesystem::path& base_dir, const std::string& source,
       const SessionOptions& options)
      : runner(inference_graph(model, base_dir, source, options.fuse), opsets_of(model, source), source,
               options.seed) {}
};

namespace {
void apply(const SessionOptions& options) {
  if (options.threads > 0) omp_set_num_threads(options.threads);
}
}  // namespace

Session::Session(const std::filesystem::path& path, SessionOptions options) {
  apply(options);
  const onnx::ModelProto model = io::load_model(path);
  impl_ = std::make_unique<Impl>(model, path.parent_path().empty() ? "." : path.parent_path(), path.string(),
                                 options);
}

Session::Session(const onnx::ModelProto& model, SessionOptions options,
                 const std::filesystem::path& base_dir, const std::string& source) {
  apply(options);
  impl_ = std::make_unique<Impl>(model, base_dir, source, options);
}

Session::~Session() = default;
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;

const std::vector<ValueInfo>& Session::inputs() const { return impl_->runner.inputs(); }
const std::vector<ValueInfo>& Session::optional_inputs() const { return impl_->runner.optional_inputs(); }
const std::vector<ValueInfo>& Session::outputs() const { return impl_->runner.outputs(); }

NamedTensors Session::run(const NamedTensors& feeds) { return impl_->runner.run(feeds); }

}  // namespace onnxtrain::runtime
