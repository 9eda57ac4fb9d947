// Models between Python and C++: a path (str or os.PathLike) or an onnx.ModelProto in,
// onnx.ModelProto out; and the bindings of make_trainable and export_inference.
#pragma once

#include <nanobind/nanobind.h>

#include <filesystem>
#include <optional>
#include <string>

#include "onnxtrain/make_trainable.h"

namespace onnx {
class ModelProto;
}

namespace onnxtrain::python {

namespace nb = nanobind;

// A model argument, read with the GIL held and loaded without it.
struct ModelArg {
  std::optional<std::filesystem::path> path;  // a file
  std::string bytes;                          // else a serialized ModelProto
  std::string source;                         // names the model in errors: the path, or "model"
  // The folder external data paths are relative to: the file's, or the current one.
  std::filesystem::path base_dir() const;
  // Loads the file or parses the bytes (io::load_model / io::parse_model); throws Error.
  onnx::ModelProto load() const;
};

// A path (str, os.PathLike) or an onnx.ModelProto (anything with SerializeToString); else
// nb::type_error.
ModelArg model_arg(nb::handle model);
// A path argument (str or os.PathLike) as a filesystem path; nb::type_error otherwise.
std::filesystem::path path_arg(nb::handle path, const char* what);
// An onnx.ModelProto with the model's contents (serialized here, parsed by onnx).
nb::object model_to_python(const onnx::ModelProto& model);

// MakeTrainableOptions from make_trainable's keyword arguments (the table in make_trainable.cpp):
// nb::type_error for an unknown keyword (naming the valid ones) or a value of the wrong type,
// Error for a value the CLI would reject too.
training::MakeTrainableOptions make_trainable_options(const nb::kwargs& kwargs);
// [(keyword, help)] in the table's order, for make_trainable's docstring.
nb::list make_trainable_keywords();

// onnxtrain._core.make_trainable, export_inference, _make_trainable_keywords.
void bind_models(nb::module_& m);

}  // namespace onnxtrain::python
