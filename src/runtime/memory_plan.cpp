#include "runtime/memory_plan.h"

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <limits>
#include <new>
#include <string_view>

#include "core/memory.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace onnxtrain::runtime {

namespace {
constexpr int kAlive = -1;
constexpr int kEscaped = std::numeric_limits<int>::max();  // died after the recording run

size_t rounded(size_t nbytes) {
  const size_t a = Tensor::kAlignment;
  return std::max<size_t>(a, (nbytes + a - 1) / a * a);
}
}  // namespace

struct MemoryPlan::Shared {
  struct Block {
    size_t bytes = 0;   // rounded to the alignment
    int first = 0;      // step that allocated it
    int last = kAlive;  // step after which its last view died
    size_t offset = 0;  // in the arena
    bool in_arena = false;
    std::vector<size_t> overlapping;  // arena blocks sharing bytes with this one
  };
  // Gives block `index` back: an arena block becomes free, a recorded heap block records its
  // death and is freed.
  struct Owner final : StorageOwner {
    Shared* shared = nullptr;
    size_t index = 0;
    void release(void* data, size_t) noexcept override { shared->released(index, data); }
  };

  std::deque<Block> blocks;   // stable addresses; the recording is [begin, size())
  std::deque<Owner> owners;   // one per block
  size_t begin = 0;
  std::unique_ptr<std::atomic<bool>[]> alive;  // per planned block: an arena tensor views it
  char* arena = nullptr;
  size_t arena_bytes = 0;
  bool recording = true;
  bool recording_open = false;  // inside the recording run
  int step = 0;

  ~Shared() {
    if (arena) give_block(arena, arena_bytes);
  }

  bool in_arena(const void* data) const {
    return arena && data >= arena && static_cast<const char*>(data) < arena + arena_bytes;
  }

  void released(size_t b, void* data) noexcept {
    if (in_arena(data)) {
      alive[b - begin].store(false, std::memory_order_release);
      return;
    }
    Block& block = blocks[b];
    if (block.last == kAlive) block.last = recording_open ? step : kEscaped;
    if (recording_open) {
      std::free(data);  // back to the system: the arena serves this block from now on
    } else {
      give_block(data, block.bytes);  // escaped (a graph output): later outputs reuse it
    }
  }

  std::shared_ptr<StorageOwner> owner(const std::shared_ptr<Shared>& self, size_t b) {
    return std::shared_ptr<StorageOwner>(self, &owners[b]);  // keeps the arena alive
  }

  // Places the recorded blocks that died within the run: largest first, each at the lowest
  // offset free of the blocks whose lifetimes intersect its own.
  void place() {
    std::vector<size_t> order;
    for (size_t b = begin; b < blocks.size(); ++b) {
      if (blocks[b].last != kEscaped && blocks[b].last != kAlive) order.push_back(b);
    }
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return blocks[a].bytes > blocks[b].bytes; });
    std::vector<size_t> placed;
    std::vector<std::pair<size_t, size_t>> taken;
    for (size_t b : order) {
      Block& block = blocks[b];
      taken.clear();
      for (size_t p : placed) {
        const Block& other = blocks[p];
        if (other.first <= block.last && block.first <= other.last) taken.emplace_back(other.offset, other.offset + other.bytes);
      }
      std::sort(taken.begin(), taken.end());
      size_t offset = 0;
      for (const auto& [lo, hi] : taken) {
        if (offset + block.bytes <= lo) break;
        offset = std::max(offset, hi);
      }
      block.offset = offset;
      block.in_arena = true;
      arena_bytes = std::max(arena_bytes, offset + block.bytes);
      placed.push_back(b);
    }
    for (size_t a : placed) {
      for (size_t b : placed) {
        const Block &x = blocks[a], &y = blocks[b];
        if (a != b && x.offset < y.offset + y.bytes && y.offset < x.offset + x.bytes) blocks[a].overlapping.push_back(b);
      }
    }
    alive = std::make_unique<std::atomic<bool>[]>(blocks.size() - begin);
    if (arena_bytes > 0) {
      try {
        arena = static_cast<char*>(take_block(arena_bytes));
      } catch (const std::bad_alloc&) {
        arena = nullptr;
      }
    }
    if (!arena) {  // no arena (none needed, or no memory): every block takes the heap
      arena_bytes = 0;
      for (size_t b : placed) blocks[b].in_arena = false;
    }
  }
};

