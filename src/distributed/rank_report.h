// The line each rank of a data-parallel run prints at its end (docs/distributed.md, "ZeRO-1"):
// the bytes of the variables it holds and its peak resident memory; and the memory line of a
// run in one process.
#pragma once

#include <string>

#include "onnxtrain/session.h"

namespace onnxtrain::distributed {

// "rank R of N: holds B bytes of variables (optimizer state sharded); current RSS X MiB, peak
// RSS Y MiB" — B sums the nbytes of `state` (a TrainingSession's variables: the parameters,
// the optimizer state this rank holds, counters); RSS and peak RSS are VmRSS and VmHWM of
// /proc/self/status (omitted where it cannot be read).
std::string rank_memory_line(int rank, int ranks, const runtime::NamedTensors& state, bool sharded);

// "memory: variables X MiB, step arena Y MiB, peak RSS Z MiB" — X sums the nbytes of `state`,
// Y is TrainingSession::step_arena_bytes, Z VmHWM (omitted where it cannot be read).
std::string memory_line(const runtime::NamedTensors& state, size_t step_arena_bytes);

// Writes "error: rank R of N: <message>" and a newline to stderr as one write, so that the lines
// of ranks failing together and mpirun's report of the abort cannot cut into it (with one
// stream insertion per piece they did: "error: rank " and the rest of the line came out on
// either side of Open MPI's MPI_ABORT banner).
void print_rank_error(int rank, int ranks, const std::string& message);

}  // namespace onnxtrain::distributed
