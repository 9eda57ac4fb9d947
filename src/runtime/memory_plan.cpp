#include "runtime/memory_plan.h"

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
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
// The recording run maps blocks of at least this size (core/memory.h take_mapped_block).
constexpr size_t kMappedBytes = size_t{256} << 10;

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
    bool mapped = false;  // recorded in memory of take_mapped_block
  };
  // Gives block `index` back: an arena block becomes free, a recorded heap block records its
  // death and is freed.
  struct Owner final : StorageOwner {
    Shared* shared = nullptr;
    size_t index = 0;
    void release(void* data, size_t) noexcept override { shared->released(index, data); }
  };
  // Takes back a spare block handed out again (see `spare`).
  struct SpareOwner final : StorageOwner {
    Shared* shared = nullptr;
    void release(void* data, size_t bytes) noexcept override { shared->keep_spare(data, bytes); }
  };

  std::deque<Block> blocks;   // stable addresses; the recording is [begin, size())
  std::deque<Owner> owners;   // one per block
  size_t begin = 0;
  // The arena blocks handed out whose tensors are still alive, offset -> end: disjoint, since a
  // block is handed out only when it overlaps none of them. Released from whichever thread drops
  // the last view of a tensor, hence the mutex.
  std::mutex live_mutex;
  std::map<size_t, size_t> live;
  // Mapped blocks of the recording run that escaped it (graph outputs: a training step's new
  // parameters and optimizer state) and died after it, bytes -> block, kept mapped for the
  // escaping outputs of later runs. Unmapping them made the first run after their death fault in
  // fresh pages for every such output: the BERT encoder's third training step spent 30-34 ms in
  // AdamW against ~4.5 in later steps. Guarded by live_mutex.
  std::multimap<size_t, void*> spare;
  SpareOwner spare_owner;
  char* arena = nullptr;
  size_t arena_bytes = 0;
  bool recording = true;
  bool recording_open = false;  // inside the recording run
  int step = 0;

  Shared() { spare_owner.shared = this; }
  ~Shared() {
    if (arena) give_block(arena, arena_bytes);
    for (const auto& [bytes, data] : spare) give_mapped_block(data, bytes);
  }

  void keep_spare(void* data, size_t bytes) noexcept {
    const std::lock_guard lock(live_mutex);
    try {
      spare.emplace(bytes, data);
    } catch (...) {  // no memory for the map's node: unmap the block instead
      give_mapped_block(data, bytes);
    }
  }

  // A spare block of `bytes`, or nullptr.
  void* take_spare(size_t bytes) {
    const std::lock_guard lock(live_mutex);
    const auto it = spare.find(bytes);
    if (it == spare.end()) return nullptr;
    void* data = it->second;
    spare.erase(it);
    return data;
  }

  bool in_arena(const void* data) const {
    return arena && data >= arena && static_cast<const char*>(data) < arena + arena_bytes;
  }

  void released(size_t b, void* data) noexcept {
    if (in_arena(data)) {
      const std::lock_guard lock(live_mutex);
      live.erase(blocks[b].offset);
      return;
    }
    Block& block = blocks[b];
    if (block.last == kAlive) block.last = recording_open ? step : kEscaped;
    if (block.mapped && !recording_open) {
      keep_spare(data, block.bytes);  // escaped: a later run's outputs take it
    } else if (block.mapped) {
      give_mapped_block(data, block.bytes);
    } else if (recording_open) {
      std::free(data);  // back to the system: the arena serves this block from now on
    } else {
      give_block(data, block.bytes);  // escaped (a graph output): later outputs reuse it
    }
  }

  std::shared_ptr<StorageOwner> owner(const std::shared_ptr<Shared>& self, size_t b) {
    return std::shared_ptr<StorageOwner>(self, &owners[b]);  // keeps the arena alive
  }

  // Places the recorded blocks that died within the run: largest first, each at the lowest
  // offset free of the blocks whose lifetimes intersect its own. The placed blocks whose
  // lifetimes intersect a block's are found through a max-tree over the blocks sorted by first
  // step, so that a plan of n blocks places in about n log n plus the intersections found, not
  // n^2 (a chain of 10^5 nodes took 140 s and 24 GB before).
  void place() {
    std::vector<size_t> order;
    for (size_t b = begin; b < blocks.size(); ++b) {
      if (blocks[b].last != kEscaped && blocks[b].last != kAlive) order.push_back(b);
    }
    std::vector<size_t> by_first = order;  // tree positions: blocks sorted by first step
    std::stable_sort(by_first.begin(), by_first.end(),
                     [&](size_t a, size_t b) { return blocks[a].first < blocks[b].first; });
    std::vector<size_t> position(blocks.size() - begin);
    for (size_t i = 0; i < by_first.size(); ++i) position[by_first[i] - begin] = i;
    size_t leaves = 1;
    while (leaves < by_first.size()) leaves *= 2;
    std::vector<int> max_last(2 * leaves, std::numeric_limits<int>::min());  // over placed blocks
    std::vector<std::pair<size_t, size_t>> taken;
    // Appends the byte ranges of placed blocks among tree positions [0, end) whose last step is
    // at least `from`.
    auto collect = [&](auto& self, size_t node, size_t lo, size_t hi, size_t end, int from) -> void {
      if (lo >= end || max_last[node] < from) return;
      if (hi - lo == 1) {
        const Block& other = blocks[by_first[lo]];
        taken.emplace_back(other.offset, other.offset + other.bytes);
        return;
      }
      const size_t mid = (lo + hi) / 2;
      self(self, 2 * node, lo, mid, end, from);
      self(self, 2 * node + 1, mid, hi, end, from);
    };
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return blocks[a].bytes > blocks[b].bytes; });
    for (size_t b : order) {
      Block& block = blocks[b];
      taken.clear();
      // Positions whose first step is at most this block's last step.
      const size_t end = static_cast<size_t>(
          std::upper_bound(by_first.begin(), by_first.end(), block.last,
                           [&](int last, size_t other) { return last < blocks[other].first; }) -
          by_first.begin());
      collect(collect, 1, 0, leaves, end, block.first);
      std::sort(taken.begin(), taken.end());
      size_t offset = 0;
      for (const auto& [lo, hi] : taken) {
        if (offset + block.bytes <= lo) break;
        offset = std::max(offset, hi);
      }
      block.offset = offset;
      block.in_arena = true;
      arena_bytes = std::max(arena_bytes, offset + block.bytes);
      for (size_t node = leaves + position[b - begin]; node >= 1; node /= 2) {
        max_last[node] = std::max(max_last[node], block.last);
      }
    }
    if (arena_bytes > 0) {
      try {
        arena = static_cast<char*>(take_block(arena_bytes));
      } catch (const std::bad_alloc&) {
        arena = nullptr;
      }
    }
    if (!arena) {  // no arena (none needed, or no memory): every block takes the heap
      arena_bytes = 0;
      for (size_t b : order) blocks[b].in_arena = false;
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
  const size_t bytes = rounded(checked_nbytes(dtype, shape));
  Shared& s = *shared_;
  const size_t k = s.begin + next_++;
  if (s.recording) {
    // Counted like any tensor block; freed to the system. Large blocks are mapped, so that what
    // the recording run frees does not stay resident beside the arena (core/memory.h).
    const bool mapped = bytes >= kMappedBytes;
    void* data = mapped ? take_mapped_block(bytes) : take_block(bytes);
    s.blocks.push_back({bytes, s.step, kAlive, 0, false, mapped});
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
  if (!block.in_arena) {  // escapes the run: a spare block of the recording run, else the heap
    if (void* data = s.take_spare(bytes)) {
      return Tensor(dtype, shape,
                    std::make_shared<Storage>(data, bytes, std::shared_ptr<StorageOwner>(shared_, &s.spare_owner)));
    }
    return Tensor(dtype, shape);
  }
  {
    // Not while a tensor still views any of its bytes (its own last one, or another block's
    // that shares them and that someone kept).
    const std::lock_guard lock(s.live_mutex);
    auto next = s.live.lower_bound(block.offset);
    if (next != s.live.end() && next->first < block.offset + bytes) return Tensor(dtype, shape);
    if (next != s.live.begin() && std::prev(next)->second > block.offset) return Tensor(dtype, shape);
    s.live.emplace_hint(next, block.offset, block.offset + bytes);
  }
  return Tensor(dtype, shape, std::make_shared<Storage>(s.arena + block.offset, bytes, s.owner(shared_, k)));
}

}  // namespace onnxtrain::runtime
