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
// Name() of every ArenaAllocator.  Not kPoolAllocatorName: a request the
// active plan cannot serve comes from the arena's free ranges, which the plan
// does not order, so SwapIn keeps TensorFlow's wait for the compute stream.
inline constexpr char kArenaAllocatorName[] = "tfswap_arena";

// A PoolCore or a BudgetArena as a tsl::Allocator.  A failed request logs the
// backend's message, keeps it for last_error() and returns nullptr (TF raises
// ResourceExhausted in the op); a bad free is fatal (the books are broken).
// ClearStats starts a new peak, so tf.config.experimental.reset_memory_stats
// works on the device.
template <class Backend>
class BackendAllocator : public tsl::Allocator {
 public:
  BackendAllocator(std::unique_ptr<Backend> backend, const char* name)
      : backend_(std::move(backend)), name_(name) {}

  std::string Name() override { return name_; }
  void* AllocateRaw(size_t alignment, size_t num_bytes) override;
  void DeallocateRaw(void* ptr) override;
  bool TracksAllocationSizes() const override { return true; }
  size_t RequestedSize(const void* ptr) const override;
  size_t AllocatedSize(const void* ptr) const override;
  std::optional<tsl::AllocatorStats> GetStats() override;
  bool ClearStats() override;
  tsl::AllocatorMemoryType GetMemoryType() const override;

  Backend& backend() { return *backend_; }
  std::string last_error() const;

 private:
  std::unique_ptr<Backend> backend_;
  const char* name_;
  mutable std::mutex error_mu_;
  std::string last_error_;
};

using PoolAllocator = BackendAllocator<PoolCore>;     // one plan's pool
using ArenaAllocator = BackendAllocator<BudgetArena>;  // the budget arena

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
