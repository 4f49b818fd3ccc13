// Helpers shared by the C entry points of the pool (pool_capi.cc), the budget
// arena (arena_capi.cc) and the TensorFlow hook (pool_allocator.cc).

#ifndef TFSWAP_OPS_POOL_CAPI_H_
#define TFSWAP_OPS_POOL_CAPI_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "pool_core.h"

namespace tfswap {

// Copies msg into err (errlen bytes, NUL-terminated, truncated if need be).
void SetError(char* err, size_t errlen, const std::string& msg);

// Writes s into the arrays tfswap.ops.allocator reads and returns the number
// of classes.  totals = {bytes_limit, bytes_in_use, peak_bytes_in_use,
// num_allocs, largest_alloc_size}; per_class = n x {class_bytes, count,
// in_use, peak_in_use, num_allocs}; small = {limit_bytes, in_use_bytes,
// peak_in_use_bytes, requested_in_use_bytes, carved_bytes, num_allocs}.
int32_t PackPoolStats(const PoolStats& s, uint64_t* totals, uint64_t* per_class,
                      uint64_t* small);

}  // namespace tfswap

#endif  // TFSWAP_OPS_POOL_CAPI_H_
