#include "troupe/core/detail/pool.hpp"

#include <cstdint>
#include <mutex>
#include <vector>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TROUPE_POOL_DISABLED 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TROUPE_POOL_DISABLED 1
#endif
#endif

namespace troupe::detail {

#ifdef TROUPE_POOL_DISABLED

void* pool_alloc(std::size_t size) { return ::operator new(size); }
void pool_free(void* p, std::size_t size) noexcept { ::operator delete(p, size); }

#else

namespace {

constexpr std::size_t kGranule = 16;
constexpr std::size_t kClasses = 32;  // up to 512 bytes
constexpr std::size_t kMaxSize = kGranule * kClasses;
constexpr std::uint32_t kBatch = 256;           // objects per depot batch
constexpr std::size_t kSlabBytes = 64 * 1024;   // carved into one class

struct FreeNode {
  FreeNode* next;
};

struct Batch {
  FreeNode* head;
  std::uint32_t count;
};

// Process-wide; intentionally never destroyed (threads may free into it
// during static destruction).
struct Depot {
  std::mutex mu;
  std::vector<Batch> batches;
};

Depot* depots() {
  static Depot* d = new Depot[kClasses];
  return d;
}

struct Cache {
  FreeNode* head[kClasses] = {};
  std::uint32_t count[kClasses] = {};

  ~Cache() {
    // Thread exit: give everything back so other threads can reuse it.
    for (std::size_t c = 0; c < kClasses; ++c) {
      if (!head[c]) continue;
      auto& d = depots()[c];
      std::lock_guard lk(d.mu);
      d.batches.push_back({head[c], count[c]});
      head[c] = nullptr;
      count[c] = 0;
    }
  }
};

thread_local Cache t_cache;

void refill(Cache& cache, std::size_t c) {
  auto& d = depots()[c];
  {
    std::lock_guard lk(d.mu);
    if (!d.batches.empty()) {
      Batch b = d.batches.back();
      d.batches.pop_back();
      cache.head[c] = b.head;
      cache.count[c] = b.count;
      return;
    }
  }
  const std::size_t size = (c + 1) * kGranule;
  const std::size_t n = kSlabBytes / size;
  auto* slab = static_cast<unsigned char*>(::operator new(n * size));
  FreeNode* head = nullptr;
  for (std::size_t i = n; i-- > 0;) {
    auto* f = reinterpret_cast<FreeNode*>(slab + i * size);
    f->next = head;
    head = f;
  }
  cache.head[c] = head;
  cache.count[c] = static_cast<std::uint32_t>(n);
}

void spill(Cache& cache, std::size_t c) {
  FreeNode* head = cache.head[c];
  FreeNode* cut = head;
  for (std::uint32_t i = 1; i < kBatch; ++i) cut = cut->next;
  cache.head[c] = cut->next;
  cache.count[c] -= kBatch;
  cut->next = nullptr;
  auto& d = depots()[c];
  std::lock_guard lk(d.mu);
  d.batches.push_back({head, kBatch});
}

}  // namespace

void* pool_alloc(std::size_t size) {
  if (size > kMaxSize || size == 0) return ::operator new(size);
  const std::size_t c = (size - 1) / kGranule;
  Cache& cache = t_cache;
  if (!cache.head[c]) refill(cache, c);
  FreeNode* f = cache.head[c];
  cache.head[c] = f->next;
  --cache.count[c];
  return f;
}

void pool_free(void* p, std::size_t size) noexcept {
  if (!p) return;
  if (size > kMaxSize || size == 0) {
    ::operator delete(p, size);
    return;
  }
  const std::size_t c = (size - 1) / kGranule;
  Cache& cache = t_cache;
  auto* f = static_cast<FreeNode*>(p);
  f->next = cache.head[c];
  cache.head[c] = f;
  if (++cache.count[c] >= 2 * kBatch) spill(cache, c);
}

#endif

}  // namespace troupe::detail
