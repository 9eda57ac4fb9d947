// Functions before planning: every call of a model-local function (ModelProto.functions,
// FunctionProto, IR version 8 and later, with IR 10's `overload`) is replaced by the
// function's body, and so is every node of an op whose ONNX schema defines it as a function
// (Gelu, Mish, GroupNormalization, ...; static or context-dependent bodies) when onnxtrain has
// no kernel for that op version. Planning and autodiff then see only ops with kernels, and a
// gradient flows through a function op by way of its body.
//
// The inlining itself is ONNX's (onnx/inliner/inliner.h: InlineLocalFunctions,
// InlineSelectedFunctions), which renames the body's values uniquely and substitutes the
// call's attributes for the body's attribute references.
#pragma once

#include <string>

namespace onnx {
class GraphProto;
class ModelProto;
}  // namespace onnx

namespace onnxtrain::runtime {

// True when `graph` (or a subgraph of it) calls a model-local function of `model` or an op
// that inline_functions would expand.
bool has_functions_to_inline(const onnx::GraphProto& graph, const onnx::ModelProto& model);

// `graph` with the calls described above inlined, using `model`'s functions, opset_import and
// ir_version. Throws Error naming `source` when a call cannot be inlined (a function that
// calls itself, an opset the function imports that conflicts with the model's).
onnx::GraphProto inline_functions(const onnx::GraphProto& graph, const onnx::ModelProto& model,
                                  const std::string& source);

}  // namespace onnxtrain::runtime
