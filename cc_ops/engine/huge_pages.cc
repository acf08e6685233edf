#include "huge_pages.h"

#include <sys/mman.h>

#include <atomic>

namespace mxrec {

namespace {
std::atomic<size_t> allocation_limit{0};
}  // namespace

void SetAllocationLimitForTesting(size_t bytes) { allocation_limit.store(bytes); }

void* AllocateLarge(size_t bytes) {
  const size_t limit = allocation_limit.load();
  if (limit != 0 && bytes > limit) throw AllocationError(bytes);
  const size_t align = bytes >= kHugePageBytes ? kHugePageBytes : 64;
  void* memory = nullptr;
  if (posix_memalign(&memory, align, bytes == 0 ? align : bytes) != 0) {
    throw AllocationError(bytes);
  }
#ifdef MADV_HUGEPAGE
  if (align == kHugePageBytes) madvise(memory, bytes, MADV_HUGEPAGE);
#endif
  return memory;
}

Status OutOfMemory(const std::string& table, const std::string& what, size_t bytes) {
  if (bytes == 0) {
    return MXREC_ERROR(StatusCode::kResourceExhausted, "mxrec table '", table,
                       "': out of host memory for ", what);
  }
  return MXREC_ERROR(StatusCode::kResourceExhausted, "mxrec table '", table,
                     "': out of host memory: ", what, " needs ", bytes,
                     " bytes that could not be allocated");
}

}  // namespace mxrec
