#include <omp.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <set>

#include "autodiff/gradient.h"
#include "core/dispatch.h"
#include "core/finite.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "distributed/shard_optimizer.h"
#include "distributed/split_program.h"
#include "onnxtrain/distributed.h"
#include "distributed/sync_batch_norm.h"
#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "onnxtrain/training.h"
#include "runtime/constant_folding.h"
#include "runtime/cpu_load.h"
#include "runtime/fusion.h"
#include "runtime/functions.h"
#include "runtime/graph_runner.h"
#include "training/combined_graph.h"
#include "training/validate.h"

namespace onnxtrain::training {

namespace {

struct Binding {
  std::string key;    // the variable
  std::string value;  // the graph output assigned to it
  // The node writing the value checks it for the NaN guard while writing it
  // (ops::checks_outputs_for_nan_guard), so stage() need not read it again.
  bool checked_by_producer = false;
};

// A graph run by the session and the variables it reads as initializers.
struct BoundGraph {
  std::unique_ptr<runtime::GraphRunner> runner;
  std::vector<runtime::Override> overrides;  // point into Impl::state
  std::vector<Binding> bindings;             // update_binding or initialization_binding
  std::string label;                          // names the graph in errors
  // With TrainingOptions::reduce: the graph cut at its Gradient outputs; `runner` then only
  // describes the step's inputs and outputs.
  struct Part {
    std::unique_ptr<runtime::GraphRunner> runner;
    std::vector<runtime::Override> overrides;
  };
  struct Split {
    Part local, update;
    std::set<std::string> reduced;  // distributed::SplitProgram::reduced
    // With TrainingOptions::shard_optimizer_state: how the update part was sharded.
    std::optional<distributed::OptimizerShards> shards;
    std::vector<char> reduced_ids;  // by ValueId of local's graph: 1 where reduced
  };
  std::optional<Split> split;
};

bool all_finite(const Tensor& t) {
  bool finite = true;
  visit_dtype<AllTypes>(t.dtype(), "bound value", [&]<class T>() {
    if constexpr (is_float_v<T>) {
      // Chunks checked in parallel (core/finite.h), each writing its own flag in its own cache line.
      const T* data = t.data<T>();
      struct alignas(64) Flag {
        bool finite = true;
      };
      Flag flags[64];
      const int64_t n = t.numel();
      const int64_t chunks = std::min<int64_t>(64, std::max<int64_t>(1, n / kParallelGrain));
      parallel_for(chunks, 1, [&](int64_t begin, int64_t end) {
        for (int64_t c = begin; c < end; ++c) flags[c].finite = onnxtrain::all_finite(data, n * c / chunks, n * (c + 1) / chunks);
      });
      for (int64_t c = 0; c < chunks; ++c) finite = finite && flags[c].finite;
    }
  });
  return finite;
}

}  // namespace

struct TrainingSession::Impl {
  onnx::ModelProto model;
  std::filesystem::path base_dir;
  std::string source;
  TrainingOptions options;
  runtime::NamedTensors state;
  BoundGraph inference;
  std::vector<BoundGraph> algorithms;
  std::vector<std::optional<BoundGraph>> initializations;
  uint64_t steps_done = 0;            // successful steps: the run index of random ops
  uint64_t initializations_done = 0;  // successful initialize() calls
  // ZeRO-1: the element type and shape of each variable other ranks own (consolidate_state
  // receives them); `consolidated` while state() holds them (after consolidate_state).
  std::map<std::string, std::pair<DataType, Shape>> dropped;
  bool consolidated = false;

  // OpenMP's thread count is a setting of the calling thread (omp_set_num_threads): set on
  // every call, so that a session used from another thread than the one that made it still
  // runs on options.threads; without one, each call follows the machine's load
  // (cpu_load::session_threads), but for data-parallel ranks, which keep OpenMP's default.
  [[nodiscard]] cpu_load::ThreadScope use_threads() const {
    return cpu_load::session_threads(options.threads, !options.reduce);
  }

