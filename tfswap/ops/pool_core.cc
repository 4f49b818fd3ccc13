#include "pool_core.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define TFSWAP_ASAN 1
#endif

namespace tfswap {
namespace {

constexpr int32_t kNoRegion = -2;
constexpr int32_t kSharedRegion = -3;  // the objects of a shared layout
// The page table stays below this many entries whatever the arena size; each
// region is padded to a page, so the padding is at most (K + 1) pages, under
// (K + 1) / 65536 of the arena.
constexpr uint64_t kMaxPages = uint64_t{1} << 16;

uint64_t RoundUp(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

class HostMemorySource : public MemorySource {
 public:
  void* Reserve(size_t bytes, size_t alignment, std::string* error) override {
    // aligned_alloc wants a size that is a multiple of the alignment.
    void* p = std::aligned_alloc(alignment, RoundUp(std::max<size_t>(bytes, 1), alignment));
    if (p == nullptr) {
      *error = "could not reserve " + std::to_string(bytes) +
               " bytes of host memory for the pool arena";
    }
    return p;
  }
  void Release(void* base) override { std::free(base); }
  bool HostAccessible() const override { return true; }
};

}  // namespace

PoolConfig MakePoolConfig(int32_t n_classes, const uint64_t* class_bytes,
                          const uint64_t* class_count, uint64_t small_pool_bytes,
                          uint64_t small_threshold_bytes, const char* plan_id,
                          const uint64_t* object_offsets) {
  PoolConfig cfg;
  cfg.class_bytes.assign(class_bytes, class_bytes + n_classes);
  cfg.class_count.assign(class_count, class_count + n_classes);
  if (object_offsets != nullptr) {
    for (int32_t i = 0; i < n_classes; ++i) {
      cfg.object_offsets.emplace_back(object_offsets, object_offsets + class_count[i]);
      object_offsets += class_count[i];
    }
  }
  cfg.small_pool_bytes = small_pool_bytes;
  cfg.small_threshold_bytes = small_threshold_bytes;
  cfg.plan_id = plan_id != nullptr ? plan_id : "";
  return cfg;
}

std::unique_ptr<MemorySource> NewHostMemorySource() {
  return std::make_unique<HostMemorySource>();
}

PoolCore::PoolCore(const PoolConfig& config, std::unique_ptr<MemorySource> source)
    : config_(config), source_(std::move(source)) {}

PoolCore::~PoolCore() {
  if (base_ != nullptr) {
    Unpoison(base_, arena_bytes_);  // hand the memory back clean
    source_->Release(base_);
  }
}

bool PoolCore::Validate(const PoolConfig& config, std::string* error) {
  const size_t k = config.class_bytes.size();
  if (config.class_count.size() != k) {
    *error = "class_bytes has " + std::to_string(k) + " entries but class_count has " +
             std::to_string(config.class_count.size()) + "; give one count per class";
    return false;
  }
  for (size_t i = 0; i < k; ++i) {
    if (config.class_bytes[i] == 0) {
      *error = "size class " + std::to_string(i) + " has 0 bytes; class sizes must be > 0";
      return false;
    }
    if (i > 0 && config.class_bytes[i] <= config.class_bytes[i - 1]) {
      *error = "class_bytes must be strictly increasing; class " + std::to_string(i) +
               " (" + std::to_string(config.class_bytes[i]) + " bytes) follows class " +
               std::to_string(i - 1) + " (" + std::to_string(config.class_bytes[i - 1]) +
               " bytes)";
      return false;
    }
    if (config.class_count[i] > UINT32_MAX) {
      *error = "size class " + std::to_string(i) + " has more than 2^32 objects";
      return false;
    }
  }
  if (!config.object_offsets.empty()) {
    if (config.object_offsets.size() != k) {
      *error = "object_offsets has " + std::to_string(config.object_offsets.size()) +
               " classes but class_bytes has " + std::to_string(k) +
               "; give one offset list per class";
      return false;
    }
    for (size_t i = 0; i < k; ++i) {
      if (config.object_offsets[i].size() != config.class_count[i]) {
        *error = "size class " + std::to_string(i) + " has " +
                 std::to_string(config.class_count[i]) + " objects but " +
                 std::to_string(config.object_offsets[i].size()) +
                 " offsets; give one offset per object";
        return false;
      }
      for (uint64_t o : config.object_offsets[i]) {
        if (o % kObjectAlignment != 0) {
          *error = "object offset " + std::to_string(o) + " of size class " +
                   std::to_string(i) + " is not a multiple of " +
                   std::to_string(kObjectAlignment) + " bytes";
          return false;
        }
      }
    }
  }
  if (config.small_threshold_bytes == 0) {
    *error = "small_threshold_bytes must be > 0 (requests below it use the small pool)";
    return false;
  }
  return true;
}

std::unique_ptr<PoolCore> PoolCore::Create(const PoolConfig& config,
                                           std::unique_ptr<MemorySource> source,
                                           std::string* error) {
  if (!Validate(config, error)) return nullptr;
  if (source == nullptr) {
    *error = "no memory source given";
    return nullptr;
  }
  std::unique_ptr<PoolCore> pool(new PoolCore(config, std::move(source)));
  if (!pool->Init(error)) return nullptr;
  return pool;
}

bool PoolCore::Init(std::string* error) {
  const size_t k = config_.class_bytes.size();
  uint64_t unpadded = RoundUp(config_.small_pool_bytes, kSmallUnit);
  uint64_t shared_extent = 0;
  for (size_t i = 0; i < k; ++i) {
    const uint64_t stride = RoundUp(config_.class_bytes[i], kObjectAlignment);
    if (shared()) {
      for (uint64_t o : config_.object_offsets[i]) {
        shared_extent = std::max(shared_extent, o + stride);
      }
    } else {
      unpadded += stride * config_.class_count[i];
    }
  }
  unpadded += shared_extent;
  uint64_t page = 4096;
  while (unpadded / page >= kMaxPages) page <<= 1;
  page_shift_ = 0;
  while ((uint64_t{1} << page_shift_) < page) ++page_shift_;

  classes_.resize(k);
  uint64_t offset = 0;
  for (size_t i = 0; i < k; ++i) {
    ClassRegion& c = classes_[i];
    c.offset = offset;
    c.stride = RoundUp(config_.class_bytes[i], kObjectAlignment);
    const uint64_t n = config_.class_count[i];
    c.free_stack.resize(n);
    for (uint64_t j = 0; j < n; ++j) c.free_stack[j] = static_cast<uint32_t>(n - 1 - j);
    c.in_use.assign(n, 0);
    c.requested.assign(n, 0);
    c.stats.class_bytes = config_.class_bytes[i];
    c.stats.count = n;
    c.object_offset.resize(n);
    for (uint64_t j = 0; j < n; ++j) {
      c.object_offset[j] = shared() ? config_.object_offsets[i][j] : c.offset + c.stride * j;
    }
    if (!shared()) offset = RoundUp(offset + c.stride * n, page);
  }
  if (shared()) offset = RoundUp(shared_extent, page);
  small_offset_ = offset;
  small_units_ = config_.small_pool_bytes / kSmallUnit;  // never beyond the limit
  offset = RoundUp(offset + small_units_ * kSmallUnit, page);
  arena_bytes_ = offset;
  small_stats_.limit_bytes = small_units_ * kSmallUnit;

  // Bins 0..B: block sizes kSmallUnit << b, the last one >= the threshold.
  size_t nbins = 1;
  while ((uint64_t{kSmallUnit} << (nbins - 1)) < config_.small_threshold_bytes) ++nbins;
  bins_.assign(nbins, {});
  unit_bin_.assign(small_units_, -1);
  unit_live_.assign(small_units_, 0);
  unit_requested_.assign(small_units_, 0);

  page_region_.assign(arena_bytes_ >> page_shift_, kNoRegion);
  if (shared()) {
    for (uint64_t p = 0; (p << page_shift_) < shared_extent; ++p) page_region_[p] = kSharedRegion;
    if (!InitShared(error)) return false;
  }
  for (size_t i = 0; i < k && !shared(); ++i) {
    const uint64_t end = classes_[i].offset + classes_[i].stride * classes_[i].stats.count;
    for (uint64_t p = classes_[i].offset >> page_shift_; (p << page_shift_) < end; ++p) {
      page_region_[p] = static_cast<int32_t>(i);
    }
  }
  for (uint64_t p = small_offset_ >> page_shift_;
       (p << page_shift_) < small_offset_ + small_units_ * kSmallUnit; ++p) {
    page_region_[p] = kSmallPoolClass;
  }

  if (arena_bytes_ > 0) {
    base_ = static_cast<char*>(source_->Reserve(arena_bytes_, kObjectAlignment, error));
    if (base_ == nullptr) return false;
    if (reinterpret_cast<uintptr_t>(base_) % kObjectAlignment != 0) {
      *error = "the memory source returned an arena that is not aligned to " +
               std::to_string(kObjectAlignment) + " bytes";
      source_->Release(base_);
      base_ = nullptr;
      return false;
    }
    Poison(base_, arena_bytes_);
  }
  return true;
}

bool PoolCore::InitShared(std::string* error) {
  // Objects sorted by offset; each overlaps the ones that start before it ends.
  struct Span {
    uint64_t lo, hi;
    uint32_t id;
  };
  std::vector<Span> spans;
  uint32_t id = 0;
  for (ClassRegion& c : classes_) {
    c.first_id = id;
    for (uint64_t o : c.object_offset) spans.push_back({o, o + c.stride, id++});
  }
  if (id > UINT32_MAX / 2) {
    *error = "a shared layout of more than 2^31 objects";
    return false;
  }
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.lo < b.lo || (a.lo == b.lo && a.id < b.id); });
  overlaps_.assign(id, {});
  object_live_.assign(id, 0);
  for (size_t a = 0; a < spans.size(); ++a) {
    for (size_t b = a + 1; b < spans.size() && spans[b].lo < spans[a].hi; ++b) {
      overlaps_[spans[a].id].push_back(spans[b].id);
      overlaps_[spans[b].id].push_back(spans[a].id);
    }
  }
  return true;
}

