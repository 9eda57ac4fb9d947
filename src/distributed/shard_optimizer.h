// ZeRO stage 1 for data-parallel training (docs/distributed.md, "ZeRO-1"): each rank keeps
// and updates the optimizer state of its own parameters only, as PyTorch's
// torch.distributed.optim.ZeroRedundancyOptimizer does.
//
// The update part of a cut algorithm (split_program.h) is rewritten for one rank: the
// parameters it updates are partitioned among the ranks by whole tensor, and the rank keeps
// only the nodes needed for the graph outputs every rank needs (the loss, the learning rate,
// the step counter's new value) and for the update_binding values of the parameters it owns
// and of their optimizer state. The other ranks' optimizer state is then neither read nor
// written on this rank; the session drops it, and after each update every parameter is
// broadcast from its owner.
#pragma once

#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

namespace onnxtrain::distributed {

// The ranks among which the parameters of `bytes` (name -> size in bytes) are divided: the
// largest first, each to the rank holding the fewest bytes so far (the lowest rank on a tie),
// ties between equal sizes broken by name, so every rank computes the same partition.
// PyTorch's ZeroRedundancyOptimizer partitions greedily by size as well.
std::map<std::string, int> partition_parameters(const std::map<std::string, size_t>& bytes, int ranks);

struct OptimizerShards {
  int rank = 0;  // the rank the update part was rewritten for
  // The rank owning each sharded variable: each parameter the update part writes, and each
  // variable of its optimizer state (a variable whose update_binding value depends on that
  // parameter, or on its gradient, and on no other parameter's). Equal on every rank.
  std::map<std::string, int> owner;
  // The sharded parameters, by name: every rank holds them; the owner broadcasts each one
  // after the update.
  std::vector<std::string> parameters;
  // The optimizer-state variables other ranks own: this rank neither reads nor writes them.
  std::set<std::string> dropped;
};

// Rewrites `update` (the update part of a cut algorithm, nodes in topological order) for rank
// `rank` of `ranks`. `bindings` maps each update_binding key to its value; `gradients` is
// gradient_parameters() of the algorithm (split_program.h); `bytes` gives the size of every variable. The
// multi-tensor optimizer nodes of ai.onnx.preview.training (Adam, Momentum, Adagrad) keep the
// tensors of this rank's parameters (a node left with none is removed); every node no output
// this rank needs depends on is removed; graph inputs no node reads and the outputs of other
// ranks' bindings are removed. Throws Error naming the node when a node this rank still runs
// reads optimizer state another rank owns (an update that mixes several parameters' state
// cannot be sharded by whole tensor).
OptimizerShards shard_update(onnx::GraphProto& update, const std::map<std::string, std::string>& bindings,
                             const std::map<std::string, std::string>& gradients,
                             const std::map<std::string, size_t>& bytes, int rank, int ranks, const std::string& label);

// Removes the graph outputs named in `outputs` from `graph` (an initialization graph, whose
// values for other ranks' optimizer state this rank does not need), with every node and
// initializer that only they needed.
void drop_outputs(onnx::GraphProto& graph, const std::set<std::string>& outputs);

}  // namespace onnxtrain::distributed