  Impl(onnx::ModelProto m, TrainingOptions opts, std::filesystem::path dir, std::string src)
      : model(std::move(m)), base_dir(std::move(dir)), source(std::move(src)), options(opts) {
    const cpu_load::ThreadScope threads = cpu_load::session_threads(options.threads, false);
    check_bindings(model, source);
    const runtime::OpsetMap opsets = runtime::opsets_of(model, source);
    // The variables: every key of any binding, valued by its initializer.
    std::set<std::string> keys;
    for (const auto& info : model.training_info()) {
      for (const auto& b : info.update_binding()) keys.insert(b.key());
      for (const auto& b : info.initialization_binding()) keys.insert(b.key());
    }
    // The variables' values move into the state; the model keeps stubs (save() writes values).
    hold_variables(*model.mutable_graph(), keys, source + ", inference graph");
    for (int i = 0; i < model.training_info_size(); ++i) {
      hold_variables(*model.mutable_training_info(i)->mutable_algorithm(), keys, combined_label(source, i));
    }
    // Graphs run with their functions inlined (runtime/functions.h); `model` keeps them as
    // they are, for save().
    auto executable = [&](const onnx::GraphProto& g, const std::string& label) {
      return runtime::has_functions_to_inline(g, model) ? runtime::inline_functions(g, model, label) : g;
    };
    inference = make_bound(executable(model.graph(), source + ", inference graph"), source + ", inference graph",
                           opsets, keys);
    for (int i = 0; i < model.training_info_size(); ++i) {
      const auto& info = model.training_info(i);
      std::map<std::string, std::string> update_bindings;
      for (const auto& b : info.update_binding()) update_bindings[b.key()] = b.value();
      BoundGraph algorithm = make_bound(executable(combine_graphs(model.graph(), info.algorithm()), combined_label(source, i)),
                                        combined_label(source, i), opsets, keys, update_bindings);
      for (const auto& b : info.update_binding()) {
        if (owns(algorithm, b.key())) algorithm.bindings.push_back({b.key(), b.value()});
      }
      mark_checked_by_producer(algorithm);
      algorithms.push_back(std::move(algorithm));
      if (info.has_initialization()) {
        onnx::GraphProto initialization = executable(info.initialization(), initialization_label(source, i));
        std::set<std::string> others;  // ZeRO-1: the values of other ranks' optimizer state
        for (const auto& b : info.initialization_binding()) {
          if (dropped_by(algorithms.back(), b.key())) others.insert(b.value());
        }
        if (!others.empty()) distributed::drop_outputs(initialization, others);
        BoundGraph init = make_bound(initialization, initialization_label(source, i), opsets, {});
        for (const auto& b : info.initialization_binding()) {
          if (!dropped_by(algorithms.back(), b.key())) init.bindings.push_back({b.key(), b.value()});
        }
        initializations.emplace_back(std::move(init));
      } else {
        initializations.emplace_back();
      }
    }
    // Overrides point into `state`, whose entries exist now and are never erased.
    for (BoundGraph* g : all_graphs()) {
      for (auto& o : g->overrides) o.tensor = &state.at(g->runner->graph().value(o.id).name);
      if (!g->split) continue;
      for (BoundGraph::Part* part : {&g->split->local, &g->split->update}) {
        for (auto& o : part->overrides) o.tensor = &state.at(part->runner->graph().value(o.id).name);
      }
    }
    drop_others_state();
  }

  static bool dropped_by(const BoundGraph& g, const std::string& key) {
    return g.split && g.split->shards && g.split->shards->dropped.contains(key);
  }

  // ZeRO-1: false for a variable of `g` another rank owns (its update is not computed here).
  static bool owns(const BoundGraph& g, const std::string& key) {
    if (!g.split || !g.split->shards) return true;
    const auto it = g.split->shards->owner.find(key);
    return it == g.split->shards->owner.end() || it->second == g.split->shards->rank;
  }

  std::vector<BoundGraph*> all_graphs() {
    std::vector<BoundGraph*> graphs{&inference};
    for (auto& a : algorithms) graphs.push_back(&a);
    return graphs;
  }

  // Moves the values of the variables among `g`'s initializers into the state (the first
  // graph to hold one gives its value), leaving stubs: name, element type and dims.
  void hold_variables(onnx::GraphProto& g, const std::set<std::string>& keys, const std::string& label) {
    for (auto& t : *g.mutable_initializer()) {
      if (!keys.contains(t.name())) continue;
      if (!state.contains(t.name())) state.emplace(t.name(), io::tensor_from_proto(t, base_dir, label + ": initializer"));
      onnx::TensorProto stub;
      stub.set_name(t.name());
      stub.set_data_type(t.data_type());
      *stub.mutable_dims() = t.dims();
      t.Swap(&stub);
    }
  }

