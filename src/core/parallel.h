// Deterministic parallel sums: each thread sums a fixed static block, the partial sums are added
// in thread order. (OpenMP's reduction clause combines partials in arrival order, which with more
// than two threads changes the last bits from run to run; exact resume needs the same bits.)
#pragma once
#include <omp.h>

#include <cstdint>
#include <vector>

namespace jtok {

// Below this many elements an OpenMP region costs more than it saves (and on a loaded machine a
// fork/join can wait a whole time slice): tiny ops, e.g. one decoding step, run serially.
constexpr int64_t kParallelMin = 16384;

template <typename F>  // F(int64_t i) -> double
double parallel_sum(int64_t n, F term) {
  std::vector<double> part(static_cast<size_t>(omp_get_max_threads()), 0.0);
#pragma omp parallel
  {
    double s = 0.0;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) s += term(i);
    part[static_cast<size_t>(omp_get_thread_num())] = s;
  }
  double total = 0.0;
  for (double p : part) total += p;
  return total;
}

}  // namespace jtok
