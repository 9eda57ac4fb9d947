// The combined graph of a TrainingInfoProto (onnx.proto, TrainingInfoProto.algorithm): the
// inference graph's input, initializer, output, node, value_info and sparse_initializer lists
// followed by the algorithm's, in that order.
#pragma once

#include <onnx/onnx_pb.h>

#include <string>

namespace onnxtrain::training {

onnx::GraphProto combine_graphs(const onnx::GraphProto& inference, const onnx::GraphProto& algorithm);

// "training_info[i]"
std::string entry_name(int i);
// How errors name the graphs of entry i of the model `source`.
std::string combined_label(const std::string& source, int i);        // "..., training_info[i] combined graph"
std::string initialization_label(const std::string& source, int i);  // "..., training_info[i].initialization"

}  // namespace onnxtrain::training
