// The size-class pool of SwapAdvisor (§4.1, §5.3), free of any framework.
//
// A plan fixes, before the step runs, how device memory is cut up: K size
// classes of strictly increasing object sizes, CNT objects of each, and a small
// sub-pool for tiny tensors.  The pool reserves one arena up front from a
// MemorySource and carves it exactly that way, so a plan the simulator accepted
// cannot fail by fragmentation: it can only fail because the run differs from
// the plan, and then it fails loudly, naming the class.
//
// Semantics shared with tfswap/core/simulator.py (they must stay identical):
//  * a request of s >= small_threshold_bytes bytes takes one object of the
//    smallest class whose size is >= s;
//  * each class keeps a LIFO stack of free object indices, initially
//    [n-1, ..., 1, 0], so the first allocation gets object 0; allocate pops,
//    free pushes;
//  * a request below small_threshold_bytes goes to the small sub-pool.
//
// Layouts.  Disjoint (the paper's): each class's objects lie one after
// another, every object has memory of its own.  Shared (object_offsets given,
// tfswap/core/layout.py): the plan places every object at an offset of its
// own choosing, and objects the plan never holds at the same time may
// overlap, so the arena is the layout's extent, not the sum of the objects.
// An object is handed out only while no object overlapping it is in use: the
// free stack is searched from the top for the first such object (the top
// itself whenever the run follows the plan), and if every free object of the
// class is covered the request fails with kMemoryInUse, naming the class --
// never two live tensors in one place.
//
// Small sub-pool policy: size-segregated free lists.  A request is rounded up
// to a power of two, at least kSmallUnit bytes; a bin's free list is a LIFO
// stack of block offsets; a bin with an empty list carves a new block from a
// bump pointer over the reserved small region.  Freed blocks stay in their bin
// (no coalescing), so the small pool needs up to 2x the live small bytes plus
// whatever the bins keep; its peak is reported separately.
//
// All bookkeeping lives in host memory (the arena may be device memory that the
// host cannot touch).  One mutex guards the pool: allocate and free are O(1)
// (a page table maps an address to its region, no search).
//
// Example (host memory):
//   tfswap::PoolConfig cfg{{1 << 20, 4 << 20}, {3, 2}, 1 << 20, 1 << 20, "p1"};
//   std::string err;
//   auto pool = tfswap::PoolCore::Create(cfg, tfswap::NewHostMemorySource(), &err);
//   tfswap::AllocResult r = pool->Allocate(3 << 20, 64);   // class 1, object 0
//   pool->Free(r.ptr, &err);

#ifndef TFSWAP_OPS_POOL_CORE_H_
#define TFSWAP_OPS_POOL_CORE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tfswap {

// Objects and small blocks start at multiples of this (what GPU kernels and
// cuDNN want; more than tsl::Allocator::kAllocatorAlignment = 64).
constexpr size_t kObjectAlignment = 256;
// The smallest block of the small sub-pool.
constexpr size_t kSmallUnit = 256;

struct PoolConfig {
  std::vector<uint64_t> class_bytes;  // strictly increasing, > 0
  std::vector<uint64_t> class_count;  // objects per class, >= 0
  uint64_t small_pool_bytes = 0;      // bytes reserved for the small sub-pool
  uint64_t small_threshold_bytes = 1 << 20;  // requests below go to it
  std::string plan_id;
  // Shared layout: per class, per object, its offset in bytes from the arena
  // base (multiples of kObjectAlignment).  Empty: the disjoint layout.
  std::vector<std::vector<uint64_t>> object_offsets;
};

// A config from the flat arrays the C API takes.  object_offsets: nullptr (the
// disjoint layout) or every class's object offsets, class after class.
PoolConfig MakePoolConfig(int32_t n_classes, const uint64_t* class_bytes,
                          const uint64_t* class_count, uint64_t small_pool_bytes,
                          uint64_t small_threshold_bytes, const char* plan_id,
                          const uint64_t* object_offsets);

// Where the arena comes from: host memory in tests, the device's own allocator
// on a GPU.  Reserve is called once, Release once with what Reserve returned.
class MemorySource {
 public:
  virtual ~MemorySource() = default;
  virtual void* Reserve(size_t bytes, size_t alignment, std::string* error) = 0;
  virtual void Release(void* base) = 0;
  // True when the host may read and write the arena (enables the stress test's
  // pattern checks and AddressSanitizer poisoning of free objects).
  virtual bool HostAccessible() const = 0;
};

std::unique_ptr<MemorySource> NewHostMemorySource();

enum class AllocStatus : int {
  kOk = 0,
  kClassExhausted = 1,   // the fitting class has no free object
  kSmallPoolFull = 2,    // the small sub-pool has no room
  kTooLarge = 3,         // larger than the largest class
  kBadAlignment = 4,     // alignment above kObjectAlignment
  kMemoryInUse = 5,      // shared layout: every free object overlaps a live one
  kArenaFull = 6,        // budget arena (pool_arena.h): no free range large enough
};

constexpr int32_t kSmallPoolClass = -1;

struct AllocResult {
  void* ptr = nullptr;
  AllocStatus status = AllocStatus::kOk;
  int32_t class_index = kSmallPoolClass;  // kSmallPoolClass for the small pool
  int64_t object_index = -1;              // object within the class, or the
                                          // block's offset / kSmallUnit
  uint64_t class_bytes = 0;               // the class's size (or block bytes)
  int32_t layout = -1;                    // budget arena: the layout that served it
  std::string error;                      // set when status != kOk
};

