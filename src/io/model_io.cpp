// Loading and saving ModelProto files.
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
#include <vector>

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

// Protobuf refuses messages nested more than 100 deep (its default recursion limit), which also
// bounds the stack every later recursive walk of the model needs: a subgraph costs three levels
// (GraphProto, NodeProto, AttributeProto), so about 30 levels of subgraphs load.
std::string not_a_model(const std::string& source) {
  return source + ": not a valid ONNX model (the protobuf data is truncated or corrupt, or nests "
                  "messages more than 100 deep: about 30 levels of subgraphs)";
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
    throw Error(not_a_model(source));
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
      throw Error(not_a_model(path.string()));
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

namespace {

using google::protobuf::io::CodedOutputStream;

constexpr uint32_t tag(int field) { return static_cast<uint32_t>(field) << 3 | 2; }  // length-delimited
size_t field_size(int field, size_t content) {
  return CodedOutputStream::VarintSize32(tag(field)) + CodedOutputStream::VarintSize64(content) + content;
}

// A graph whose initializers named in `values` are written from those tensors: the graph's
// other fields first (protobuf readers accept fields in any order), then every initializer, in
// order, as field 5 (GraphProto.initializer), a value's data as TensorProto.raw_data (field 9).
// The graph is moved in, not copied.
class StreamedGraph {
 public:
  StreamedGraph(onnx::GraphProto graph, const std::map<std::string, Tensor>& values) {
    initializers_.Swap(graph.mutable_initializer());
    rest_ = std::move(graph);
    size_ = rest_.ByteSizeLong();
    for (const auto& init : initializers_) {
      Entry e{&init, nullptr, {}, 0};
      if (auto it = values.find(init.name()); it != values.end()) {
        e.value = &it->second;
        e.stub.set_name(init.name());
        e.stub.set_data_type(static_cast<int32_t>(e.value->dtype()));
        for (int64_t d : e.value->shape()) e.stub.add_dims(d);
        const auto n = static_cast<size_t>(e.value->nbytes());
        e.size = e.stub.ByteSizeLong() + field_size(9, n);
      } else {
        e.size = init.ByteSizeLong();
      }
      size_ += field_size(5, e.size);
      entries_.push_back(std::move(e));
    }
  }
  size_t size() const { return size_; }
  // Messages are written with SerializePartialToCodedStream, which sizes them again: a moved
  // message need not keep its cached size.
  void write(CodedOutputStream& out) const {
    rest_.SerializePartialToCodedStream(&out);
    for (const Entry& e : entries_) {
      out.WriteVarint32(tag(5));
      out.WriteVarint64(e.size);
      if (!e.value) {
        e.init->SerializePartialToCodedStream(&out);
        continue;
      }
      e.stub.SerializePartialToCodedStream(&out);
      out.WriteVarint32(tag(9));
      out.WriteVarint64(static_cast<uint64_t>(e.value->nbytes()));
      out.WriteRaw(e.value->raw_data(), static_cast<int>(e.value->nbytes()));
    }
  }

 private:
  struct Entry {
    const onnx::TensorProto* init;
    const Tensor* value;  // null: the initializer as it is
    onnx::TensorProto stub;
    size_t size;
  };
  google::protobuf::RepeatedPtrField<onnx::TensorProto> initializers_;
  onnx::GraphProto rest_;
  std::vector<Entry> entries_;
  size_t size_ = 0;
};

}  // namespace

void set_initializers(onnx::ModelProto& model, const std::map<std::string, Tensor>& values) {
  auto fill = [&](onnx::GraphProto& g) {
    for (auto& t : *g.mutable_initializer()) {
      if (auto it = values.find(t.name()); it != values.end()) tensor_to_proto(it->second, t.name(), t);
    }
  };
  fill(*model.mutable_graph());
  for (auto& info : *model.mutable_training_info()) fill(*info.mutable_algorithm());
}

void save_model_with_values(onnx::ModelProto model, const std::map<std::string, Tensor>& values,
                            const fs::path& path, const SaveOptions& options) {
  // An upper bound of the file's size: the model as it is plus each value and its fields.
  uint64_t bound = model.ByteSizeLong();
  const std::vector<onnx::TensorProto*> tensors = all_tensors(model);
  bool streamable = std::none_of(tensors.begin(), tensors.end(), [](const onnx::TensorProto* t) {
    return t->data_location() == onnx::TensorProto::EXTERNAL;
  });
  for (const auto& [name, value] : values) {
    streamable = streamable && value.dtype() != DataType::String && dtype_bits(value.dtype()) >= 8 &&
                 value.nbytes() < (int64_t{1} << 31);
    bound += static_cast<uint64_t>(value.nbytes()) + 32;
  }
  if (!streamable || bound > options.external_threshold || bound > kMaxProtoBytes) {
    set_initializers(model, values);  // and save_model's path (external data, packed tensors)
    save_model(std::move(model), path, options);
    return;
  }
  // The parts move out of the model (no copies): what remains is its other fields.
  const StreamedGraph graph(std::move(*model.mutable_graph()), values);
  model.clear_graph();
  google::protobuf::RepeatedPtrField<onnx::TrainingInfoProto> info_protos;
  info_protos.Swap(model.mutable_training_info());
  std::vector<std::pair<onnx::TrainingInfoProto, StreamedGraph>> infos;
  infos.reserve(static_cast<size_t>(info_protos.size()));
  for (auto& info : info_protos) {
    onnx::GraphProto algorithm = std::move(*info.mutable_algorithm());
    info.clear_algorithm();
    infos.emplace_back(std::move(info), StreamedGraph(std::move(algorithm), values));
  }
  size_t total = model.ByteSizeLong() + field_size(7, graph.size());
  for (const auto& [info_rest, algorithm] : infos) total += field_size(20, info_rest.ByteSizeLong() + field_size(2, algorithm.size()));
  write_file_atomic(path, [&](int fd) {
    google::protobuf::io::FileOutputStream file(fd);
    {
      CodedOutputStream out(&file);
      model.SerializePartialToCodedStream(&out);
      out.WriteVarint32(tag(7));
      out.WriteVarint64(graph.size());
      graph.write(out);
      for (const auto& [info_rest, algorithm] : infos) {
        out.WriteVarint32(tag(20));
        out.WriteVarint64(info_rest.ByteSizeLong() + field_size(2, algorithm.size()));
        info_rest.SerializePartialToCodedStream(&out);
        out.WriteVarint32(tag(2));
        out.WriteVarint64(algorithm.size());
        algorithm.write(out);
      }
      if (out.HadError()) {
        errno = file.GetErrno();
        return "writing the model (" + std::to_string(total) + " bytes)";
      }
    }
    if (!file.Flush()) {
      errno = file.GetErrno();
      return "writing the model (" + std::to_string(total) + " bytes)";
    }
    return std::string();
  });
}

}  // namespace onnxtrain::io
