#include "cli/commands.h"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <filesystem>
#include <iomanip>
#include <cstring>
#include <iostream>
#include <map>
#include <sstream>

#include "core/dispatch.h"
#include "distributed/rank_report.h"
#include "onnxtrain/distributed.h"
#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "onnxtrain/session.h"
#include "onnxtrain/training.h"
#include "training/training_metadata.h"

namespace onnxtrain::cli {

namespace fs = std::filesystem;

fs::path model_folder(const std::string& model_path) {
  const fs::path parent = fs::path(model_path).parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

namespace {

std::string type_string(const onnx::TypeProto& type) {
  if (!type.has_tensor_type()) return "(non-tensor type)";
  const auto& t = type.tensor_type();
  const auto dtype = static_cast<DataType>(t.elem_type());
  std::string s(dtype_name(dtype));
  if (!t.has_shape()) return s + "[...]";
  s += "[";
  for (int i = 0; i < t.shape().dim_size(); ++i) {
    const auto& d = t.shape().dim(i);
    if (i) s += ",";
    s += d.has_dim_value() ? std::to_string(d.dim_value()) : (d.has_dim_param() ? d.dim_param() : "?");
  }
  return s + "]";
}

std::string domain_label(const std::string& domain) { return domain.empty() ? "ai.onnx" : domain; }

uint64_t tensor_bytes(const onnx::TensorProto& t) {
  int64_t n = 1;
  for (int64_t d : t.dims()) n *= d;
  return static_cast<uint64_t>(n) * dtype_size(static_cast<DataType>(t.data_type()));
}

std::string with_commas(uint64_t n) {
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

void print_graph_summary(const onnx::GraphProto& g, const std::string& indent) {
  std::map<std::string, int> op_counts;
  for (const auto& n : g.node()) op_counts[(n.domain().empty() ? "" : n.domain() + ".") + n.op_type()]++;
  uint64_t bytes = 0;
  for (const auto& t : g.initializer()) bytes += tensor_bytes(t);
  std::cout << indent << "nodes: " << g.node_size() << ", initializers: " << g.initializer_size()
            << " (" << with_commas(bytes) << " bytes)\n";
  if (!op_counts.empty()) {
    std::cout << indent << "ops:";
    for (const auto& [op, count] : op_counts) std::cout << " " << op << " x" << count;
    std::cout << "\n";
  }
}

// Letters, digits, '.', '_' and '-' are kept; anything else becomes '_'.
std::string safe_file_name(const std::string& name) {
  std::string s = name;
  for (char& c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) c = '_';
  }
  if (s.empty() || s == "." || s == "..") s = "_" + s;
  return s;
}

std::string preview(const Tensor& t, size_t count = 6) {
  std::ostringstream out;
  out << std::setprecision(6) << "[";
  const int64_t n = t.numel();
  if (t.dtype() == DataType::String) {
    for (int64_t i = 0; i < n && i < static_cast<int64_t>(count); ++i) out << (i ? ", " : "") << std::quoted(t.data<std::string>()[i]);
  } else visit_dtype<AllTypes>(t.dtype(), "output", [&]<class T>() {
    const T* p = t.data<T>();
    for (int64_t i = 0; i < n && i < static_cast<int64_t>(count); ++i) {
      if (i) out << ", ";
      if constexpr (std::is_same_v<T, bool>) out << (p[i] ? "true" : "false");
      else if constexpr (sizeof(T) == 1) out << static_cast<int>(p[i]);
      else out << convert<double>(p[i]);
    }
  });
  if (n > static_cast<int64_t>(count)) out << ", ... (" << n << " values)";
  out << "]";
  return out.str();
}

// A value as one line: "float32[2,3] = [...]", "sequence(float32) of 2: [float32[2] = [...], ...]".
std::string preview(const Value& v) {
  if (v.is_tensor()) return v.tensor().description() + " = " + preview(v.tensor());
  if (v.is_optional()) return v.type().to_string() + ": " + (v.has_element() ? preview(v.element()) : "None");
  std::string s = v.type().to_string() + " of " + std::to_string(v.elements().size()) + ": [";
  for (size_t i = 0; i < v.elements().size() && i < 4; ++i) s += (i ? ", " : "") + preview(v.elements()[i]);
  return s + (v.elements().size() > 4 ? ", ...]" : "]");
}

// --input NAME=FILE values; FILE is .npy, or a .pb holding a TensorProto, or for inputs the
// model declares as sequences or optionals a SequenceProto or OptionalProto. ONNX's test data
// stores bfloat16 tensors as uint16 bit patterns (numpy has no bfloat16): such a file fed to a
// bfloat16 input is read as bfloat16.
runtime::NamedValues read_feeds(const std::vector<std::string>& specs, const std::vector<runtime::ValueInfo>& declared) {
  runtime::NamedValues feeds;
  for (const std::string& spec : specs) {
    const auto eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
      throw Error("--input '" + spec + "': expected NAME=FILE");
    }
    const std::string name = spec.substr(0, eq);
    const fs::path file = spec.substr(eq + 1);
    const std::string ext = file.extension().string();
    const auto info = std::find_if(declared.begin(), declared.end(), [&](const auto& i) { return i.name == name; });
    const ValueType type = info == declared.end() ? ValueType() : info->type;
    Value value;
    if (ext == ".npy") value = io::read_npy(file);
    else if (ext == ".pb") value = io::read_value_pb(file, type).second;
    else throw Error("--input '" + spec + "': the file must be .npy or .pb");
    if (value.is_tensor() && type.dtype() == DataType::BFloat16 && value.tensor().dtype() == DataType::UInt16) {
      const Tensor& bits = value.tensor();
      Tensor t(DataType::BFloat16, bits.shape());
      std::memcpy(t.raw_data(), bits.raw_data(), bits.nbytes());
      value = t;
    }
    feeds[name] = std::move(value);
  }
  return feeds;
}

// Whether NumPy's .npy format has an element type for `dtype`.
bool npy_can_hold(DataType dtype) {
  return dtype == DataType::Bool || dtype == DataType::Float16 || dtype == DataType::Float32 ||
         dtype == DataType::Float64 || is_integral(dtype);
}

runtime::NamedTensors tensors_of(const runtime::NamedValues& values) {
  runtime::NamedTensors tensors;
  for (const auto& [name, v] : values) {
    if (!v.is_tensor()) throw Error("--input " + name + ": a " + v.type().to_string() + " value; this command takes tensors");
    tensors[name] = v.tensor();
  }
  return tensors;
}

}  // namespace

int info(const std::string& model_path) {
  const onnx::ModelProto model = io::load_model(model_path);
  std::error_code ec;
  std::cout << "model: " << model_path << " (" << with_commas(fs::file_size(model_path, ec)) << " bytes)\n";
  std::cout << "ir_version: " << model.ir_version();
  if (!model.producer_name().empty()) {
    std::cout << ", producer: " << model.producer_name() << " " << model.producer_version();
  }
  std::cout << "\nopsets:";
  for (const auto& o : model.opset_import()) std::cout << " " << domain_label(o.domain()) << " " << o.version();
  const auto& g = model.graph();
  std::cout << "\ngraph '" << g.name() << "'\n";
  print_graph_summary(g, "  ");
  std::set<std::string> initializers;
  for (const auto& t : g.initializer()) initializers.insert(t.name());
  std::cout << "inputs:\n";
  for (const auto& v : g.input()) {
    std::cout << "  " << v.name() << "  " << type_string(v.type())
              << (initializers.contains(v.name()) ? "  (has initializer)" : "") << "\n";
  }
  std::cout << "outputs:\n";
  for (const auto& v : g.output()) std::cout << "  " << v.name() << "  " << type_string(v.type()) << "\n";
  const std::string training_metadata = training::metadata_value(model, training::kTrainingMetadataKey);
  if (!training_metadata.empty()) {
    std::cout << "training metadata (" << training::kTrainingMetadataKey << "):\n";
    for (const auto& line : training::training_metadata_summary(training_metadata)) std::cout << "  " << line << "\n";
  }
  if (model.training_info_size() == 0) {
    std::cout << "training_info: none\n";
    return 0;
  }
  // Where each initializer lives, for the variables' types.
  std::map<std::string, const onnx::TensorProto*> tensors;
  for (const auto& t : g.initializer()) tensors[t.name()] = &t;
  std::cout << "training_info: " << model.training_info_size() << " entr"
            << (model.training_info_size() == 1 ? "y" : "ies") << "\n";
  for (int i = 0; i < model.training_info_size(); ++i) {
    const auto& t = model.training_info(i);
    std::map<std::string, const onnx::TensorProto*> visible = tensors;
    for (const auto& init : t.algorithm().initializer()) visible[init.name()] = &init;
    auto variable = [&](const std::string& key) {
      auto it = visible.find(key);
      if (it == visible.end()) return key + " (not an initializer!)";
      std::string dims;
      for (int64_t d : it->second->dims()) dims += (dims.empty() ? "" : ",") + std::to_string(d);
      return key + " " + std::string(dtype_name(static_cast<DataType>(it->second->data_type()))) + "[" + dims + "]";
    };
    std::cout << "  [" << i << "] algorithm '" << t.algorithm().name() << "'\n";
    print_graph_summary(t.algorithm(), "      ");
    for (const auto& v : t.algorithm().input()) std::cout << "      input  " << v.name() << "  " << type_string(v.type()) << "\n";
    for (const auto& v : t.algorithm().output()) std::cout << "      output " << v.name() << "  " << type_string(v.type()) << "\n";
    for (const auto& b : t.update_binding()) {
      std::cout << "      update_binding " << variable(b.key()) << " <- " << b.value() << "\n";
    }
    if (t.has_initialization()) {
      std::cout << "  [" << i << "] initialization '" << t.initialization().name() << "'\n";
      print_graph_summary(t.initialization(), "      ");
      for (const auto& b : t.initialization_binding()) {
        std::cout << "      initialization_binding " << variable(b.key()) << " <- " << b.value() << "\n";
      }
    } else {
      std::cout << "  [" << i << "] initialization: none\n";
    }
  }
  return 0;
}

int check(const std::string& model_path) {
  const onnx::ModelProto model = io::load_model(model_path);
  try {
    onnx::checker::check_model(model_path);
  } catch (const std::exception& e) {
    std::cerr << "error: " << model_path << ": the ONNX checker rejects the model: " << e.what() << "\n";
    return 2;
  }
  const fs::path base_dir = model_folder(model_path);
  if (model.training_info_size() > 0) {
    training::validate_training_info(model, model_path, base_dir);
    training::TrainingSession session(model, {}, base_dir, model_path);  // plans every graph
  } else {
    runtime::Session session(model, {}, base_dir, model_path);
  }
  std::cout << "ok: " << model_path << " is valid (" << model.graph().node_size() << " nodes";
  for (const auto& o : model.opset_import()) std::cout << ", " << domain_label(o.domain()) << " opset " << o.version();
  if (model.training_info_size() > 0) std::cout << ", " << model.training_info_size() << " training_info";
  std::cout << ")\n";
  return 0;
}

int run(const RunArgs& args) {
  runtime::SessionOptions options;
  options.threads = args.threads;
  runtime::Session session(fs::path(args.model), options);
  std::vector<runtime::ValueInfo> declared = session.inputs();
  declared.insert(declared.end(), session.optional_inputs().begin(), session.optional_inputs().end());
  const runtime::NamedValues outputs = session.run_values(read_feeds(args.inputs, declared));
  if (!args.output_dir.empty()) {
    std::error_code ec;
    fs::create_directories(args.output_dir, ec);
    if (ec) throw Error(args.output_dir + ": cannot create the output folder: " + ec.message());
  }
  for (const auto& info : session.outputs()) {
    const Value& v = outputs.at(info.name);
    std::cout << info.name << ": " << preview(v) << "\n";
    if (args.output_dir.empty()) continue;
    // Tensors NumPy has a type for as .npy; others (strings, bfloat16, float8, int4, ...),
    // sequences and optionals as .pb.
    const fs::path stem = fs::path(args.output_dir) / safe_file_name(info.name);
    if (v.is_tensor() && npy_can_hold(v.tensor().dtype())) {
      io::write_npy(v.tensor(), stem.string() + ".npy");
    } else {
      io::write_value_pb(v, info.name, stem.string() + ".pb");
    }
  }
  return 0;
}

int step(const StepArgs& args) {
  training::TrainingOptions options;
  options.threads = args.threads;
  training::TrainingSession session(fs::path(args.model), options);
  const runtime::NamedTensors feeds = tensors_of(read_feeds(args.inputs, {}));
  if (args.initialize) session.initialize();
  for (int k = 1; k <= args.steps; ++k) {
    const runtime::NamedTensors outputs = session.step(feeds);
    // Report the algorithms' scalar outputs (the loss, usually).
    std::cout << "step " << k;
    for (size_t i = 0; i < session.num_algorithms(); ++i) {
      for (const auto& info : session.step_outputs(i)) {
        const Tensor& t = outputs.at(info.name);
        // A float64 value is printed with every digit it has (17), so that it reads back exactly.
        const int digits = t.dtype() == DataType::Float64 ? 17 : 7;
        if (t.numel() == 1) std::cout << "  " << info.name << "=" << std::setprecision(digits) << t.to_double_vector()[0];
      }
    }
    std::cout << "\n";
  }
  session.save(args.output);
  std::cout << "saved " << args.output << "\n";
  return 0;
}

int make_trainable(const MakeTrainableArgs& args) {
  const fs::path base_dir = model_folder(args.model);
  onnx::ModelProto model = io::load_model(args.model);
  // The written model carries its weights inline (save_model brings external data in); do it
  // first, so that the in-memory ONNX checker below does not look for the data file in the
  // current folder (torch.onnx.export writes external data by default).
  io::inline_external_data(model, base_dir);
  const onnx::ModelProto trainable = training::make_trainable(model, args.options, args.model);
  // Check before writing, as `onnxtrain check` does: a model this command writes must pass it.
  try {
    onnx::checker::check_model(trainable);
  } catch (const std::exception& e) {
    throw Error(args.model + ": the trainable model make-trainable built fails the ONNX checker (nothing written): " +
                e.what());
  }
  const std::string built = args.model + " made trainable (nothing written)";
  training::validate_training_info(trainable, built, base_dir);
  training::TrainingSession planned(trainable, {}, base_dir, built);  // plans every graph
  io::save_model(trainable, args.output, {.source_dir = base_dir});
  const auto& info = trainable.training_info(0);
  std::cout << "wrote " << args.output << ": " << info.update_binding_size() << " update bindings, "
            << info.initialization_binding_size() << " initialization bindings\n";
  for (const auto& b : info.update_binding()) {
    if (b.key().rfind("onnxtrain.", 0) != 0) std::cout << "  trains " << b.key() << "\n";
  }
  return 0;
}

namespace {
std::atomic<int> g_stop{0};
extern "C" void request_stop(int signal) { g_stop.store(signal); }
}  // namespace

int train(const training::TrainOptions& given) {
  std::signal(SIGINT, request_stop);
  std::signal(SIGTERM, request_stop);
  training::TrainOptions options = given;
  options.communicator = distributed::world();  // under mpirun: data-parallel (docs/distributed.md)
  training::TrainResult result;
  if (!options.communicator) {
    result = training::train(options, std::cout, &g_stop);
  } else {
    // A rank that fails would leave the others waiting in a collective: it names itself and
    // ends them all.
    try {
      result = training::train(options, std::cout, &g_stop);
    } catch (const std::exception& e) {
      distributed::print_rank_error(options.communicator->rank(), options.communicator->size(), e.what());
      options.communicator->abort(1);
    }
  }
  if (result.signal == SIGINT) return 130;
  if (result.signal == SIGTERM) return 143;
  const bool rank_0 = !options.communicator || options.communicator->rank() == 0;
  if (result.test_accuracy && rank_0) {
    std::cout << "test accuracy " << std::fixed << std::setprecision(4) << *result.test_accuracy << "\n";
  }
  return 0;
}

}  // namespace onnxtrain::cli