int64_t PoolCore::PickSharedLocked(const ClassRegion& c) const {
  for (int64_t i = static_cast<int64_t>(c.free_stack.size()) - 1; i >= 0; --i) {
    bool covered = false;
    for (uint32_t other : overlaps_[c.first_id + c.free_stack[i]]) {
      if (object_live_[other]) {
        covered = true;
        break;
      }
    }
    if (!covered) return i;
  }
  return -1;
}

std::string PoolCore::Describe() const {
  return "tfswap pool allocator (plan '" + config_.plan_id + "')";
}

void PoolCore::Poison(void* p, size_t bytes) const {
#ifdef TFSWAP_ASAN
  if (source_->HostAccessible()) ASAN_POISON_MEMORY_REGION(p, bytes);
#else
  (void)p;
  (void)bytes;
#endif
}

void PoolCore::Unpoison(void* p, size_t bytes) const {
#ifdef TFSWAP_ASAN
  if (source_->HostAccessible()) ASAN_UNPOISON_MEMORY_REGION(p, bytes);
#else
  (void)p;
  (void)bytes;
#endif
}

AllocResult PoolCore::Allocate(size_t bytes, size_t alignment) {
  AllocResult r;
  if (alignment > kObjectAlignment) {
    r.status = AllocStatus::kBadAlignment;
    r.error = Describe() + ": alignment " + std::to_string(alignment) +
              " requested, the pool aligns to " + std::to_string(kObjectAlignment);
    return r;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes < config_.small_threshold_bytes) return AllocateSmallLocked(bytes);

  // The smallest class that fits.  K is small (a plan has a handful of
  // classes), so a binary search is a few comparisons.
  const auto& sizes = config_.class_bytes;
  const size_t i = std::lower_bound(sizes.begin(), sizes.end(), uint64_t{bytes}) - sizes.begin();
  if (i == sizes.size()) {
    r.status = AllocStatus::kTooLarge;
    r.error = Describe() + ": a request of " + std::to_string(bytes) +
              " bytes is larger than the largest size class (" +
              (sizes.empty() ? std::string("the plan has no size classes")
                             : std::to_string(sizes.back()) + " bytes") +
              "); the run does not match the plan: re-plan this step";
    return r;
  }
  ClassRegion& c = classes_[i];
  r.class_index = static_cast<int32_t>(i);
  r.class_bytes = sizes[i];
  if (c.free_stack.empty()) {
    r.status = AllocStatus::kClassExhausted;
    r.error = Describe() + ": size class " + std::to_string(i) + " (" +
              std::to_string(sizes[i]) + " bytes, " + std::to_string(c.stats.count) +
              " objects) has no free object for a request of " + std::to_string(bytes) +
              " bytes; the run holds more tensors of this class than the plan " +
              "allowed: re-plan, or give class " + std::to_string(i) + " more objects";
    return r;
  }
  uint32_t obj;
  if (shared()) {
    const int64_t at = PickSharedLocked(c);
    if (at < 0) {
      r.status = AllocStatus::kMemoryInUse;
      r.error = Describe() + ": size class " + std::to_string(i) + " (" +
                std::to_string(sizes[i]) + " bytes) has " + std::to_string(c.free_stack.size()) +
                " free objects for a request of " + std::to_string(bytes) +
                " bytes, but the shared layout places each of them on memory that another "
                "live object holds: the run does not follow the plan's order; re-plan, or "
                "plan with pool_layout='disjoint'";
      return r;
    }
    obj = c.free_stack[at];
    c.free_stack.erase(c.free_stack.begin() + at);
    object_live_[c.first_id + obj] = 1;
    live_at_[c.object_offset[obj]] = {static_cast<int32_t>(i), obj};
  } else {
    obj = c.free_stack.back();
    c.free_stack.pop_back();
  }
  c.in_use[obj] = 1;
  c.requested[obj] = bytes;
  c.stats.in_use += 1;
  c.stats.peak_in_use = std::max(c.stats.peak_in_use, c.stats.in_use);
  c.stats.num_allocs += 1;
  bytes_in_use_ += sizes[i];
  peak_bytes_in_use_ = std::max(peak_bytes_in_use_, bytes_in_use_);
  num_allocs_ += 1;
  largest_alloc_ = std::max<uint64_t>(largest_alloc_, bytes);
  r.object_index = obj;
  r.ptr = base_ + c.object_offset[obj];
  Unpoison(r.ptr, bytes);
  return r;
}

