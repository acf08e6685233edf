// Memory for the engine's large random-access arrays (the ID maps, the host
// tier's value chunks, the dynamic store's chunks). Blocks of 2 MiB and more
// are aligned to 2 MiB and offered to the kernel as transparent huge pages
// (madvise), so that a key stage or a swap touching thousands of random IDs
// misses the TLB far less. Where the kernel does not use huge pages this is
// plain aligned memory.
//
// A failed allocation throws AllocationError, which carries the size asked
// for; the engine's entry points turn it into a kResourceExhausted Status that
// names the table (OutOfMemory, GuardAllocation), so that running out of
// memory is an error of one call, not the end of the process.
#ifndef MXREC_ENGINE_HUGE_PAGES_H_
#define MXREC_ENGINE_HUGE_PAGES_H_

#include <cstddef>
#include <cstdlib>
#include <new>
#include <string>

#include "status.h"

namespace mxrec {

constexpr size_t kHugePageBytes = size_t{2} << 20;

// std::bad_alloc with the number of bytes that could not be allocated.
class AllocationError : public std::bad_alloc {
 public:
  explicit AllocationError(size_t bytes) : bytes_(bytes) {}
  size_t bytes() const { return bytes_; }
  const char* what() const noexcept override { return "mxrec: memory allocation failed"; }

 private:
  size_t bytes_;
};

// Uninitialised memory for `bytes`, released with std::free. Throws
// AllocationError.
void* AllocateLarge(size_t bytes);

// Makes AllocateLarge refuse (AllocationError) any block larger than `bytes`;
// 0 lifts the limit. Process-wide, for tests of the out-of-memory paths, which
// must not depend on the machine's memory.
void SetAllocationLimitForTesting(size_t bytes);

// kResourceExhausted: table `table` could not get `bytes` (0: size not known)
// for `what`.
Status OutOfMemory(const std::string& table, const std::string& what, size_t bytes);

// Runs fn() (returning Status) and turns an allocation failure inside it, on
// this thread or on a pool thread (ThreadPool::ParallelFor rethrows it here),
// into OutOfMemory(table, what, bytes asked for).
template <typename Fn>
Status GuardAllocation(const std::string& table, const std::string& what, Fn&& fn) {
  try {
    return fn();
  } catch (const AllocationError& error) {
    return OutOfMemory(table, what, error.bytes());
  } catch (const std::bad_alloc&) {
    return OutOfMemory(table, what, 0);
  }
}

// A std::allocator for vectors that grow large (std::vector<T, HugePageAllocator<T>>).
template <typename T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: allocator conversion
  T* allocate(size_t n) {
    if (n > static_cast<size_t>(-1) / sizeof(T)) throw AllocationError(static_cast<size_t>(-1));
    return static_cast<T*>(AllocateLarge(n * sizeof(T)));
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const HugePageAllocator<U>&) const { return false; }
};

}  // namespace mxrec

#endif  // MXREC_ENGINE_HUGE_PAGES_H_
