// train --sync-batch-norm (docs/distributed.md, "BatchNormalization"): BatchNormalization in
// training mode normalizes with the statistics of the whole global batch of a data-parallel
// step, as PyTorch's torch.nn.SyncBatchNorm does, instead of each rank's share's.
#pragma once

#include <string>
#include <unordered_map>

#include <onnx/onnx_pb.h>

namespace onnxtrain::distributed {

// Replaces every BatchNormalization node of `graph` (not of its subgraphs) that runs in
// training mode by ai.onnxtrain.SyncBatchNormalization (ops/sync_batch_norm.cpp) with the same
// inputs, epsilon and momentum, and outputs Y, running_mean, running_var, current_mean,
// current_var: the node's own outputs where it has them (opset 7-13: mean, var, saved_mean,
// saved_var; opset 14+: running_mean, running_var), fresh names for current_mean and
// current_var otherwise (its gradient rule reads them). Training mode is the BatchNormalization
// kernel's (ops/normalization.cpp): opset 1-6 is_test = 0; 7-13 any of outputs 1-4 asked for;
// 14+ training_mode = 1. Value infos for the new node's outputs, from ONNX shape inference of
// the graph before the change, let type inference continue past it (the Gradient expansion
// needs ranks downstream). `opsets`: the model's domains and versions; `label` names the graph
// in errors. Call it before the Gradient expansion. Returns the number of nodes replaced.
// Throws Error for spatial = 0 (which BatchNormalization rejects too).
int use_sync_batch_norm(onnx::GraphProto& graph, const std::unordered_map<std::string, int>& opsets,
                        const std::string& label);

}  // namespace onnxtrain::distributed