AllocResult PoolCore::AllocateSmallLocked(size_t bytes) {
  AllocResult r;
  size_t bin = 0;
  while ((uint64_t{kSmallUnit} << bin) < bytes) ++bin;
  const uint64_t block = uint64_t{kSmallUnit} << bin;
  const uint64_t units = block / kSmallUnit;
  uint64_t unit;
  if (!bins_[bin].empty()) {
    unit = bins_[bin].back();
    bins_[bin].pop_back();
  } else if (small_bump_ + units <= small_units_) {
    unit = small_bump_;
    small_bump_ += units;
    unit_bin_[unit] = static_cast<int8_t>(bin);
    small_stats_.carved_bytes = small_bump_ * kSmallUnit;
  } else {
    r.status = AllocStatus::kSmallPoolFull;
    r.class_bytes = block;
    r.error = Describe() + ": the small-tensor pool (" +
              std::to_string(small_stats_.limit_bytes) + " bytes, " +
              std::to_string(small_stats_.in_use_bytes) + " in use, " +
              std::to_string(small_stats_.carved_bytes) +
              " carved into blocks) has no room for a request of " + std::to_string(bytes) +
              " bytes (a " + std::to_string(block) +
              "-byte block); re-plan with a larger small_pool_bytes";
    return r;
  }
  unit_live_[unit] = 1;
  unit_requested_[unit] = bytes;
  small_stats_.in_use_bytes += block;
  small_stats_.requested_in_use_bytes += bytes;
  small_stats_.peak_in_use_bytes =
      std::max(small_stats_.peak_in_use_bytes, small_stats_.in_use_bytes);
  small_stats_.num_allocs += 1;
  bytes_in_use_ += block;
  peak_bytes_in_use_ = std::max(peak_bytes_in_use_, bytes_in_use_);
  num_allocs_ += 1;
  largest_alloc_ = std::max<uint64_t>(largest_alloc_, bytes);
  r.class_index = kSmallPoolClass;
  r.object_index = static_cast<int64_t>(unit);
  r.class_bytes = block;
  r.ptr = base_ + small_offset_ + unit * kSmallUnit;
  Unpoison(r.ptr, bytes);
  return r;
}

