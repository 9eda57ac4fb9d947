// runtime::MemoryPlan — one arena for the outputs a plan's kernels allocate, laid out by
// liveness.
//
// The first run of a plan records every allocate_output: its size, the step that allocated it
// and the step after which its last view died (tensors report their death through
// StorageOwner::release). Blocks that outlive the run (graph outputs and their views) are
// marked as escaping. After that run the plan places the other blocks in one arena so that
// blocks alive at the same step never overlap (largest first, lowest free offset), and
// allocates the arena once. Later runs hand out the k-th allocation from the arena when its
// size matches the recording and no block sharing its bytes is still alive; anything else
// (escaping blocks, shapes that changed, a tensor someone kept) takes the tensor heap, so a
// plan never hands out memory that is in use. Peak memory is the arena's size plus escaping
// blocks, instead of the sum of everything allocated between frees. Large escaping blocks of
// the recording run stay mapped once they die, and later runs' escaping blocks of the same size
// take them before the heap (a training step's new parameters and optimizer state, which the
// step after next replaces): the plan keeps at most one run's escaping blocks that way, until
// it is destroyed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ops/kernel.h"

namespace onnxtrain::runtime {

class MemoryPlan final : public ops::OutputAllocator {
 public:
  MemoryPlan();
  ~MemoryPlan() override;
  MemoryPlan(const MemoryPlan&) = delete;
  MemoryPlan& operator=(const MemoryPlan&) = delete;

  // Brackets one run of the plan; `step` is set before each kernel runs. A run that ends in
  // an exception calls begin_run again without end_run; a recording run then starts over.
  void begin_run();
  void set_step(int step);
  void end_run();

  Tensor allocate(DataType dtype, const Shape& shape) override;

  // The arena's size in bytes (0 until the first run has ended).
  size_t arena_bytes() const;

 private:
  struct Shared;  // what arena tensors keep alive: the arena and the block states
  std::shared_ptr<Shared> shared_;
  size_t next_ = 0;        // ordinal of the next allocation in this run
  bool diverged_ = false;  // this run's allocations stopped matching the recording
};

}  // namespace onnxtrain::runtime