  // Turns the variables among `graph`'s initializers into graph inputs typed like them; returns
  // their names.
  static std::set<std::string> variables_as_inputs(onnx::GraphProto& graph, const std::set<std::string>& keys) {
    std::set<std::string> inputs, supplied;
    for (const auto& in : graph.input()) inputs.insert(in.name());
    google::protobuf::RepeatedPtrField<onnx::TensorProto> kept;
    for (auto& t : *graph.mutable_initializer()) {
      if (!keys.contains(t.name())) {
        kept.Add()->Swap(&t);
        continue;
      }
      supplied.insert(t.name());
      if (inputs.contains(t.name())) continue;  // IR < 4: initializers are also listed as inputs
      auto* in = graph.add_input();
      in->set_name(t.name());
      auto* type = in->mutable_type()->mutable_tensor_type();
      type->set_elem_type(t.data_type());
      auto* shape = type->mutable_shape();
      for (int64_t d : t.dims()) shape->add_dim()->set_dim_value(d);
    }
    graph.mutable_initializer()->Swap(&kept);
    return supplied;
  }

  // Builds and plans `proto`. Its variables (initializer stubs, see hold_variables) become
  // typed graph inputs that every run supplies from the state, so no graph holds a copy.
  BoundGraph make_bound(const onnx::GraphProto& proto, const std::string& label,
                        const runtime::OpsetMap& opsets, const std::set<std::string>& keys,
                        const std::map<std::string, std::string>& update_bindings = {}) {
    onnx::GraphProto graph = proto;
    const std::set<std::string> supplied = variables_as_inputs(graph, keys);
    run_checker(model, graph, label);
    const bool training = autodiff::has_gradient_nodes(graph);
    std::optional<distributed::SplitProgram> parts;
    std::optional<distributed::OptimizerShards> shards;
    if (training) {
      if (options.sync_batch_norm) distributed::use_sync_batch_norm(graph, opsets, label);
      const std::map<std::string, std::string> parameters = distributed::gradient_parameters(graph);
      std::set<std::string> gradients;
      for (const auto& [gradient, parameter] : parameters) gradients.insert(gradient);
      if (options.fuse) runtime::fuse_before_expansion(graph, opsets);  // their backward passes are the simpler ones
      autodiff::expand_gradients(graph, opsets, label);
      std::set<std::string> bound_values;
      for (const auto& [key, value] : update_bindings) bound_values.insert(value);
      if (options.reduce) parts = distributed::split_at_gradients(graph, gradients, bound_values);
      if (parts && sharded()) shards = shard(parts->update, update_bindings, parameters, label);
    }
    BoundGraph bound;
    bound.label = label;
    BoundGraph::Part whole = plan(std::move(graph), label, opsets, supplied, training);
    bound.runner = std::move(whole.runner);
    bound.overrides = std::move(whole.overrides);
    if (parts) {
      BoundGraph::Split& split = bound.split.emplace(BoundGraph::Split{
          plan(std::move(parts->local), label + " (forward and backward)", opsets, supplied, false),
          plan(std::move(parts->update), label + " (update)", opsets, supplied, true), std::move(parts->reduced),
          std::move(shards)});
      const ir::Graph& local = split.local.runner->graph();
      split.reduced_ids.assign(local.values().size(), 0);
      for (const std::string& name : split.reduced) {
        const ir::ValueId id = local.find(name);
        if (id != ir::kNoValue) split.reduced_ids[static_cast<size_t>(id)] = 1;
      }
    }
    return bound;
  }

  bool sharded() const { return options.shard_optimizer_state && options.shard_optimizer_state->size() > 1; }

  // ZeRO-1: rewrites the update part for this rank (distributed/shard_optimizer.h).
  distributed::OptimizerShards shard(onnx::GraphProto& update, const std::map<std::string, std::string>& update_bindings,
                                     const std::map<std::string, std::string>& parameters, const std::string& label) {
    if (model.training_info_size() != 1) {
      throw Error(source + ": --shard-optimizer-state supports one training_info entry; the model has " +
                  std::to_string(model.training_info_size()));
    }
    std::map<std::string, size_t> bytes;
    for (const auto& [name, value] : state) bytes[name] = value.nbytes();
    const distributed::Communicator& c = *options.shard_optimizer_state;
    return distributed::shard_update(update, update_bindings, parameters, bytes, c.rank(), c.size(), label);
  }