struct ClassStats {
  uint64_t class_bytes = 0;
  uint64_t count = 0;
  uint64_t in_use = 0;       // objects
  uint64_t peak_in_use = 0;  // objects
  uint64_t num_allocs = 0;
};

struct SmallPoolStats {
  uint64_t limit_bytes = 0;
  uint64_t in_use_bytes = 0;      // block bytes (rounded up)
  uint64_t peak_in_use_bytes = 0;
  uint64_t requested_in_use_bytes = 0;
  uint64_t carved_bytes = 0;      // bump pointer: blocks ever carved
  uint64_t num_allocs = 0;
};

struct PoolStats {
  uint64_t bytes_limit = 0;        // arena bytes, including alignment padding
  uint64_t bytes_in_use = 0;       // class bytes of held objects + small blocks
  uint64_t peak_bytes_in_use = 0;
  uint64_t num_allocs = 0;
  uint64_t largest_alloc_size = 0;  // largest request served
  std::vector<ClassStats> classes;
  SmallPoolStats small;
};

class PoolCore {
 public:
  // Validates the config, reserves the arena and builds the free stacks.
  // Returns nullptr with *error set on a bad config or a failed reservation.
  static std::unique_ptr<PoolCore> Create(const PoolConfig& config,
                                          std::unique_ptr<MemorySource> source,
                                          std::string* error);
  // The checks Create makes on a config, without reserving anything.
  static bool Validate(const PoolConfig& config, std::string* error);
  ~PoolCore();
  PoolCore(const PoolCore&) = delete;
  PoolCore& operator=(const PoolCore&) = delete;

  AllocResult Allocate(size_t bytes, size_t alignment);
  // False (with *error) for a pointer the pool did not hand out or a double free.
  bool Free(void* ptr, std::string* error);
  // The slot and sizes of a live allocation; false if ptr is not one.
  bool Lookup(const void* ptr, int32_t* class_index, int64_t* object_index,
              uint64_t* requested_bytes, uint64_t* allocated_bytes) const;
  PoolStats Stats() const;
  // Starts a new peak (bytes and per-class objects) from what is in use now.
  void ClearPeak();
  // Recounts everything from the free stacks and flags: every object is either
  // free exactly once or in use, and the counters agree.
  bool CheckConsistency(std::string* error) const;

  const PoolConfig& config() const { return config_; }
  size_t arena_bytes() const { return arena_bytes_; }
  bool host_accessible() const { return source_->HostAccessible(); }

 private:
  struct ClassRegion {
    uint64_t offset = 0;  // from the arena base (disjoint layout)
    uint64_t stride = 0;  // class_bytes rounded up to kObjectAlignment
    std::vector<uint64_t> object_offset;  // each object's offset from the base
    uint32_t first_id = 0;                // global id of object 0 (shared layout)
    std::vector<uint32_t> free_stack;  // LIFO; back() is the next object
    std::vector<uint8_t> in_use;
    std::vector<uint64_t> requested;
    ClassStats stats;
  };

  PoolCore(const PoolConfig& config, std::unique_ptr<MemorySource> source);
  bool Init(std::string* error);
  AllocResult AllocateSmallLocked(size_t bytes);
  bool InitShared(std::string* error);
  // Shared layout: the index in c.free_stack of the object to hand out, or -1.
  int64_t PickSharedLocked(const ClassRegion& c) const;
  bool shared() const { return !config_.object_offsets.empty(); }
  std::string Describe() const;
  void Poison(void* p, size_t bytes) const;
  void Unpoison(void* p, size_t bytes) const;

  const PoolConfig config_;
  std::unique_ptr<MemorySource> source_;
  char* base_ = nullptr;
  size_t arena_bytes_ = 0;
  unsigned page_shift_ = 12;
  // page -> region: class index, kSmallPoolClass, or kNoRegion (padding).
  std::vector<int32_t> page_region_;

  mutable std::mutex mu_;
  std::vector<ClassRegion> classes_;
  // Small sub-pool, in units of kSmallUnit from small_offset_.
  uint64_t small_offset_ = 0;
  uint64_t small_units_ = 0;
  uint64_t small_bump_ = 0;                     // next unit to carve
  std::vector<std::vector<uint32_t>> bins_;     // free block units per bin
  std::vector<int8_t> unit_bin_;                // bin of a block at its first unit
  std::vector<uint8_t> unit_live_;
  std::vector<uint64_t> unit_requested_;
  SmallPoolStats small_stats_;
  // Shared layout: per global object id, the ids of the objects it overlaps
  // and whether it is in use; live objects by offset (unique while no two
  // live objects overlap).
  std::vector<std::vector<uint32_t>> overlaps_;
  std::vector<uint8_t> object_live_;
  std::unordered_map<uint64_t, std::pair<int32_t, uint32_t>> live_at_;
  uint64_t bytes_in_use_ = 0;
  uint64_t peak_bytes_in_use_ = 0;
  uint64_t num_allocs_ = 0;
  uint64_t largest_alloc_ = 0;
};

}  // namespace tfswap

#endif  // TFSWAP_OPS_POOL_CORE_H_
