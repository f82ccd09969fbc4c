// Registration of a token table's rows for the GPU to read in place (src/cuda/host_rows.h):
// cudaHostRegister of exactly the rows' bytes, counted per address so that registering a table twice
// (two servers' models sharing a mapped checkpoint, a retried load) pins it once and the last
// release unpins it. Host code only.
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <map>
#include <mutex>
#include <string>

#include "cuda/check.h"
#include "cuda/host_rows.h"

namespace jtok::cuda {

namespace {

struct Registration {
  size_t bytes = 0;
  int64_t refs = 0;
};

// Registered byte ranges by start address (process-wide, as the registrations are).
struct Registry {
  std::mutex mu;
  std::map<uintptr_t, Registration> ranges;
};
Registry& registry() {
  static Registry r;
  return r;
}

std::string hex(uintptr_t a) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%#llx", static_cast<unsigned long long>(a));
  return buf;
}

std::string describe(const TokenTable& t, const char* what) {
  return std::string(what) + " (" + std::to_string(t.rows) + " x " + std::to_string(t.dim) + ", " +
         dtype_name(t.dtype()) + ")";
}

// Only a whole table of f32 or bf16 rows held in memory is read in place.
void check_registrable(const TokenTable& t, const char* what) {
  const std::string name = describe(t, what);
  if (t.dtype() != Dtype::f32 && t.dtype() != Dtype::bf16)
    fail(name, ": rows stored as ", dtype_name(t.dtype()),
         " are not read in place by the GPU (f32 or bf16 only); stage them (cuda/row_staging.h)");
  if (t.in_store()) fail(name, ": a disk table's rows are not in memory; stage them (cuda/row_staging.h)");
  if (t.id_first != 0 || t.id_stride != 1 || t.id_count != t.rows)
    fail(name, ": a rank's shard (ids from ", t.id_first, " every ", t.id_stride, " of ", t.id_count,
         ") is not read in place; the GPU indexes rows by id");
  if (t.rows <= 0 || t.dim <= 0 || t.raw_row(0) == nullptr) fail(name, ": no rows in memory (an unbound table)");
}

// Fails when [begin, begin + bytes) overlaps a registered range other than one starting at begin.
void check_no_overlap(const Registry& r, uintptr_t begin, size_t bytes, const std::string& name) {
  auto next = r.ranges.upper_bound(begin);
  if (next != r.ranges.end() && next->first < begin + bytes)
    fail(name, ": its bytes overlap another registered table's (at ", hex(next->first), ")");
  if (next != r.ranges.begin()) {
    auto prev = std::prev(next);
    if (prev->first != begin && prev->first + prev->second.bytes > begin)
      fail(name, ": its bytes overlap another registered table's (at ", hex(prev->first), ")");
  }
}

// cudaHostRegister's flags: mapped (the device pointer), portable (every context), and read-only
// where the device allows it (required for a read-only mapping: a memory-mapped checkpoint).
unsigned register_flags() {
  int device = 0, read_only = 0;
  JTOK_CUDA_CHECK(cudaGetDevice(&device));
  JTOK_CUDA_CHECK(cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, device));
  return cudaHostRegisterPortable | cudaHostRegisterMapped | (read_only ? cudaHostRegisterReadOnly : 0u);
}

}  // namespace

RowSource register_table_rows(const TokenTable& t, const char* what) {
  check_registrable(t, what);
  const std::string name = describe(t, what);
  void* host = const_cast<void*>(t.raw_row(0));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(host);
  const size_t bytes = static_cast<size_t>(t.rows * t.row_stride_bytes());
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.ranges.find(begin);
  if (it != r.ranges.end() && it->second.bytes != bytes)
    fail(name, ": its first row is registered with ", it->second.bytes, " bytes, not its ", bytes);
  if (it == r.ranges.end()) {
    check_no_overlap(r, begin, bytes, name);
    const cudaError_t e = cudaHostRegister(host, bytes, register_flags());
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: clear it so later calls do not report it
      fail(name, ": cudaHostRegister of its ", bytes, " bytes: ", cudaGetErrorName(e), " (", cudaGetErrorString(e),
           ")");
    }
    it = r.ranges.emplace(begin, Registration{bytes, 0}).first;
  }
  void* device = nullptr;
  const cudaError_t e = cudaHostGetDevicePointer(&device, host, 0);
  if (e != cudaSuccess) {  // no reference taken: a registration of its own is undone
    (void)cudaGetLastError();
    if (it->second.refs == 0) {
      r.ranges.erase(it);
      (void)cudaHostUnregister(host);
    }
    fail(name, ": cudaHostGetDevicePointer: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
  }
  ++it->second.refs;
  return RowSource{device, t.rows, t.dim, t.dtype()};
}

bool unregister_table_rows(const TokenTable& t) {
  if (t.in_store() || t.rows <= 0 || t.dim <= 0 || t.raw_row(0) == nullptr) return false;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.raw_row(0));
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.ranges.find(begin);
  if (it == r.ranges.end()) return false;
  if (--it->second.refs > 0) return true;
  r.ranges.erase(it);
  JTOK_CUDA_CHECK(cudaHostUnregister(reinterpret_cast<void*>(begin)));
  return true;
}

int64_t table_rows_registrations(const TokenTable& t) {
  if (t.in_store() || t.rows <= 0 || t.dim <= 0 || t.raw_row(0) == nullptr) return 0;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.ranges.find(reinterpret_cast<uintptr_t>(t.raw_row(0)));
  return it == r.ranges.end() ? 0 : it->second.refs;
}

RegisteredRows& RegisteredRows::operator=(RegisteredRows&& o) noexcept {
  if (this != &o) {
    release();
    table_ = o.table_;
    source_ = o.source_;
    o.table_ = nullptr;
  }
  return *this;
}

void RegisteredRows::release() noexcept {
  if (!table_) return;
  try {
    unregister_table_rows(*table_);
  } catch (...) {  // a failed cudaHostUnregister at teardown: nothing left to do with it
  }
  table_ = nullptr;
  source_ = RowSource{};
}

}  // namespace jtok::cuda