  // ZeRO-1: drops the variables other ranks own from the state (and from the overrides of the
  // uncut plan, which only describes the step), remembering their types for consolidate().
  void drop_others_state() {
    consolidated = false;
    bool freed = false;
    for (BoundGraph& g : algorithms) {
      if (!g.split || !g.split->shards) continue;
      for (const auto& name : g.split->shards->dropped) {
        const auto it = state.find(name);
        if (it == state.end()) continue;
        dropped.insert_or_assign(name, std::make_pair(it->second.dtype(), it->second.shape()));
        state.erase(it);
        freed = true;
      }
      std::erase_if(g.overrides, [&](const runtime::Override& o) { return !state.contains(g.runner->graph().value(o.id).name); });
    }
    if (freed) trim_block_cache();  // give the dropped state's memory back, not to the block cache
    for (const auto& o : inference.overrides) {
      const std::string& name = inference.runner->graph().value(o.id).name;
      if (dropped.contains(name)) {
        throw Error(source + ": --shard-optimizer-state: the inference graph reads '" + name + "', optimizer state another rank owns");
      }
    }
  }

  // ZeRO-1: every rank gets each sharded parameter from its owner (after the update).
  void broadcast_parameters(const distributed::OptimizerShards& shards) {
    distributed::Communicator& c = *options.shard_optimizer_state;
    for (const auto& name : shards.parameters) {
      Tensor& t = state.at(name);
      const int owner = shards.owner.at(name);
      if (owner != c.rank() && !t.storage_unique()) t = Tensor(t.dtype(), t.shape());  // others may share the old storage
      c.broadcast_bytes(t.raw_data(), t.nbytes(), owner, "the broadcast of parameter '" + name + "'");
    }
  }

  // ZeRO-1: rank `to` receives every variable other ranks own (consolidate_state).
  void consolidate(int to) {
    if (!sharded()) return;
    distributed::Communicator& c = *options.shard_optimizer_state;
    for (const BoundGraph& g : algorithms) {
      if (!g.split || !g.split->shards) continue;
      for (const auto& [name, owner] : g.split->shards->owner) {
        if (std::find(g.split->shards->parameters.begin(), g.split->shards->parameters.end(), name) !=
            g.split->shards->parameters.end()) {
          continue;  // every rank holds the parameters
        }
        const std::string what = "the consolidation of '" + name + "' on rank " + std::to_string(to);
        if (owner == c.rank()) {
          Tensor& t = state.at(name);
          c.broadcast_bytes(t.raw_data(), t.nbytes(), owner, what);
          continue;
        }
        const auto& [dtype, shape] = dropped.at(name);
        Tensor received(dtype, shape);
        c.broadcast_bytes(received.raw_data(), received.nbytes(), owner, what);
        if (c.rank() == to) state.insert_or_assign(name, std::move(received));
      }
    }
    consolidated = true;
  }

  // Applies the rewrites (scaled Adam where `adam`) and plans `graph`; the graph inputs named
  // in `supplied` get overrides.
  BoundGraph::Part plan(onnx::GraphProto graph, const std::string& label, const runtime::OpsetMap& opsets,
                        const std::set<std::string>& supplied, bool adam) {
    if (options.fuse) {
      if (adam) runtime::fuse_scaled_adam(graph);
      runtime::fold_constants(graph, opsets, base_dir);
      runtime::fuse_before_expansion(graph, opsets);  // graphs without Gradient nodes (evaluation); the others had theirs
      runtime::fuse_conv_pool(graph);
      runtime::fuse_conv_relu(graph);
      runtime::fuse_products_and_gradients(graph);
      runtime::block_convolution_tensors(graph);
      runtime::share_weight_taps(graph);
      runtime::crop_momentum_gradients(graph);
      runtime::fuse_gather_grad_adam(graph);
      runtime::share_rnn_trace(graph);
      runtime::share_attention_probabilities(graph);
    }
    BoundGraph::Part part;
    part.runner = std::make_unique<runtime::GraphRunner>(ir::Graph::from_proto(graph, label, base_dir), opsets, label,
                                                         0, supplied);
    const ir::Graph& g = part.runner->graph();
    for (ir::ValueId id : g.inputs()) {
      if (supplied.contains(g.value(id).name)) part.overrides.push_back({id});
    }
    return part;
  }

