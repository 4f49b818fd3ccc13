#include "pool_allocator.h"

#include "pool_capi.h"

#include <atomic>
#include <cstring>
#include <vector>

#include "tensorflow/core/common_runtime/gpu/gpu_process_state.h"
#include "tensorflow/core/platform/logging.h"

namespace tfswap {

namespace {

// What the allocator interface reads of either backend.
struct Counters {
  uint64_t num_allocs, bytes_in_use, peak_bytes_in_use, largest_alloc_size, bytes_limit;
};

Counters CountersOf(const PoolCore& pool) {
  const PoolStats s = pool.Stats();
  // bytes_limit: the arena, all of it reserved up front.
  return {s.num_allocs, s.bytes_in_use, s.peak_bytes_in_use, s.largest_alloc_size,
          s.bytes_limit};
}

Counters CountersOf(const BudgetArena& arena) {
  const ArenaStats s = arena.Stats();
  return {s.num_allocs, s.bytes_in_use, s.peak_bytes_in_use, s.largest_alloc_size,
          s.arena_bytes};
}

bool SizesOf(const PoolCore& pool, const void* ptr, uint64_t* requested, uint64_t* allocated) {
  int32_t cls;
  int64_t obj;
  return pool.Lookup(ptr, &cls, &obj, requested, allocated);
}

bool SizesOf(const BudgetArena& arena, const void* ptr, uint64_t* requested,
             uint64_t* allocated) {
  return arena.Lookup(ptr, requested, allocated);
}

}  // namespace

template <class Backend>
void* BackendAllocator<Backend>::AllocateRaw(size_t alignment, size_t num_bytes) {
  AllocResult r = backend_->Allocate(num_bytes, alignment);
  if (r.status != AllocStatus::kOk) {
    LOG(ERROR) << r.error;
    std::lock_guard<std::mutex> lock(error_mu_);
    last_error_ = r.error;
    return nullptr;
  }
  return r.ptr;
}

template <class Backend>
void BackendAllocator<Backend>::DeallocateRaw(void* ptr) {
  if (ptr == nullptr) return;
  std::string error;
  // A bad free means the bookkeeping is broken; carrying on would hand the
  // same memory to two tensors.
  if (!backend_->Free(ptr, &error)) LOG(FATAL) << error;
}

template <class Backend>
size_t BackendAllocator<Backend>::RequestedSize(const void* ptr) const {
  uint64_t requested = 0, allocated = 0;
  if (!SizesOf(*backend_, ptr, &requested, &allocated)) {
    LOG(FATAL) << name_ << ": RequestedSize of a pointer it does not hold";
  }
  return requested;
}

template <class Backend>
size_t BackendAllocator<Backend>::AllocatedSize(const void* ptr) const {
  uint64_t requested = 0, allocated = 0;
  if (!SizesOf(*backend_, ptr, &requested, &allocated)) {
    LOG(FATAL) << name_ << ": AllocatedSize of a pointer it does not hold";
  }
  return allocated;
}

template <class Backend>
std::optional<tsl::AllocatorStats> BackendAllocator<Backend>::GetStats() {
  const Counters c = CountersOf(*backend_);
  tsl::AllocatorStats out;
  out.num_allocs = static_cast<int64_t>(c.num_allocs);
  out.bytes_in_use = static_cast<int64_t>(c.bytes_in_use);
  out.peak_bytes_in_use = static_cast<int64_t>(c.peak_bytes_in_use);
  out.largest_alloc_size = static_cast<int64_t>(c.largest_alloc_size);
  // TF's GPU device sizes itself from bytes_limit: all of it is reserved up front.
  out.bytes_limit = static_cast<int64_t>(c.bytes_limit);
  out.bytes_reserved = static_cast<int64_t>(c.bytes_limit);
  out.peak_bytes_reserved = static_cast<int64_t>(c.bytes_limit);
  out.pool_bytes = static_cast<int64_t>(c.bytes_limit);
  out.peak_pool_bytes = static_cast<int64_t>(c.bytes_limit);
  return out;
}

template <class Backend>
bool BackendAllocator<Backend>::ClearStats() {
  backend_->ClearPeak();
  return true;
}

template <class Backend>
tsl::AllocatorMemoryType BackendAllocator<Backend>::GetMemoryType() const {
  return backend_->host_accessible() ? tsl::AllocatorMemoryType::kHostPageable
                                     : tsl::AllocatorMemoryType::kDevice;
}

template <class Backend>
std::string BackendAllocator<Backend>::last_error() const {
  std::lock_guard<std::mutex> lock(error_mu_);
  return last_error_;
}

template class BackendAllocator<PoolCore>;
template class BackendAllocator<BudgetArena>;

void* AllocatorMemorySource::Reserve(size_t bytes, size_t alignment, std::string* error) {
  void* p = from_->AllocateRaw(alignment, bytes);
  if (p == nullptr) {
    *error = "could not reserve the pool arena of " + std::to_string(bytes) +
             " bytes from TensorFlow's device allocator '" + from_->Name() +
             "'; the plan's size classes need more memory than the device has "
             "(re-plan with a smaller budget)";
  }
  return p;
}

namespace {

// Answers TF's GPU device factory for the planned device with either a plan's
// pool (arena_bytes == 0: config is the plan) or the budget arena.
class PoolGPUProcessState : public tensorflow::GPUProcessState {
 public:
  PoolGPUProcessState(PoolConfig config, uint64_t arena_bytes, int device_index)
      : config_(std::move(config)), arena_bytes_(arena_bytes), device_index_(device_index) {}

