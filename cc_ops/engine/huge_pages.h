// Memory for the engine's large random-access arrays (the ID maps, the host
// tier's value chunks). Blocks of 2 MiB and more are aligned to 2 MiB and
// offered to the kernel as transparent huge pages (madvise), so that a key
// stage or a swap touching thousands of random IDs misses the TLB far less.
// Where the kernel does not use huge pages this is plain aligned memory.
#ifndef MXREC_ENGINE_HUGE_PAGES_H_
#define MXREC_ENGINE_HUGE_PAGES_H_

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <new>

namespace mxrec {

constexpr size_t kHugePageBytes = size_t{2} << 20;

// Uninitialised memory for `bytes`, released with std::free.
inline void* AllocateLarge(size_t bytes) {
  const size_t align = bytes >= kHugePageBytes ? kHugePageBytes : 64;
  void* memory = nullptr;
  if (posix_memalign(&memory, align, bytes == 0 ? align : bytes) != 0) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  if (align == kHugePageBytes) madvise(memory, bytes, MADV_HUGEPAGE);
#endif
  return memory;
}

// A std::allocator for vectors that grow large (std::vector<T, HugePageAllocator<T>>).
template <typename T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: allocator conversion
  T* allocate(size_t n) { return static_cast<T*>(AllocateLarge(n * sizeof(T))); }
  void deallocate(T* p, size_t) { std::free(p); }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const HugePageAllocator<U>&) const { return false; }
};

}  // namespace mxrec

#endif  // MXREC_ENGINE_HUGE_PAGES_H_