  // Sets Binding::checked_by_producer on the bindings of `g` whose value a node of its main
  // graph writes that checks its outputs for the NaN guard itself.
  static void mark_checked_by_producer(BoundGraph& g) {
    const ir::Graph& graph = g.split ? g.split->update.runner->graph() : g.runner->graph();
    std::set<std::string> checked;
    for (const ir::Node& node : graph.nodes()) {
      if (!ops::checks_outputs_for_nan_guard(node.domain, node.op_type)) continue;
      for (ir::ValueId id : node.outputs) {
        if (id != ir::kNoValue) checked.insert(graph.value(id).name);
      }
    }
    for (Binding& b : g.bindings) b.checked_by_producer = checked.contains(b.value);
  }

  // Checks the bound outputs of one run and writes them into `staged`.
  void stage(const BoundGraph& g, const runtime::NamedTensors& outputs, runtime::NamedTensors& staged) const {
    for (const Binding& b : g.bindings) {
      const Tensor& value = outputs.at(b.value);
      const Tensor& variable = state.at(b.key);
      if (value.dtype() != variable.dtype() || !(value.shape() == variable.shape())) {
        throw Error(g.label + ": binding " + b.key + " <- " + b.value + ": the value is " +
                    value.description() + " but the variable is " + variable.description() +
                    "; no variable was changed");
      }
      if (options.nan_guard && !b.checked_by_producer && !all_finite(value)) {
        throw Error(g.label + ": binding " + b.key + " <- " + b.value +
                    ": the value contains NaN or Inf (NaN guard); no variable was changed");
      }
      staged[b.key] = value;
    }
  }

  // Applies staged values to the state all at once.
  void commit(runtime::NamedTensors& staged) {
    for (auto& [name, value] : staged) state.at(name) = std::move(value);
    staged.clear();
  }

  runtime::NamedTensors run_algorithm(size_t i, const runtime::NamedTensors& feeds) {
    BoundGraph& g = algorithms[i];
    if (consolidated) drop_others_state();
    const ops::RunContext context{options.seed, steps_done, options.nan_guard, options.sync_batch_norm};
    runtime::NamedTensors outputs =
        g.split ? run_split(g, feeds, context) : g.runner->run(feeds, g.overrides, &context);
    runtime::NamedTensors staged;
    stage(g, outputs, staged);
    commit(staged);
    if (g.split && g.split->shards) broadcast_parameters(*g.split->shards);
    return outputs;
  }

  // A step of a cut algorithm: the local part, options.reduce on the cut values, the update
  // part; returns the graph outputs of both.
  runtime::NamedTensors run_split(BoundGraph& g, const runtime::NamedTensors& feeds, const ops::RunContext& context) {
    BoundGraph::Split& s = *g.split;
    const ir::Graph& local = s.local.runner->graph();
    // Buckets of the values to average, in the order the backward pass writes them; each is
    // started when full, so its allreduce overlaps the nodes still to run.
    constexpr size_t kFirstBucketBytes = size_t{1} << 20, kBucketBytes = size_t{25} << 20;
    const std::unique_ptr<distributed::WeightedMean> mean = options.reduce();
    std::vector<std::pair<std::string, const Tensor*>> bucket;
    std::set<std::string> started;
    size_t bytes = 0, cap = kFirstBucketBytes;
    auto start_bucket = [&] {
      mean->start(bucket);
      for (const auto& [name, t] : bucket) started.insert(name);
      bucket.clear();
      bytes = 0;
      cap = kBucketBytes;
    };
    const runtime::AfterStep after_step = [&](const ir::Node& node, const std::vector<Value>& values) {
      for (ir::ValueId id : node.outputs) {
        if (id == ir::kNoValue || !s.reduced_ids[static_cast<size_t>(id)]) continue;
        const Value& value = values[static_cast<size_t>(id)];
        if (!value.is_tensor()) continue;  // run() names it below
        bucket.emplace_back(local.value(id).name, &value.tensor());
        bytes += value.tensor().nbytes();
      }
      if (bytes >= cap) start_bucket();
    };
    runtime::NamedTensors cut = s.local.runner->run(inputs_of(*s.local.runner, feeds), s.local.overrides, &context,
                                                    &after_step);
    // The last bucket, with any value no node wrote (folded into a constant).
    bucket.clear();
    for (const auto& [name, value] : cut) {
      if (s.reduced.contains(name) && !started.contains(name)) bucket.emplace_back(name, &value);
    }
    if (!bucket.empty()) mean->start(bucket);
    for (auto& [name, value] : mean->finish()) cut[name] = std::move(value);
    runtime::NamedTensors update_feeds = inputs_of(*s.update.runner, feeds);
    for (const auto& [name, value] : inputs_of(*s.update.runner, cut)) update_feeds.emplace(name, value);
    runtime::NamedTensors outputs = s.update.runner->run(update_feeds, s.update.overrides, &context);
    for (const auto& out : g.runner->outputs()) {
      const auto it = cut.find(out.name);
      if (it != cut.end()) outputs.emplace(out.name, it->second);
    }
    return outputs;
  }