bool PoolCore::Free(void* ptr, std::string* error) {
  const char* p = static_cast<const char*>(ptr);
  if (ptr == nullptr || base_ == nullptr || p < base_ || p >= base_ + arena_bytes_) {
    *error = Describe() + ": free of a pointer outside the arena";
    return false;
  }
  const uint64_t off = static_cast<uint64_t>(p - base_);
  std::lock_guard<std::mutex> lock(mu_);
  const int32_t region = page_region_[off >> page_shift_];
  if (region == kSharedRegion) {
    auto it = live_at_.find(off);
    if (it == live_at_.end()) {
      *error = Describe() + ": free of a pointer that is not a live object of the shared "
               "layout (double free or foreign pointer)";
      return false;
    }
    const int32_t cls = it->second.first;
    const uint32_t obj = it->second.second;
    ClassRegion& c = classes_[cls];
    live_at_.erase(it);
    object_live_[c.first_id + obj] = 0;
    c.in_use[obj] = 0;
    c.requested[obj] = 0;
    c.free_stack.push_back(obj);
    c.stats.in_use -= 1;
    bytes_in_use_ -= config_.class_bytes[cls];
    Poison(ptr, c.stride);
    return true;
  }
  if (region >= 0) {
    ClassRegion& c = classes_[region];
    const uint64_t rel = off - c.offset;
    const uint64_t obj = rel / c.stride;
    if (off < c.offset || rel % c.stride != 0 || obj >= c.stats.count || !c.in_use[obj]) {
      *error = Describe() + ": free of a pointer that is not a live object of size class " +
               std::to_string(region) + " (double free or foreign pointer)";
      return false;
    }
    c.in_use[obj] = 0;
    c.requested[obj] = 0;
    c.free_stack.push_back(static_cast<uint32_t>(obj));
    c.stats.in_use -= 1;
    bytes_in_use_ -= config_.class_bytes[region];
    Poison(ptr, c.stride);
    return true;
  }
  if (region == kSmallPoolClass) {
    const uint64_t rel = off - small_offset_;
    const uint64_t unit = rel / kSmallUnit;
    if (rel % kSmallUnit != 0 || unit >= small_units_ || !unit_live_[unit]) {
      *error = Describe() + ": free of a pointer that is not a live small-pool block "
               "(double free or foreign pointer)";
      return false;
    }
    const int bin = unit_bin_[unit];
    const uint64_t block = uint64_t{kSmallUnit} << bin;
    unit_live_[unit] = 0;
    small_stats_.in_use_bytes -= block;
    small_stats_.requested_in_use_bytes -= unit_requested_[unit];
    unit_requested_[unit] = 0;
    bins_[bin].push_back(static_cast<uint32_t>(unit));
    bytes_in_use_ -= block;
    Poison(ptr, block);
    return true;
  }
  *error = Describe() + ": free of a pointer into the arena's padding";
  return false;
}