MemoryPlan::MemoryPlan() : shared_(std::make_shared<Shared>()) {}
MemoryPlan::~MemoryPlan() { shared_->recording_open = false; }

size_t MemoryPlan::arena_bytes() const { return shared_->arena_bytes; }

void MemoryPlan::set_step(int step) { shared_->step = step; }

void MemoryPlan::begin_run() {
  Shared& s = *shared_;
  if (s.recording) {  // (again, after a run that threw): record from scratch
    for (size_t b = s.begin; b < s.blocks.size(); ++b) {
      if (s.blocks[b].last == kAlive) s.blocks[b].last = kEscaped;
    }
    s.begin = s.blocks.size();
    s.recording_open = true;
  }
  next_ = 0;
  diverged_ = false;
  s.step = 0;
}

void MemoryPlan::end_run() {
  Shared& s = *shared_;
  if (!s.recording) return;
  s.recording = false;
  s.recording_open = false;
  size_t freed = 0;
  for (size_t b = s.begin; b < s.blocks.size(); ++b) {
    if (s.blocks[b].last == kAlive) s.blocks[b].last = kEscaped;  // outlives the run
    if (s.blocks[b].last != kEscaped) freed += s.blocks[b].bytes;
  }
#if defined(__GLIBC__)
  // The recording run's blocks went back to malloc, which keeps most of them resident in its
  // heap (glibc raises its mmap threshold as large blocks are freed, up to 32 MiB), and the arena
  // is new memory: without handing those pages back first, the process holds both (BERT
  // encoder training: peak RSS 2215 MiB against an arena of 912 MiB). Only worth it for a plan
  // that recorded much.
  if (freed >= (size_t{64} << 20)) malloc_trim(0);
#endif
  s.place();
}

Tensor MemoryPlan::allocate(DataType dtype, const Shape& shape) {
#if defined(__SANITIZE_ADDRESS__)
  return Tensor(dtype, shape);  // AddressSanitizer builds: one heap block per tensor, checked
#endif
  static const bool disabled = [] {
    const char* env = std::getenv("ONNXTRAIN_ARENA");
    return env && std::string_view(env) == "0";
  }();
  if (disabled) return Tensor(dtype, shape);  // ONNXTRAIN_ARENA=0: every output from the heap
  if (!is_supported(dtype) || dtype == DataType::String ||
      std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 0; })) {
    return Tensor(dtype, shape);  // strings construct their elements; bad shapes throw the tensor's error
  }
  const size_t bytes = rounded(static_cast<size_t>(shape.numel()) * dtype_size(dtype));
  Shared& s = *shared_;
  const size_t k = s.begin + next_++;
  if (s.recording) {
    void* data = take_block(bytes);  // counted like any tensor block; freed to the system
    s.blocks.push_back({bytes, s.step, kAlive, 0, false, {}});
    s.owners.push_back({});
    s.owners.back().shared = &s;
    s.owners.back().index = k;
    return Tensor(dtype, shape, std::make_shared<Storage>(data, bytes, s.owner(shared_, k)));
  }
  if (diverged_ || k >= s.blocks.size() || s.blocks[k].bytes != bytes || s.blocks[k].first != s.step) {
    diverged_ = true;  // this run allocates differently from the recording: heap from here on
    return Tensor(dtype, shape);
  }
  const Shared::Block& block = s.blocks[k];
  auto busy = [&](size_t b) { return s.alive[b - s.begin].load(std::memory_order_acquire); };
  if (!block.in_arena || busy(k) || std::any_of(block.overlapping.begin(), block.overlapping.end(), busy)) {
    return Tensor(dtype, shape);
  }
  s.alive[k - s.begin].store(true, std::memory_order_relaxed);
  return Tensor(dtype, shape, std::make_shared<Storage>(s.arena + block.offset, bytes, s.owner(shared_, k)));
}

}  // namespace onnxtrain::runtime