  // The tensors of `from` that are graph inputs of `runner`.
  static runtime::NamedTensors inputs_of(const runtime::GraphRunner& runner, const runtime::NamedTensors& from) {
    runtime::NamedTensors selected;
    const ir::Graph& graph = runner.graph();
    for (const auto& [name, tensor] : from) {
      const ir::ValueId id = graph.find(name);
      if (id != ir::kNoValue && graph.value(id).is_graph_input) selected.emplace(name, tensor);
    }
    return selected;
  }

  // The kept model with every variable initializer at its current value and `metadata` set in
  // metadata_props (tensors stored as external data stay references to base_dir).
  // The kept model (variables as stubs) with `metadata` set in its metadata_props.
  onnx::ModelProto with_metadata(const std::map<std::string, std::string>& metadata) const {
    onnx::ModelProto copy = model;
    for (const auto& [key, value] : metadata) {
      onnx::StringStringEntryProto* entry = nullptr;
      for (auto& e : *copy.mutable_metadata_props()) {
        if (e.key() == key) entry = &e;
      }
      if (!entry) entry = copy.add_metadata_props();
      entry->set_key(key);
      entry->set_value(value);
    }
    return copy;
  }

  // with_metadata, the variables' current values filled in.
  onnx::ModelProto current_model(const std::map<std::string, std::string>& metadata) const {
    onnx::ModelProto copy = with_metadata(metadata);
    io::set_initializers(copy, state);
    return copy;
  }

