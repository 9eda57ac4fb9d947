// Counters of tensor memory, for tests and the profiler.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "onnxtrain/dtype.h"
#include "onnxtrain/shape.h"

namespace onnxtrain {

// The bytes a tensor of `shape` and `dtype` needs; throws Error for a negative dim or when its
// element or byte count does not fit in int64 (a hostile shape such as [2^40, 2^40, 2^40]).
// Every Tensor constructor checks its shape with it.
size_t checked_nbytes(DataType dtype, const Shape& shape);

struct MemoryStats {
  // Blocks of tensor memory requested from the system (aligned_alloc): what the block cache
  // and the runtime's arenas could not serve.
  std::atomic<uint64_t> system_allocations{0};
  // Storage objects created (cached, arena or system memory alike).
  std::atomic<uint64_t> storage_allocations{0};
};

// The process-wide counters.
const MemoryStats& memory_stats();

// Blocks of tensor memory, 64-byte aligned; `bytes` is a nonzero multiple of 64. take_block
// serves a freed block of the same size when the process-wide cache holds one (up to 256 MiB
// is kept), else asks the system (throws std::bad_alloc when it has none).
void* take_block(size_t bytes);
void give_block(void* block, size_t bytes) noexcept;
// Blocks mapped from the system (mmap; aligned_alloc where there is none), page-aligned, which
// give_mapped_block unmaps at once: for large blocks that live shortly once. malloc would keep
// them resident after they are freed (glibc raises its mmap threshold to the size of each large
// block freed, and serves later ones from its heap): the memory plan's recording run of the BERT
// encoder's training step peaked 150 MiB above the planned steps that way. Counted in
// system_allocations; throws std::bad_alloc when the system has no memory.
void* take_mapped_block(size_t bytes);
void give_mapped_block(void* block, size_t bytes) noexcept;
// Frees every cached block (before work that needs other sizes, such as an evaluation pass).
void trim_block_cache() noexcept;

}  // namespace onnxtrain