  using tensorflow::GPUProcessState::GetGPUAllocator;

  tensorflow::Allocator* GetGPUAllocator(
      const tensorflow::GPUOptions& options, tsl::TfDeviceId tf_device_id,
      size_t total_bytes, const std::vector<tsl::TfDeviceId>& peer_gpu_ids) override {
    tensorflow::Allocator* device_allocator = tensorflow::GPUProcessState::GetGPUAllocator(
        options, tf_device_id, total_bytes, peer_gpu_ids);
    if (tf_device_id.value() != device_index_ || device_allocator == nullptr) {
      return device_allocator;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (pool_ != nullptr) return pool_.get();
    if (arena_ != nullptr) return arena_.get();
    std::string error;
    auto source = std::make_unique<AllocatorMemorySource>(device_allocator);
    if (arena_bytes_ > 0) {
      auto arena = BudgetArena::Create(arena_bytes_, std::move(source), &error);
      if (arena != nullptr) {
        arena_ = std::make_unique<ArenaAllocator>(std::move(arena), kArenaAllocatorName);
        LOG(INFO) << "tfswap budget arena active on GPU " << device_index_ << ": "
                  << arena_bytes_ << " bytes";
        return arena_.get();
      }
      error = "tfswap budget arena: " + error;
    } else {
      auto core = PoolCore::Create(config_, std::move(source), &error);
      if (core != nullptr) {
        pool_ = std::make_unique<PoolAllocator>(std::move(core), kPoolAllocatorName);
        LOG(INFO) << "tfswap pool allocator active on GPU " << device_index_ << " for plan '"
                  << config_.plan_id << "': arena " << pool_->backend().arena_bytes() << " bytes";
        return pool_.get();
      }
      error = "tfswap pool allocator (plan '" + config_.plan_id + "'): " + error;
    }
    LOG(ERROR) << error;
    setup_error_ = error;
    return nullptr;  // TF fails the device creation; no silent fallback
  }

  PoolAllocator* pool() {
    std::lock_guard<std::mutex> lock(mu_);
    return pool_.get();
  }
  ArenaAllocator* arena() {
    std::lock_guard<std::mutex> lock(mu_);
    return arena_.get();
  }
  bool is_arena() const { return arena_bytes_ > 0; }
  std::string setup_error() {
    std::lock_guard<std::mutex> lock(mu_);
    return setup_error_;
  }

 private:
  const PoolConfig config_;
  const uint64_t arena_bytes_;
  const int device_index_;
  std::mutex mu_;
  std::unique_ptr<PoolAllocator> pool_;
  std::unique_ptr<ArenaAllocator> arena_;
  std::string setup_error_;
};

std::atomic<PoolGPUProcessState*> g_installed{nullptr};

// 0: installed; 4: too late; 5: one is installed already.
int Install(PoolConfig config, uint64_t arena_bytes, int device_index, char* err,
            size_t errlen) {
  if (g_installed.load() != nullptr) {
    SetError(err, errlen, "a tfswap pool allocator is already installed in this "
                          "process; one per process");
    return 5;
  }
  auto* ours = new PoolGPUProcessState(std::move(config), arena_bytes, device_index);
  tensorflow::GPUProcessState* got = tensorflow::GPUProcessState::singleton(ours);
  if (got != ours) {
    delete ours;  // never registered anywhere
    SetError(err, errlen, "TensorFlow's GPUProcessState already exists (devices were created)");
    return 4;
  }
  g_installed.store(ours);
  return 0;
}

}  // namespace
}  // namespace tfswap

extern "C" {

int32_t tfswap_pool_stats(void* pool, uint64_t* totals, uint64_t* per_class,
                          uint64_t* small);  // pool_capi.cc

// 0: installed; 2: bad config; 4: too late (TF's GPUProcessState already
// exists); 5: a tfswap pool is already installed in this process.
int tfswap_install_gpu_pool(int32_t n_classes, const uint64_t* class_bytes,
                            const uint64_t* class_count, uint64_t small_pool_bytes,
                            uint64_t small_threshold_bytes, const char* plan_id,
                            const uint64_t* object_offsets, int32_t device_index, char* err,
                            size_t errlen) {
    if (n_classes < 0 || device_index < 0) {
    tfswap::SetError(err, errlen, "n_classes and device_index must be >= 0");
    return 2;
  }
  tfswap::PoolConfig cfg = tfswap::MakePoolConfig(n_classes, class_bytes, class_count,
                                              small_pool_bytes, small_threshold_bytes, plan_id,
                                              object_offsets);
  std::string error;
  if (!tfswap::PoolCore::Validate(cfg, &error)) {
    tfswap::SetError(err, errlen, error);
    return 2;
  }
  return tfswap::Install(std::move(cfg), 0, device_index, err, errlen);
}

// The one-process flow: the budget arena of arena_bytes on GPU device_index.
// Codes as tfswap_install_gpu_pool.
int tfswap_install_gpu_arena(uint64_t arena_bytes, int32_t device_index, char* err,
                             size_t errlen) {
  if (arena_bytes == 0 || device_index < 0) {
    tfswap::SetError(err, errlen, "the arena needs a budget > 0 bytes and a device index >= 0");
    return 2;
  }
  return tfswap::Install(tfswap::PoolConfig{}, arena_bytes, device_index, err, errlen);
}

// *out: the installed arena (a handle for the tfswap_arena_* calls).
// 0: *out set; 1: installed, but no device has asked for its allocator yet
// (err: the setup error, if creating it failed); 2: no arena installed.
int tfswap_gpu_arena(void** out, char* err, size_t errlen) {
  tfswap::PoolGPUProcessState* ps = tfswap::g_installed.load();
  if (ps == nullptr || !ps->is_arena()) return 2;
  tfswap::ArenaAllocator* a = ps->arena();
  if (a == nullptr) {
    tfswap::SetError(err, errlen, ps->setup_error());
    return 1;
  }
  *out = &a->backend();
  return 0;
}

// 0: stats written (same layout as tfswap_pool_stats, see pool_capi.cc);
// 1: installed but no device has asked for its allocator yet; 2: nothing
// installed; 3: per_class holds fewer rows than the pool has classes (*n_classes
// is the capacity on entry, the number of classes on return).  err receives the last allocation failure or setup error.
int tfswap_gpu_pool_stats(uint64_t* totals, uint64_t* per_class, uint64_t* small,
                          int32_t* n_classes, char* err, size_t errlen) {
  tfswap::PoolGPUProcessState* ps = tfswap::g_installed.load();
  if (ps == nullptr || ps->is_arena()) return 2;
  tfswap::PoolAllocator* pool = ps->pool();
  if (pool == nullptr) {
    tfswap::SetError(err, errlen, ps->setup_error());
    return 1;
  }
  const int32_t capacity = *n_classes;  // rows per_class can hold
  *n_classes = static_cast<int32_t>(pool->backend().config().class_bytes.size());
  if (*n_classes > capacity) return 3;
  tfswap_pool_stats(&pool->backend(), totals, per_class, small);
  tfswap::SetError(err, errlen, pool->last_error());
  return 0;
}

// Makes TensorFlow create its own GPUProcessState, as a GPU build does when it
// creates devices (a CPU build never does).  Tests call it in a throwaway
// process to check that tfswap_install_gpu_pool then refuses.
void tfswap_testonly_create_tf_gpu_process_state() {
  tensorflow::GPUProcessState::singleton();
}

// Exercises PoolAllocator through the tsl::Allocator interface over host
// memory (what TF calls on a device), so that layer is tested without a GPU.
// Allocates `n` requests of the given sizes, records GetStats() into
// stats_out = {num_allocs, bytes_in_use, peak_bytes_in_use, largest_alloc_size,
// bytes_limit}, requested/allocated sizes per request, then frees them all and
// returns 0; a nullptr from AllocateRaw returns 1 with the pool's message.
int tfswap_tf_pool_selftest(int32_t n_classes, const uint64_t* class_bytes,
                            const uint64_t* class_count, uint64_t small_pool_bytes,
                            uint64_t small_threshold_bytes, const char* plan_id, int32_t n,
                            const uint64_t* sizes, uint64_t* requested_out,
                            uint64_t* allocated_out, int64_t* stats_out, char* err,
                            size_t errlen) {
  std::string error;
  auto core = tfswap::PoolCore::Create(
      tfswap::MakePoolConfig(n_classes, class_bytes, class_count, small_pool_bytes,
                         small_threshold_bytes, plan_id, nullptr),
      tfswap::NewHostMemorySource(), &error);
  if (core == nullptr) {
    tfswap::SetError(err, errlen, error);
    return 2;
  }
  tfswap::PoolAllocator alloc(std::move(core), tfswap::kPoolAllocatorName);
  tsl::Allocator* a = &alloc;
  std::vector<void*> ptrs;
  int rc = 0;
  for (int32_t i = 0; i < n; ++i) {
    void* p = a->AllocateRaw(tsl::Allocator::kAllocatorAlignment, sizes[i]);
    if (p == nullptr) {
      tfswap::SetError(err, errlen, alloc.last_error());
      rc = 1;
      break;
    }
    requested_out[i] = a->RequestedSize(p);
    allocated_out[i] = a->AllocatedSize(p);
    ptrs.push_back(p);
  }
  std::optional<tsl::AllocatorStats> s = a->GetStats();
  stats_out[0] = s->num_allocs;
  stats_out[1] = s->bytes_in_use;
  stats_out[2] = s->peak_bytes_in_use;
  stats_out[3] = s->largest_alloc_size;
  stats_out[4] = s->bytes_limit.value_or(-1);
  for (void* p : ptrs) a->DeallocateRaw(p);
  if (a->GetStats()->bytes_in_use != 0) {
    tfswap::SetError(err, errlen, "bytes in use after freeing everything");
    return 3;
  }
  return rc;
}

}  // extern "C"
