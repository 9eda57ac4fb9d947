// Writes a model with the Gathers that runtime/fusion.h gather_before_rowwise_ops moves moved
// (zero-ratio Dropouts dropped first, as sessions do before it), so that bench/gemm_peak.py reads
// the matrix products onnxtrain runs rather than all of the export's:
//   onnxtrain-bench-rows MODEL OUT
// Prints {"moved": N} (the Gathers moved). A model that does not load or save prints "error: ..."
// and exits 1. The graph keeps standard ops only (the fusions that write internal ops do not run).
#include <CLI/CLI.hpp>
#include <onnx/onnx_pb.h>

#include <filesystem>
#include <iostream>
#include <string>

#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "runtime/fusion.h"
#include "runtime/graph_runner.h"

int main(int argc, char** argv) {
  CLI::App app{"the model with the Gathers of gather_before_rowwise_ops moved"};
  std::string in, out;
  app.add_option("model", in, "the .onnx file")->required();
  app.add_option("out", out, "where to write the rewritten model")->required();
  CLI11_PARSE(app, argc, argv);
  try {
    onnx::ModelProto model = onnxtrain::io::load_model(in);
    const std::filesystem::path folder = std::filesystem::path(in).parent_path();
    onnxtrain::io::inline_external_data(model, folder.empty() ? "." : folder);  // OUT is one file
    const auto opsets = onnxtrain::runtime::opsets_of(model, in);
    onnx::GraphProto& graph = *model.mutable_graph();
    onnxtrain::runtime::drop_zero_dropout(graph, opsets);
    const int moved = onnxtrain::runtime::gather_before_rowwise_ops(graph, opsets);
    onnxtrain::io::save_model(std::move(model), out);
    std::cout << "{\"moved\": " << moved << "}\n";
  } catch (const onnxtrain::Error& e) {
    std::cout << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
