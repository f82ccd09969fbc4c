#include "core/release_pages.h"

#include <sys/mman.h>
#include <unistd.h>

namespace jtok {

int64_t release_zero_pages(float* p, int64_t n) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t b = reinterpret_cast<uintptr_t>(p), e = reinterpret_cast<uintptr_t>(p + n);
  const uintptr_t b0 = (b + page - 1) / page * page, e0 = e / page * page;  // whole pages inside
  if (e0 <= b0) return 0;
  if (madvise(reinterpret_cast<void*>(b0), e0 - b0, MADV_DONTNEED) != 0) return 0;  // only a saving
  return static_cast<int64_t>(e0 - b0);
}

}  // namespace jtok
