#include "onnxtrain/session.h"

#include <onnx/onnx_pb.h>

#include <utility>

#include "autodiff/gradient.h"
#include "onnxtrain/io.h"
#include "runtime/constant_folding.h"
#include "runtime/cpu_load.h"
#include "runtime/functions.h"
#include "runtime/fusion.h"
#include "runtime/graph_runner.h"

namespace onnxtrain::runtime {

std::string ValueInfo::type_string() const {
  if (!type.is_tensor()) return type.to_string();
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
// The model's graph, with Gradient nodes replaced by their backward nodes, constants folded and
// fused (runtime/constant_folding.h, runtime/fusion.h).
ir::Graph inference_graph(onnx::GraphProto graph, const OpsetMap& opsets, const std::filesystem::path& base_dir,
                          const std::string& source, bool rewrite) {
  if (rewrite) fuse_before_expansion(graph, opsets);  // their backward passes are the simpler ones
  const bool gradients = autodiff::has_gradient_nodes(graph);
  if (gradients) autodiff::expand_gradients(graph, opsets, source + ", graph '" + graph.name() + "'");
  if (rewrite) {
    fold_constants(graph, opsets, base_dir);
    gather_before_transpose(graph);
    fold_batch_norm_into_conv(graph, opsets);
    fuse_conv_pool(graph);
    fuse_conv_relu(graph);
    use_channels_last(graph);
    block_pooled_conv_pairs(graph);
    fuse_conv_add(graph);
    fuse_products_and_gradients(graph);
    if (gradients) {  // a backward pass's convolutions
      block_convolution_tensors(graph);
      share_weight_taps(graph);
      crop_momentum_gradients(graph);
      fuse_gather_grad_adam(graph);
    }
    share_rnn_trace(graph);
    if (gradients) share_attention_probabilities(graph);
  }
  return ir::Graph::from_proto(graph, source, base_dir);
}
}  // namespace

struct Session::Impl {
  SessionOptions options;
  GraphRunner runner;
  Impl(onnx::GraphProto graph, const OpsetMap& opsets, const std::filesystem::path& base_dir,
       const std::string& source, const SessionOptions& options)
      : options(options),
        runner(inference_graph(std::move(graph), opsets, base_dir, source, options.fuse), opsets, source,
               options.seed) {}
};

// OpenMP's thread count is a setting of the calling thread (omp_set_num_threads): a requested
// count is set at construction (constant folding runs kernels) and on every run, so that runs
// from other threads use it too; without one, each run follows the machine's load
// (cpu_load::session_threads).
Session::Session(const std::filesystem::path& path, SessionOptions options) {
  const cpu_load::ThreadScope threads = cpu_load::session_threads(options.threads, false);
  onnx::ModelProto model = io::load_model(path);
  const OpsetMap opsets = opsets_of(model, path.string());
  onnx::GraphProto graph = has_functions_to_inline(model.graph(), model)
                               ? inline_functions(model.graph(), model, path.string())
                               : std::move(*model.mutable_graph());
  impl_ = std::make_unique<Impl>(std::move(graph), opsets, path.parent_path().empty() ? "." : path.parent_path(),
                                 path.string(), options);
}

Session::Session(const onnx::ModelProto& model, SessionOptions options,
                 const std::filesystem::path& base_dir, const std::string& source) {
  const cpu_load::ThreadScope threads = cpu_load::session_threads(options.threads, false);
  const OpsetMap opsets = opsets_of(model, source);
  impl_ = std::make_unique<Impl>(has_functions_to_inline(model.graph(), model)
                                     ? inline_functions(model.graph(), model, source)
                                     : model.graph(),
                                 opsets, base_dir, source, options);
}

Session::~Session() = default;
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;

const std::vector<ValueInfo>& Session::inputs() const { return impl_->runner.inputs(); }
const std::vector<ValueInfo>& Session::optional_inputs() const { return impl_->runner.optional_inputs(); }
const std::vector<ValueInfo>& Session::outputs() const { return impl_->runner.outputs(); }

NamedTensors Session::run(const NamedTensors& feeds) {
  const cpu_load::ThreadScope threads = cpu_load::session_threads(impl_->options.threads);
  return impl_->runner.run(feeds);
}

NamedValues Session::run_values(const NamedValues& feeds) {
  const cpu_load::ThreadScope threads = cpu_load::session_threads(impl_->options.threads);
  return impl_->runner.run_values(feeds);
}

}  // namespace onnxtrain::runtime
