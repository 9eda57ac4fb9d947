// Pieces of validate_training_info that TrainingSession runs while it builds its graphs.
#pragma once

#include <onnx/onnx_pb.h>

#include <string>

namespace onnxtrain::training {

// The binding rules of validate_training_info (keys, values, initialization inputs).
void check_bindings(const onnx::ModelProto& model, const std::string& source);
// The ONNX checker on `graph` inside a copy of `model` without training_info; Error naming
// `what` when it fails.
void run_checker(const onnx::ModelProto& model, const onnx::GraphProto& graph, const std::string& what);

}  // namespace onnxtrain::training
