// runtime::Session — runs the inference graph (ModelProto.graph) of an ONNX model on the CPU.
//
//   onnxtrain::runtime::Session session("model.onnx");
//   auto outputs = session.run({{"x", x}});       // name -> Tensor
//
// Plans are made once per input-shape signature and reused: kernel instances with parsed
// attributes and cached oneDNN primitives.
//
// Thread safety: run and run_values may be called on one Session from several threads at once
// (tested under ThreadSanitizer: tests/reliability/concurrency_test.cpp), as may inputs(),
// optional_inputs() and outputs(). A plan serves one call at a time: a call finding every plan
// of its input shapes busy makes another, which is kept for later calls, so memory grows with
// the number of calls that run at once. Random ops of calls that run at once may draw the
// same numbers (see SessionOptions::seed). Construction, moving and destruction must not
// overlap any call. Feeds are only read; outputs belong to the caller.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "onnxtrain/tensor.h"
#include "onnxtrain/value.h"

namespace onnx {
class ModelProto;
}

namespace onnxtrain::runtime {

struct SessionOptions {
  // Threads for OpenMP kernels and oneDNN primitives. > 0: set with omp_set_num_threads in the
  // calling thread at construction and at every run (OpenMP keeps the setting per thread), so it
  // stays in effect for that thread's other OpenMP work too. 0: OMP_NUM_THREADS where set, or the
  // calling thread's count where it was set with omp_set_num_threads; else each run takes one
  // thread per CPU that other processes leave free, at least 1 (1 when they leave none, unless
  // the process's cpuset is narrower than the machine; src/runtime/cpu_load.h: one reading of
  // /proc for the whole process at most every 250 ms; a change of load counts after ~2 s), and
  // the calling thread's count is restored after the run. On 2 CPUs with one busy, ResNet-18's
  // batch-1 inference took 2.65 ms a run on OpenMP's default of 2 threads against 0.99 ms on 1
  // (docs/performance.md, "Shared cores").
  // Sums may round differently on another count, so outputs that must be bit-identical from run
  // to run set a count.
  int threads = 0;
  // Seed of random ops (RandomNormal, Dropout in training mode, ...) that have no `seed`
  // attribute. The same seed gives the same numbers, run after run of a new Session.
  uint64_t seed = 0;
  // Plan the graph with the runtime's rewrites: constant folding (src/runtime/constant_folding.h:
  // nodes whose inputs are all constants run once, when the graph is planned) and fusions
  // (src/runtime/fusion.h: Conv -> Relu -> MaxPool chains, and Conv -> Relu pairs, become one
  // kernel that never stores the convolution's output in the plain layout; MaxPoolGrad ->
  // ReluGrad pairs one pass). Results agree to rounding either way; false runs every node as the
  // model has it.
  bool fuse = true;
};

// A graph input or output as the model declares it. For a tensor: dtype and dims, -1 where
// unknown or symbolic (dim_params holds the name, e.g. "N"); rank_known false when the model
// gives no shape. `type` is the kind of value (tensor, sequence, optional) with its element types.
struct ValueInfo {
  std::string name;
  DataType dtype = DataType::Undefined;
  bool rank_known = false;
  std::vector<int64_t> dims;
  std::vector<std::string> dim_params;
  ValueType type;
  std::string type_string() const;  // "float32[N,784]", "sequence(float32)"
};

using NamedTensors = std::map<std::string, Tensor>;
// Values of any kind by name: graphs whose inputs or outputs are sequences or optionals.
using NamedValues = std::map<std::string, Value>;

class Session {
 public:
  // Loads the model at `path` (external data resolved against its folder). Throws Error for a
  // file that cannot be read or parsed, an invalid graph, an unsupported opset or operator.
  explicit Session(const std::filesystem::path& path, SessionOptions options = {});
  // From a ModelProto in memory. `source` names it in errors; external data is resolved
  // against `base_dir`.
  Session(const onnx::ModelProto& model, SessionOptions options = {},
          const std::filesystem::path& base_dir = {}, const std::string& source = "model");
  ~Session();
  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;

  // Inputs the caller must feed (graph inputs without an initializer); graph inputs with an
  // initializer (IR < 4 models) may be fed to override it and are listed by optional_inputs.
  const std::vector<ValueInfo>& inputs() const;
  const std::vector<ValueInfo>& optional_inputs() const;
  const std::vector<ValueInfo>& outputs() const;

  // Runs the graph. Every required input must be fed with the declared element type, rank
  // and fixed dims; unknown names are rejected. Returns every graph output by name.
  // Throws Error naming the model, node and tensor on bad feeds or a failing node, and for a
  // graph whose inputs or outputs are not all tensors (use run_values).
  NamedTensors run(const NamedTensors& feeds);
  // The same for graphs with sequence- or optional-typed inputs or outputs (ONNX IR.md
  // "Static types"): feeds and outputs are Values of any kind.
  NamedValues run_values(const NamedValues& feeds);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace onnxtrain::runtime
