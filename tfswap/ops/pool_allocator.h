// The pool (pool_core.h) as a TensorFlow device allocator, and the hook that
// makes TensorFlow use it for a GPU.
//
// PoolAllocator is a tsl::Allocator over a PoolCore.  On a GPU its arena is
// one block taken, when the device is created, from the allocator TensorFlow
// would have used (the BFC allocator over cudaMalloc'd memory), so no CUDA API
// is called here and the library builds from the pip wheel's headers alone.
//
// PoolGPUProcessState replaces TensorFlow's GPUProcessState singleton: TF's
// GPU device factory asks GPUProcessState::singleton()->GetGPUAllocator(...)
// (virtual) for each device's allocator, and this subclass answers with the
// pool for the planned device.  GPUProcessState::singleton(ps) keeps the first
// instance it ever saw (a function-local static; verified by disassembling
// TF 2.21's libtensorflow_framework.so.2), so installing must happen before
// anything asks for the singleton -- in practice before TF creates devices.
// tfswap_install_gpu_pool reports "too late" when singleton() returns another
// instance than ours.
//
// Failure is loud: AllocateRaw returns nullptr (TF turns that into a
// ResourceExhausted error of the op) after logging the pool's message naming
// the class, the request and the plan id; the message is also kept for
// tfswap_gpu_pool_last_error.  There is no fallback to another allocator.

#ifndef TFSWAP_OPS_POOL_ALLOCATOR_H_
#define TFSWAP_OPS_POOL_ALLOCATOR_H_

#include <memory>
#include <mutex>
#include <string>

#include "pool_arena.h"
#include "pool_core.h"
#include "xla/tsl/framework/allocator.h"

namespace tfswap {

// Name() of every PoolAllocator; SwapIn's GPU kernel checks the device
// allocator's name against it (swap_ops.cc).
inline constexpr char kPoolAllocatorName[] = "tfswap_pool";

class PoolAllocator : public tsl::Allocator {
 public:
  explicit PoolAllocator(std::unique_ptr<PoolCore> core);

  std::string Name() override { return kPoolAllocatorName; }
  void* AllocateRaw(size_t alignment, size_t num_bytes) override;
  void DeallocateRaw(void* ptr) override;
  bool TracksAllocationSizes() const override { return true; }
  size_t RequestedSize(const void* ptr) const override;
  size_t AllocatedSize(const void* ptr) const override;
  std::optional<tsl::AllocatorStats> GetStats() override;
  tsl::AllocatorMemoryType GetMemoryType() const override;

  PoolCore& core() { return *core_; }
  std::string last_error() const;

 private:
  std::unique_ptr<PoolCore> core_;
  mutable std::mutex error_mu_;
  std::string last_error_;
};

// Name() of every ArenaAllocator.  Not kPoolAllocatorName: a request the
// active plan cannot serve comes from the arena's free ranges, which the plan
// does not order, so SwapIn keeps TensorFlow's wait for the compute stream.
inline constexpr char kArenaAllocatorName[] = "tfswap_arena";

// The budget arena (pool_arena.h) as a TensorFlow device allocator.  A failed
// request logs the arena's message and returns nullptr (TF raises
// ResourceExhausted in the op); ClearStats starts a new peak, so
// tf.config.experimental.reset_memory_stats works on the device.
class ArenaAllocator : public tsl::Allocator {
 public:
  explicit ArenaAllocator(std::unique_ptr<BudgetArena> arena) : arena_(std::move(arena)) {}

  std::string Name() override { return kArenaAllocatorName; }
  void* AllocateRaw(size_t alignment, size_t num_bytes) override;
  void DeallocateRaw(void* ptr) override;
  bool TracksAllocationSizes() const override { return true; }
  size_t RequestedSize(const void* ptr) const override;
  size_t AllocatedSize(const void* ptr) const override;
  std::optional<tsl::AllocatorStats> GetStats() override;
  bool ClearStats() override;
  tsl::AllocatorMemoryType GetMemoryType() const override;

  BudgetArena& arena() { return *arena_; }

 private:
  std::unique_ptr<BudgetArena> arena_;
};

// A MemorySource that takes the arena, once, from another tsl::Allocator.
class AllocatorMemorySource : public MemorySource {
 public:
  explicit AllocatorMemorySource(tsl::Allocator* from) : from_(from) {}
  void* Reserve(size_t bytes, size_t alignment, std::string* error) override;
  void Release(void* base) override { from_->DeallocateRaw(base); }
  bool HostAccessible() const override { return false; }

 private:
  tsl::Allocator* from_;
};

}  // namespace tfswap

#endif  // TFSWAP_OPS_POOL_ALLOCATOR_H_
