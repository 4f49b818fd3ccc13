// The budget arena: the pool allocator without a second process.
//
// A plan's pool (pool_core.h) must be installed before TensorFlow creates its
// devices, and the plan exists only after the step was captured and
// profiled -- on those devices.  Installing the plan's pool therefore needs a
// second process.  The budget arena turns the order around: it reserves the
// user's memory budget once, when the device is created, and serves every
// allocation of the device from it, so the device never holds more than the
// budget.  Plans are bound to it later, in the same process:
//
//  * Outside a plan (no layout active), requests are served best-fit from the
//    arena's free ranges, which coalesce with their neighbours when freed:
//    variables, inputs, the profiling runs.
//  * AddLayout registers a plan's layout (a PoolConfig).  The first Activate
//    carves it from the free ranges as one block and builds a PoolCore over
//    that block, with exactly the simulator's semantics (size classes, LIFO
//    objects, shared offsets, small pool).  The block stays carved after
//    Deactivate, so the next step finds the same objects; it goes back to the
//    free ranges when another layout or a request needs the room and none of
//    its objects is in use, or on RemoveLayout.
//  * While a layout is active, requests go to it first.  A request it cannot
//    serve (the run strayed from the plan: a class ran out, an object is
//    covered) is served from the free ranges and counted as a stray, so the
//    budget still holds and verification sees the divergence.  A request
//    neither can serve fails (nullptr in TensorFlow): the budget is a hard cap.
//
// One mutex guards the arena; a layout's PoolCore is only called under it.
//
// Example (host memory):
//   std::string err;
//   auto arena = tfswap::BudgetArena::Create(64 << 20, tfswap::NewHostMemorySource(), &err);
//   void* w = arena->Allocate(8 << 20, 64).ptr;            // a variable: free ranges
//   int32_t id = arena->AddLayout(plan_layout, &err);
//   arena->Activate(id, &err);                              // carves the layout
//   tfswap::AllocResult r = arena->Allocate(3 << 20, 64);   // class 1, object 0
//   arena->Free(r.ptr, &err);
//   arena->Deactivate();

#ifndef TFSWAP_OPS_POOL_ARENA_H_
#define TFSWAP_OPS_POOL_ARENA_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pool_core.h"

namespace tfswap {

// AllocResult.class_index of an allocation from the free ranges.
constexpr int32_t kGeneralClass = -2;

struct ArenaStats {
  uint64_t arena_bytes = 0;
  uint64_t bytes_in_use = 0;       // free-range allocations + layouts' objects and blocks
  uint64_t peak_bytes_in_use = 0;  // since creation or ClearPeak
  uint64_t general_in_use = 0;     // free-range allocations (block bytes)
  uint64_t carved_bytes = 0;       // arena bytes held by carved layouts
  uint64_t largest_free_bytes = 0;
  uint64_t num_allocs = 0;
  uint64_t strays = 0;             // requests an active layout could not serve
  uint64_t stray_bytes = 0;
  uint64_t largest_alloc_size = 0;
  int32_t active_layout = -1;
};

// Where a layout sits in the arena.
struct LayoutPlace {
  bool carved = false;
  uint64_t offset = 0;  // from the arena base
  uint64_t bytes = 0;
};

class BudgetArena {
 public:
  // Reserves arena_bytes (rounded up to kObjectAlignment) from source.
  static std::unique_ptr<BudgetArena> Create(uint64_t arena_bytes,
                                             std::unique_ptr<MemorySource> source,
                                             std::string* error);
  ~BudgetArena();
  BudgetArena(const BudgetArena&) = delete;
  BudgetArena& operator=(const BudgetArena&) = delete;

  // Registers a layout (validated, not carved yet).  Its id (>= 0), or -1 with *error.
  int32_t AddLayout(const PoolConfig& config, std::string* error);
  // Makes layout `id` serve requests, carving it first if it is not.  False
  // with *error when no free block is large enough (nothing changes then).
  bool Activate(int32_t id, std::string* error);
  void Deactivate();
  // Forgets layout `id`, giving its block back; false while objects of it are in use.
  bool RemoveLayout(int32_t id, std::string* error);

  // result.class_index is kGeneralClass for the free ranges (object_index: the
  // block's offset); result.layout names the layout that served it, or -1.
  AllocResult Allocate(size_t bytes, size_t alignment);
  bool Free(void* ptr, std::string* error);
  bool Lookup(const void* ptr, uint64_t* requested_bytes, uint64_t* allocated_bytes) const;

  ArenaStats Stats() const;
  // False for an unknown id.  *stats is left alone while the layout is not carved.
  bool LayoutStats(int32_t id, LayoutPlace* place, PoolStats* stats) const;
  // A copy of layout id's config; false for an unknown id.
  bool LayoutConfig(int32_t id, PoolConfig* config) const;
  std::string last_stray() const;
  void ClearPeak();
  // Free and used ranges tile the arena, the counters agree, and each carved
  // layout is consistent.
  bool CheckConsistency(std::string* error) const;

  char* base() const { return base_; }
  bool host_accessible() const { return source_->HostAccessible(); }

 private:
  struct Block {
    uint64_t bytes = 0;      // rounded to kObjectAlignment
    uint64_t requested = 0;
    int32_t layout = -1;     // >= 0: the block carved for this layout
  };
  struct Layout {
    PoolConfig config;
    bool removed = false;
    std::unique_ptr<PoolCore> core;  // non-null while carved
    uint64_t offset = 0;
    uint64_t bytes = 0;
  };
  class CarveSource;

  BudgetArena(uint64_t arena_bytes, std::unique_ptr<MemorySource> source);
  // Free ranges; the caller holds mu_.  Take returns the offset or UINT64_MAX.
  uint64_t TakeLocked(uint64_t bytes, uint64_t alignment, uint64_t requested, int32_t layout);
  void GiveLocked(uint64_t offset);
  bool CarveLocked(int32_t id, std::string* error);
  // Gives back the blocks of carved, inactive layouts with nothing in use;
  // true if any went.
  bool EvictIdleLocked();
  void UncarveLocked(Layout& l);
  uint64_t LargestFreeLocked() const;
  std::string DescribeLocked() const;

  const uint64_t arena_bytes_;
  std::unique_ptr<MemorySource> source_;
  char* base_ = nullptr;

  mutable std::mutex mu_;
  std::map<uint64_t, uint64_t> free_;                 // offset -> bytes
  std::set<std::pair<uint64_t, uint64_t>> by_size_;   // (bytes, offset) of free_
  std::unordered_map<uint64_t, Block> used_;          // offset -> block
  std::vector<Layout> layouts_;
  int32_t active_ = -1;
  uint64_t general_in_use_ = 0;
  uint64_t layout_in_use_ = 0;
  uint64_t carved_bytes_ = 0;
  uint64_t peak_bytes_in_use_ = 0;
  uint64_t num_allocs_ = 0;
  uint64_t strays_ = 0;
  uint64_t stray_bytes_ = 0;
  uint64_t largest_alloc_ = 0;
  std::string last_stray_;
};

}  // namespace tfswap

#endif  // TFSWAP_OPS_POOL_ARENA_H_
