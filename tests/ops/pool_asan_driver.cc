// AddressSanitizer driver for the pool core (built by test_pool_allocator.py
// with g++ -fsanitize=address, together with pool_core.cc and pool_capi.cc).
//
//   pool_asan_driver stress   -> replay + multithreaded stress; prints "ok"
//   pool_asan_driver uaf      -> writes into a freed object; ASan must abort
//   pool_asan_driver overflow -> writes past a live object's requested bytes;
//                                ASan must abort
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "pool_core.h"

extern "C" int tfswap_pool_stress(void*, int32_t, int64_t, uint64_t, uint64_t*, char*, size_t);

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "stress";
  tfswap::PoolConfig cfg{{4096, 10000, 65536, 1 << 20}, {4, 3, 3, 2}, 1 << 16, 4096, "asan"};
  std::string err;
  auto pool = tfswap::PoolCore::Create(cfg, tfswap::NewHostMemorySource(), &err);
  if (!pool) {
    std::fprintf(stderr, "create: %s\n", err.c_str());
    return 2;
  }
  if (mode == "uaf") {
    tfswap::AllocResult r = pool->Allocate(5000, 64);
    pool->Free(r.ptr, &err);
    static_cast<volatile char*>(r.ptr)[10] = 1;  // use after free
    return 0;
  }
  if (mode == "overflow") {
    tfswap::AllocResult r = pool->Allocate(5000, 64);
    static_cast<volatile char*>(r.ptr)[5000] = 1;  // one past the request
    return 0;
  }
  // A replay whose LIFO order is known: objects 0,1 of class 1, free 0, again 0.
  tfswap::AllocResult a = pool->Allocate(9000, 64), b = pool->Allocate(5000, 64);
  if (a.class_index != 1 || a.object_index != 0 || b.object_index != 1) return 3;
  std::memset(a.ptr, 1, 9000);
  pool->Free(a.ptr, &err);
  tfswap::AllocResult c = pool->Allocate(4097, 64);
  if (c.object_index != 0) return 3;
  pool->Free(b.ptr, &err);
  pool->Free(c.ptr, &err);
  uint64_t done = 0;
  char msg[512] = {0};
  const int rc = tfswap_pool_stress(pool.get(), 8, 20000, 7, &done, msg, sizeof msg);
  if (rc != 0) {
    std::fprintf(stderr, "stress: %s\n", msg);
    return 4;
  }
  std::printf("ok %llu allocations\n", static_cast<unsigned long long>(done));
  return 0;
}
