// Loading and saving ModelProto files.
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <onnx/onnx_pb.h>

#include <cerrno>
#include <cstring>

#include "onnxtrain/error.h"
#include "onnxtrain/io.h"

namespace onnxtrain::io {

namespace fs = std::filesystem;

namespace {

// The ONNX release whose C++ library onnxtrain is built with (requirements.txt pins its
// Python twin).
#ifndef ONNXTRAIN_ONNX_VERSION
#define ONNXTRAIN_ONNX_VERSION "?"
#endif
constexpr const char* kOnnxRelease = ONNXTRAIN_ONNX_VERSION;

// A node's domain missing from opset_import is reported when the graph is planned, with the
// node named; here only what every model needs.
void check_structure(const onnx::ModelProto& model, const std::string& source) {
  if (!model.has_ir_version() || model.ir_version() <= 0) {
    throw Error(source + ": ir_version is not set (is this an ONNX model?)");
  }
  if (model.ir_version() > onnx::IR_VERSION) {
    throw Error(source + ": IR version " + std::to_string(model.ir_version()) + " is newer than the newest onnxtrain reads (" +
                std::to_string(static_cast<int>(onnx::IR_VERSION)) + ", ONNX " + kOnnxRelease + ")");
  }
  if (!model.has_graph()) throw Error(source + ": the model has no graph");
}

}  // namespace

onnx::ModelProto parse_model(const std::string& bytes, const std::string& source) {
  if (bytes.empty()) throw Error(source + ": the file is empty");
  if (bytes.size() > kMaxProtoBytes) {
    throw Error(source + ": " + std::to_string(bytes.size()) +
                " bytes is over protobuf's 2 GiB limit; store large tensors as external data");
  }
  onnx::ModelProto model;
  if (!model.ParseFromString(bytes)) {
    throw Error(source + ": not a valid ONNX model (the protobuf data is truncated or corrupt)");
  }
  check_structure(model, source);
  return model;
}

onnx::ModelProto load_model(const fs::path& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (!ec && size > kMaxProtoBytes) {
    throw Error(path.string() + ": " + std::to_string(size) +
                " bytes is over protobuf's 2 GiB limit; store large tensors as external data");
  }
  // Parsed from the file as it is read, without holding its bytes in memory as well.
  onnx::ModelProto model;
  read_file(path, [&](int fd) {
    google::protobuf::io::FileInputStream in(fd);
    if (!model.ParseFromZeroCopyStream(&in)) {
      if (in.GetErrno() != 0) throw Error(path.string() + ": read failed: " + std::strerror(in.GetErrno()));
      if (!ec && size == 0) throw Error(path.string() + ": the file is empty");
      throw Error(path.string() + ": not a valid ONNX model (the protobuf data is truncated or corrupt)");
    }
  });
  if (!ec && size == 0) throw Error(path.string() + ": the file is empty");
  check_structure(model, path.string());
  return model;
}

namespace {

// Every TensorProto in the graph (initializers and tensor attributes), recursively.
void collect_tensors(onnx::GraphProto& graph, std::vector<onnx::TensorProto*>& out) {
  for (auto& t : *graph.mutable_initializer()) out.push_back(&t);
  for (auto& node : *graph.mutable_node()) {
    for (auto& attr : *node.mutable_attribute()) {
      if (attr.has_t()) out.push_back(attr.mutable_t());
      for (auto& t : *attr.mutable_tensors()) out.push_back(&t);
      if (attr.has_g()) collect_tensors(*attr.mutable_g(), out);
      for (auto& g : *attr.mutable_graphs()) collect_tensors(g, out);
    }
  }
}

std::vector<onnx::TensorProto*> all_tensors(onnx::ModelProto& model) {
  std::vector<onnx::TensorProto*> tensors;
  collect_tensors(*model.mutable_graph(), tensors);
  for (auto& info : *model.mutable_training_info()) {
    if (info.has_initialization()) collect_tensors(*info.mutable_initialization(), tensors);
    collect_tensors(*info.mutable_algorithm(), tensors);
  }
  return tensors;
}

void inline_tensors(const std::vector<onnx::TensorProto*>& tensors, const fs::path& base_dir) {
  for (onnx::TensorProto* t : tensors) {
    if (t->data_location() != onnx::TensorProto::EXTERNAL) continue;
    const Tensor value = tensor_from_proto(*t, base_dir, "initializer");
    const std::string name = t->name();
    tensor_to_proto(value, name, *t);
  }
}

}  // namespace

void inline_external_data(onnx::ModelProto& model, const fs::path& base_dir) {
  inline_tensors(all_tensors(model), base_dir);
}

void save_model(onnx::ModelProto model, const fs::path& path, const SaveOptions& options) {
  const std::vector<onnx::TensorProto*> tensors = all_tensors(model);
  // Bring external data in, so the saved model does not depend on the source folder.
  inline_tensors(tensors, options.source_dir);
  std::string external;
  const std::string external_name = path.filename().string() + ".data";
  if (model.ByteSizeLong() > options.external_threshold) {
    for (onnx::TensorProto* t : tensors) {
      if (!t->has_raw_data() || t->raw_data().size() < options.external_min_bytes) continue;
      // Keep each tensor 64-byte aligned in the data file, as onnx's own writer does with 4 KiB.
      external.append((64 - external.size() % 64) % 64, '\0');
      const size_t offset = external.size();
      const size_t length = t->raw_data().size();
      external += t->raw_data();
      t->clear_raw_data();
      t->set_data_location(onnx::TensorProto::EXTERNAL);
      t->clear_external_data();
      auto add = [&](const char* key, const std::string& value) {
        auto* entry = t->add_external_data();
        entry->set_key(key);
        entry->set_value(value);
      };
      add("location", external_name);
      add("offset", std::to_string(offset));
      add("length", std::to_string(length));
    }
  }
  if (model.ByteSizeLong() > kMaxProtoBytes) {
    throw Error(path.string() + ": the model is over protobuf's 2 GiB limit even with its "
                "large tensors in external data");
  }
  // The data file first: a model never refers to external data that is not fully written.
  if (!external.empty()) {
    const fs::path data_path = path.has_parent_path() ? path.parent_path() / external_name
                                                      : fs::path(external_name);
    write_file_atomic(data_path, external);
  }
  // Serialized straight into the file, without a second copy of the model in memory.
  write_file_atomic(path, [&](int fd) {
    google::protobuf::io::FileOutputStream out(fd);
    const bool ok = model.SerializeToZeroCopyStream(&out) && out.Flush();
    if (!ok) errno = out.GetErrno();
    return ok ? std::string() : "writing the model (" + std::to_string(model.ByteSizeLong()) + " bytes)";
  });
}

}  // namespace onnxtrain::io