bool PoolCore::Lookup(const void* ptr, int32_t* class_index, int64_t* object_index,
                      uint64_t* requested_bytes, uint64_t* allocated_bytes) const {
  const char* p = static_cast<const char*>(ptr);
  if (ptr == nullptr || base_ == nullptr || p < base_ || p >= base_ + arena_bytes_) return false;
  const uint64_t off = static_cast<uint64_t>(p - base_);
  std::lock_guard<std::mutex> lock(mu_);
  const int32_t region = page_region_[off >> page_shift_];
  if (region == kSharedRegion) {
    auto it = live_at_.find(off);
    if (it == live_at_.end()) return false;
    const ClassRegion& c = classes_[it->second.first];
    *class_index = it->second.first;
    *object_index = it->second.second;
    *requested_bytes = c.requested[it->second.second];
    *allocated_bytes = config_.class_bytes[it->second.first];
    return true;
  }
  if (region >= 0) {
    const ClassRegion& c = classes_[region];
    const uint64_t rel = off - c.offset;
    const uint64_t obj = rel / c.stride;
    if (rel % c.stride != 0 || obj >= c.stats.count || !c.in_use[obj]) return false;
    *class_index = region;
    *object_index = static_cast<int64_t>(obj);
    *requested_bytes = c.requested[obj];
    *allocated_bytes = config_.class_bytes[region];
    return true;
  }
  if (region == kSmallPoolClass) {
    const uint64_t rel = off - small_offset_;
    const uint64_t unit = rel / kSmallUnit;
    if (rel % kSmallUnit != 0 || unit >= small_units_ || !unit_live_[unit]) return false;
    *class_index = kSmallPoolClass;
    *object_index = static_cast<int64_t>(unit);
    *requested_bytes = unit_requested_[unit];
    *allocated_bytes = uint64_t{kSmallUnit} << unit_bin_[unit];
    return true;
  }
  return false;
}