  // The feeds that are inputs of algorithm i.
  runtime::NamedTensors feeds_for(size_t i, const runtime::NamedTensors& feeds, std::set<std::string>& used) const {
    runtime::NamedTensors selected;
    const ir::Graph& graph = algorithms[i].runner->graph();
    for (const auto& [name, tensor] : feeds) {
      const ir::ValueId id = graph.find(name);
      if (id != ir::kNoValue && graph.value(id).is_graph_input) {
        selected.emplace(name, tensor);
        used.insert(name);
      }
    }
    return selected;
  }
};

TrainingSession::TrainingSession(const std::filesystem::path& path, TrainingOptions options) {
  onnx::ModelProto model = io::load_model(path);
  impl_ = std::make_unique<Impl>(std::move(model), options, path.parent_path().empty() ? "." : path.parent_path(),
                                 path.string());
}

TrainingSession::TrainingSession(onnx::ModelProto model, TrainingOptions options,
                                 const std::filesystem::path& base_dir, const std::string& source)
    : impl_(std::make_unique<Impl>(std::move(model), options, base_dir, source)) {}

TrainingSession::~TrainingSession() = default;
TrainingSession::TrainingSession(TrainingSession&&) noexcept = default;
TrainingSession& TrainingSession::operator=(TrainingSession&&) noexcept = default;

size_t TrainingSession::num_algorithms() const { return impl_->algorithms.size(); }

const std::vector<runtime::ValueInfo>& TrainingSession::step_inputs(size_t i) const {
  return impl_->algorithms.at(i).runner->inputs();
}
const std::vector<runtime::ValueInfo>& TrainingSession::step_outputs(size_t i) const {
  return impl_->algorithms.at(i).runner->outputs();
}
const std::vector<runtime::ValueInfo>& TrainingSession::inference_inputs() const {
  return impl_->inference.runner->inputs();
}
const std::vector<runtime::ValueInfo>& TrainingSession::inference_outputs() const {
  return impl_->inference.runner->outputs();
}

void TrainingSession::initialize() {
  const cpu_load::ThreadScope threads = impl_->use_threads();
  runtime::NamedTensors staged;
  const ops::RunContext context{impl_->options.seed, impl_->initializations_done};
  for (auto& init : impl_->initializations) {
    // An initialization graph reads no variables, so the order of commits does not matter;
    // all are committed once every graph succeeded.
    if (init) impl_->stage(*init, init->runner->run({}, {}, &context), staged);
  }
  impl_->commit(staged);
  ++impl_->initializations_done;
}

runtime::NamedTensors TrainingSession::step(const runtime::NamedTensors& feeds) {
  const cpu_load::ThreadScope threads = impl_->use_threads();
  // Each algorithm commits atomically; with several, a failure of a later one rolls back the
  // earlier ones.
  runtime::NamedTensors before;
  if (impl_->algorithms.size() > 1) before = impl_->state;
  std::set<std::string> used;
  std::vector<runtime::NamedTensors> selected;
  for (size_t i = 0; i < impl_->algorithms.size(); ++i) selected.push_back(impl_->feeds_for(i, feeds, used));
  for (const auto& [name, tensor] : feeds) {
    if (!used.contains(name)) {
      throw Error(impl_->source + ": feed '" + name + "' is not an input of any training algorithm");
    }
  }
  runtime::NamedTensors outputs;
  try {
    for (size_t i = 0; i < impl_->algorithms.size(); ++i) {
      runtime::NamedTensors result = impl_->run_algorithm(i, selected[i]);
      for (auto& [name, value] : result) outputs[name] = std::move(value);
    }
    ++impl_->steps_done;
  } catch (...) {
    if (impl_->algorithms.size() > 1) {
      for (const auto& [name, value] : before) impl_->state.at(name) = value;
    }
    throw;
  }
  return outputs;
}

runtime::NamedTensors TrainingSession::step(size_t i, const runtime::NamedTensors& feeds) {
  const cpu_load::ThreadScope threads = impl_->use_threads();
  if (i >= impl_->algorithms.size()) {
    throw Error(impl_->source + ": step(" + std::to_string(i) + "): the model has " +
                std::to_string(impl_->algorithms.size()) + " training_info entries");
  }
  runtime::NamedTensors outputs = impl_->run_algorithm(i, feeds);
  ++impl_->steps_done;
  return outputs;
}

runtime::NamedTensors TrainingSession::infer(const runtime::NamedTensors& feeds) {
  const cpu_load::ThreadScope threads = impl_->use_threads();
  return impl_->inference.runner->run(feeds, impl_->inference.overrides);
}

const runtime::NamedTensors& TrainingSession::state() const { return impl_->state; }

void TrainingSession::set_state(const std::string& name, const Tensor& value) {
  auto it = impl_->state.find(name);
  if (it == impl_->state.end()) {
    throw Error(impl_->source + ": '" + name + "' is not a mutable variable of the model");
  }
  if (value.dtype() != it->second.dtype() || !(value.shape() == it->second.shape())) {
    throw Error(impl_->source + ": variable '" + name + "' is " + it->second.description() +
                ", cannot set it to " + value.description());
  }
  it->second = value;
}

void TrainingSession::consolidate_state(int to) { impl_->consolidate(to); }
void TrainingSession::drop_consolidated_state() {
  if (impl_->consolidated) impl_->drop_others_state();
}

uint64_t TrainingSession::steps_done() const { return impl_->steps_done; }

size_t TrainingSession::step_arena_bytes() const {
  size_t bytes = 0;
  for (const BoundGraph& g : impl_->algorithms) {
    if (g.split) {
      bytes += g.split->local.runner->arena_bytes() + g.split->update.runner->arena_bytes();
    } else {
      bytes += g.runner->arena_bytes();
    }
  }
  return bytes;
}
void TrainingSession::set_steps_done(uint64_t steps) { impl_->steps_done = steps; }

void TrainingSession::save(const std::filesystem::path& path, const std::map<std::string, std::string>& metadata) const {
  io::SaveOptions options;
  options.source_dir = impl_->base_dir;
  // The variables go from the state into the file without a filled-in copy of the model.
  io::save_model_with_values(impl_->with_metadata(metadata), impl_->state, path, options);
}

onnx::ModelProto TrainingSession::model(const std::map<std::string, std::string>& metadata) const {
  onnx::ModelProto copy = impl_->current_model(metadata);
  io::inline_external_data(copy, impl_->base_dir);
  return copy;
}

}  // namespace onnxtrain::training
