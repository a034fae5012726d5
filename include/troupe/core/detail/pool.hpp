#pragma once
// Small-object pool for envelopes and actor cells.
//
// Messages are allocated on the sender's thread and freed on the receiver's,
// which makes general-purpose allocators take a lock per free (glibc returns
// the chunk to the arena that owns it). The pool instead keeps per-thread free
// lists per 16-byte size class; a thread whose list grows past a threshold
// hands a batch to a global depot, where allocating threads pick it up. Cost
// per message: a few plain loads and stores, and one mutex per batch of 256.
//
// Memory taken from the system is kept for reuse, not returned (as with most
// message-passing runtimes): the pool's size is the peak of live objects.
// Under AddressSanitizer or ThreadSanitizer the pool forwards to operator
// new/delete, so that those tools still see every object's lifetime.
//
// Thread-safety: all functions are thread-safe.

#include <cstddef>
#include <new>

namespace troupe::detail {

void* pool_alloc(std::size_t size);
void pool_free(void* p, std::size_t size) noexcept;

// Base class giving a type pooled allocation. The size passed to delete must
// be the dynamic type's: delete through the concrete type, or through a base
// with a virtual destructor.
struct Pooled {
  static void* operator new(std::size_t size) { return pool_alloc(size); }
  static void operator delete(void* p, std::size_t size) noexcept { pool_free(p, size); }
  static void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
    try {
      return pool_alloc(size);
    } catch (...) {
      return nullptr;
    }
  }
  // Over-aligned types (alignas(64) members) bypass the 16-byte-aligned pool.
  static void* operator new(std::size_t size, std::align_val_t al) { return ::operator new(size, al); }
  static void operator delete(void* p, std::size_t size, std::align_val_t al) noexcept {
    ::operator delete(p, size, al);
  }
  static void* operator new(std::size_t size, std::align_val_t al, const std::nothrow_t& nt) noexcept {
    return ::operator new(size, al, nt);
  }
};

}  // namespace troupe::detail
