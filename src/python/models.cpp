#include "python/models.h"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "onnxtrain/training.h"

namespace onnxtrain::python {

namespace fs = std::filesystem;

std::filesystem::path ModelArg::base_dir() const {
  if (!path) return ".";
  const fs::path parent = path->parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

onnx::ModelProto ModelArg::load() const { return path ? io::load_model(*path) : io::parse_model(bytes, source); }

std::filesystem::path path_arg(nb::handle path, const char* what) {
  if (!nb::isinstance<nb::str>(path) && !nb::hasattr(path, "__fspath__")) {
    throw nb::type_error((std::string(what) + " must be a path (str or os.PathLike), got " +
                          nb::cast<std::string>(nb::type_name(path.type())))
                             .c_str());
  }
  return fs::path(nb::cast<std::string>(nb::module_::import_("os").attr("fsdecode")(path)));
}

namespace {
std::string bytes_of(nb::handle bytes) {
  if (!nb::isinstance<nb::bytes>(bytes)) {
    throw nb::type_error("SerializeToString() of the model did not return bytes");
  }
  const auto b = nb::borrow<nb::bytes>(bytes);
  return std::string(b.c_str(), b.size());
}
}  // namespace

ModelArg model_arg(nb::handle model) {
  ModelArg arg;
  if (nb::isinstance<nb::bytes>(model)) {
    arg.bytes = bytes_of(model);
    arg.source = "model";
  } else if (nb::hasattr(model, "SerializeToString")) {
    arg.bytes = bytes_of(model.attr("SerializeToString")());
    arg.source = "model";
  } else if (nb::isinstance<nb::str>(model) || nb::hasattr(model, "__fspath__")) {
    arg.path = path_arg(model, "model");
    arg.source = arg.path->string();
  } else {
    throw nb::type_error(("model must be a path (str or os.PathLike), an onnx.ModelProto or its serialized bytes, got " +
                          nb::cast<std::string>(nb::type_name(model.type())))
                             .c_str());
  }
  return arg;
}

nb::object model_to_python(const onnx::ModelProto& model) {
  std::string bytes;
  {
    nb::gil_scoped_release release;
    if (!model.SerializeToString(&bytes)) throw Error("the model could not be serialized (over 2 GiB?)");
  }
  nb::bytes data(bytes.data(), bytes.size());
  return nb::module_::import_("onnx").attr("ModelProto").attr("FromString")(data);
}

namespace {

// make-trainable as the CLI runs it (src/cli/commands.cpp), less the writing: external data read
// in, the training program added, the result checked by the ONNX checker and by onnxtrain's own
// training_info validation.
onnx::ModelProto make_trainable(const ModelArg& arg, const training::MakeTrainableOptions& options) {
  onnx::ModelProto model = arg.load();
  io::inline_external_data(model, arg.base_dir());
  onnx::ModelProto trainable = training::make_trainable(model, options, arg.source);
  try {
    onnx::checker::check_model(trainable);
  } catch (const std::exception& e) {
    throw Error(arg.source + ": the trainable model make_trainable built fails the ONNX checker: " + e.what());
  }
  training::validate_training_info(trainable, arg.source + " made trainable", arg.base_dir());
  return trainable;
}

const char* kMakeTrainableDoc = R"(Adds the standard training program (ModelProto.training_info) to an inference model.

The same as the command `onnxtrain make-trainable MODEL -o OUT [options]`, without the file:
the loss reads a model output and a new label input, a Gradient node differentiates it
with respect to the trainable initializers, an optimizer updates them with a learning-rate
schedule, and update_binding writes the results back. docs/make-trainable.md maps every
loss, optimizer and schedule to its ONNX nodes and to its PyTorch equivalent.

Parameters
----------
model : str | os.PathLike | onnx.ModelProto | bytes
    The inference model: a file (external data is read from its folder) or a model in memory.
**options
    Keyword arguments named after the command's flags with '-' replaced by '_', with the values
    the command accepts (None keeps an option's default):

{options}

Returns
-------
onnx.ModelProto
    The model with training_info, checked by the ONNX checker and by onnxtrain's validation of
    training_info. TrainingSession(result) trains it; result.SerializeToString() or onnx.save
    writes it.

Raises
------
TypeError
    An unknown keyword (the message lists the valid ones) or a value of the wrong type.
onnxtrain.Error
    A value the command rejects too (an unknown loss name, lr <= 0), a model that cannot be made
    trainable (it has training_info already and replace is not set, no such output, a freeze
    regex that matches nothing, nothing left to train, ...), with the command's message.
)";

}  // namespace

void bind_models(nb::module_& m) {
  std::string options;
  for (nb::handle row : make_trainable_keywords()) {
    options += "    " + nb::cast<std::string>(row[0]) + "\n        " + nb::cast<std::string>(row[1]) + "\n";
  }
  std::string doc = kMakeTrainableDoc;
  doc.replace(doc.find("{options}"), 9, options);
  m.def(
      "make_trainable",
      [](nb::handle model, const nb::kwargs& kwargs) {
        const training::MakeTrainableOptions options = make_trainable_options(kwargs);
        const ModelArg arg = model_arg(model);
        onnx::ModelProto trainable;
        {
          nb::gil_scoped_release release;
          trainable = make_trainable(arg, options);
        }
        return model_to_python(trainable);
      },
      nb::arg("model"), nb::arg("options"), doc.c_str());

  m.def(
      "export_inference",
      [](nb::handle model) {
        const ModelArg arg = model_arg(model);
        onnx::ModelProto inference;
        {
          nb::gil_scoped_release release;
          onnx::ModelProto loaded = arg.load();
          io::inline_external_data(loaded, arg.base_dir());
          inference = training::export_inference(loaded);
        }
        return model_to_python(inference);
      },
      nb::arg("model"),
      R"(The inference model of a trainable one: training_info dropped, weights kept.

The same as the command `onnxtrain export MODEL -o OUT`, without the file. The
ai.onnx.preview.training opset import goes too when nothing else uses it.

Parameters
----------
model : str | os.PathLike | onnx.ModelProto | bytes
    A model with or without training_info (a file's external data is read in).

Returns
-------
onnx.ModelProto

Raises
------
onnxtrain.Error
    A model that cannot be read or parsed.
)");

  m.def("_make_trainable_keywords", &make_trainable_keywords,
        "[(keyword, help)] of make_trainable, in the order of its table.");
}

}  // namespace onnxtrain::python