PoolStats PoolCore::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  PoolStats s;
  s.bytes_limit = arena_bytes_;
  s.bytes_in_use = bytes_in_use_;
  s.peak_bytes_in_use = peak_bytes_in_use_;
  s.num_allocs = num_allocs_;
  s.largest_alloc_size = largest_alloc_;
  for (const ClassRegion& c : classes_) s.classes.push_back(c.stats);
  s.small = small_stats_;
  return s;
}

void PoolCore::ClearPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_bytes_in_use_ = bytes_in_use_;
  for (ClassRegion& c : classes_) c.stats.peak_in_use = c.stats.in_use;
  small_stats_.peak_in_use_bytes = small_stats_.in_use_bytes;
}

bool PoolCore::CheckConsistency(std::string* error) const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t bytes = 0, allocs = small_stats_.num_allocs;
  for (size_t i = 0; i < classes_.size(); ++i) {
    const ClassRegion& c = classes_[i];
    std::vector<uint8_t> seen(c.stats.count, 0);
    for (uint32_t obj : c.free_stack) {
      if (obj >= c.stats.count || seen[obj] || c.in_use[obj]) {
        *error = "class " + std::to_string(i) + ": object " + std::to_string(obj) +
                 " is on the free stack twice, out of range, or also in use";
        return false;
      }
      seen[obj] = 1;
    }
    uint64_t live = 0;
    for (uint64_t j = 0; j < c.stats.count; ++j) {
      if (!seen[j] && !c.in_use[j]) {
        *error = "class " + std::to_string(i) + ": object " + std::to_string(j) +
                 " is neither free nor in use (lost)";
        return false;
      }
      live += c.in_use[j];
    }
    if (live != c.stats.in_use || c.stats.in_use > c.stats.peak_in_use) {
      *error = "class " + std::to_string(i) + ": counted " + std::to_string(live) +
               " live objects, statistics say " + std::to_string(c.stats.in_use);
      return false;
    }
    bytes += live * config_.class_bytes[i];
    allocs += c.stats.num_allocs;
    for (uint64_t j = 0; j < c.stats.count && shared(); ++j) {
      if (object_live_[c.first_id + j] != c.in_use[j]) {
        *error = "class " + std::to_string(i) + ": object " + std::to_string(j) +
                 " is live in one table and not the other";
        return false;
      }
      if (!c.in_use[j]) continue;
      for (uint32_t other : overlaps_[c.first_id + j]) {
        if (object_live_[other]) {
          *error = "class " + std::to_string(i) + ": object " + std::to_string(j) +
                   " is live on memory another live object holds";
          return false;
        }
      }
    }
  }
  uint64_t small_live = 0, small_req = 0;
  std::vector<uint8_t> on_list(small_units_, 0);
  for (size_t b = 0; b < bins_.size(); ++b) {
    for (uint32_t u : bins_[b]) {
      if (u >= small_bump_ || on_list[u] || unit_live_[u] || unit_bin_[u] != static_cast<int>(b)) {
        *error = "small pool: block at unit " + std::to_string(u) +
                 " is listed twice, live, or in the wrong bin";
        return false;
      }
      on_list[u] = 1;
    }
  }
  for (uint64_t u = 0; u < small_bump_;) {
    if (unit_bin_[u] < 0) {
      *error = "small pool: carved unit " + std::to_string(u) + " starts no block";
      return false;
    }
    const uint64_t units = uint64_t{1} << unit_bin_[u];
    if (unit_live_[u]) {
      small_live += units * kSmallUnit;
      small_req += unit_requested_[u];
    } else if (!on_list[u]) {
      *error = "small pool: block at unit " + std::to_string(u) + " is lost";
      return false;
    }
    u += units;
  }
  if (small_live != small_stats_.in_use_bytes ||
      small_req != small_stats_.requested_in_use_bytes) {
    *error = "small pool: counted " + std::to_string(small_live) +
             " bytes in use, statistics say " + std::to_string(small_stats_.in_use_bytes);
    return false;
  }
  bytes += small_live;
  if (bytes != bytes_in_use_ || allocs != num_allocs_ || bytes_in_use_ > peak_bytes_in_use_) {
    *error = "pool totals disagree: counted " + std::to_string(bytes) + " bytes and " +
             std::to_string(allocs) + " allocations, statistics say " +
             std::to_string(bytes_in_use_) + " and " + std::to_string(num_allocs_);
    return false;
  }
  return true;
}

}  // namespace tfswap
