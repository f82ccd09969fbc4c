// The logit digest kernel's own source (src/cuda/logit_digest.cu's device code, extracted into
// kernel_body.inc by tests/cuda/emulate_logit_digest.sh) run on the CPU: a std::thread per CUDA
// thread (512 a block, one block at a time), a std::barrier for __syncthreads, per-warp exchange
// slots and a 32-thread barrier for every shuffle and ballot (a lane that skips one deadlocks, as a
// divergent *_sync would misbehave on the GPU), shared-memory integer atomics as std::atomic_ref.
// Each row's digest is compared with logit_digest_ref's: argmax, max, list, draw exact; lse and
// sum_t within 1e-12 relative. Rows: peaked with ties planted at the maximum, across rank 64 and
// at +-0; flat; all equal; five finite logits among -1e30. No GPU needed.
//   bash tests/cuda/emulate_logit_digest.sh [V [M]]   (default: V 1 .. 20000, 16 rows each; ~30 s)
#include <atomic>
#include <barrier>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>
#include <algorithm>
#include <cstdlib>
#include <memory>
#include "cuda/logit_digest.h"

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static

struct Dim { unsigned x = 0; };
thread_local Dim threadIdx, blockIdx;
static std::barrier<>* g_block;
static std::barrier<>* g_warp[16];
static uint64_t g_slot[16][32];
inline void __syncthreads() { g_block->arrive_and_wait(); }
inline int lane_() { return threadIdx.x & 31; }
template <typename T> T exch(T v, int src) {
  const int w = threadIdx.x >> 5;
  uint64_t b = 0; std::memcpy(&b, &v, sizeof(T));
  g_slot[w][lane_()] = b;
  g_warp[w]->arrive_and_wait();
  uint64_t o = g_slot[w][src];
  g_warp[w]->arrive_and_wait();
  T r; std::memcpy(&r, &o, sizeof(T));
  return r;
}
template <typename T> T __shfl_xor_sync(unsigned, T v, int o) { return exch(v, lane_() ^ o); }
template <typename T> T __shfl_up_sync(unsigned, T v, int o) { int s = lane_() - o; return exch(v, s < 0 ? lane_() : s); }
template <typename T> T __shfl_sync(unsigned, T v, int s) { return exch(v, s); }
inline unsigned __ballot_sync(unsigned, bool p) {
  const int w = threadIdx.x >> 5;
  g_slot[w][lane_()] = p;
  g_warp[w]->arrive_and_wait();
  unsigned m = 0;
  for (int i = 0; i < 32; ++i) m |= (g_slot[w][i] ? 1u : 0u) << i;
  g_warp[w]->arrive_and_wait();
  return m;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(unsigned x) { return __builtin_ffs(x); }
template <typename T> T __ldg(const T* p) { return *p; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
inline double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
using std::exp; using std::log;

namespace jtok::cuda {
#include "kernel_body.inc"

void emulate(LogitDigest* out, const float* logits, int64_t M, int64_t V, int64_t ld, const DigestRow* rows) {
  for (int64_t b = 0; b < M; ++b) {
    std::barrier<> blk(kThreads);
    g_block = &blk;
    std::vector<std::unique_ptr<std::barrier<>>> ws;
    for (int w = 0; w < kWarps; ++w) { ws.emplace_back(new std::barrier<>(32)); g_warp[w] = ws.back().get(); }
    std::vector<std::thread> th;
    for (int t = 0; t < kThreads; ++t)
      th.emplace_back([=] { threadIdx.x = t; blockIdx.x = b; logit_digest_kernel(out, logits, V, ld, rows); });
    for (auto& x : th) x.join();
  }
}
}  // namespace jtok::cuda

using namespace jtok::cuda;

std::vector<float> make_row(int kind, int64_t V, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<float> l(V);
  std::normal_distribution<float> n(0.f, 3.f);
  std::uniform_real_distribution<float> u(0.f, 0.01f);
  std::uniform_int_distribution<int64_t> id(0, V - 1);
  for (float& x : l) x = kind == 0 ? n(g) : kind == 1 ? u(g) : kind == 2 ? 0.5f : -1e30f;
  if (kind == 3) for (int k = 0; k < 5; ++k) l[id(g)] = float(k);
  if (kind == 0) {
    std::vector<float> s = l; std::sort(s.begin(), s.end(), std::greater<float>());
    const float at = s[std::min<int64_t>(V - 1, 62)];
    for (int k = 0; k < 3; ++k) l[id(g)] = s[0] + 1.f;
    for (int k = 0; k < 8; ++k) l[id(g)] = at;
    l[id(g)] = -0.0f; l[id(g)] = 0.0f;
  }
  return l;
}

int main(int argc, char** argv) {
  int bad = 0, checked = 0;
  std::vector<int64_t> Vs = {1, 2, 40, 63, 64, 65, 1000, 5003, 20000};
  if (argc > 1) Vs = {std::atoll(argv[1])};
  for (int64_t V : Vs) {
    const int64_t ld = V + 7, M = argc > 2 ? std::atoll(argv[2]) : 16;
    std::vector<float> L(M * ld, 7.f);
    std::vector<DigestRow> R;
    std::mt19937_64 g(V);
    const double temps[] = {0.0, 0.7, 1.0, 1.5};
    for (int64_t i = 0; i < M; ++i) {
      auto r = make_row(i % 4, V, 100 * V + i);
      std::copy(r.begin(), r.end(), L.begin() + i * ld);
      R.push_back({temps[(i / 4) % 4], std::generate_canonical<double, 53>(g)});
    }
    std::vector<LogitDigest> out(M);
    emulate(out.data(), L.data(), M, V, ld, R.data());
    for (int64_t i = 0; i < M; ++i) {
      const LogitDigest r = logit_digest_ref(L.data() + i * ld, V, R[i]);
      const LogitDigest& o = out[i];
      bool ok = o.argmax == r.argmax && o.max == r.max && o.n_top == r.n_top && o.drawn == r.drawn &&
                std::fabs(o.lse - r.lse) <= 1e-12 * std::max(1.0, std::fabs(r.lse)) &&
                std::fabs(o.sum_t - r.sum_t) <= 1e-12 * r.sum_t;
      if (R[i].temperature > 0) ok = ok && o.drawn_logit == r.drawn_logit;
      for (int k = 0; k < r.n_top; ++k) ok = ok && o.top_id[k] == r.top_id[k] && o.top_logit[k] == r.top_logit[k];
      ++checked;
      if (!ok) {
        ++bad;
        std::printf("MISMATCH V %ld row %ld T %g: argmax %d/%d max %g/%g n %d/%d drawn %d/%d lse %.17g/%.17g sum_t %.17g/%.17g top0 %d/%d\n",
                    V, i, R[i].temperature, o.argmax, r.argmax, o.max, r.max, o.n_top, r.n_top, o.drawn, r.drawn, o.lse, r.lse, o.sum_t, r.sum_t, o.top_id[0], r.top_id[0]);
        for (int k = 0; k < r.n_top; ++k) if (o.top_id[k] != r.top_id[k]) { std::printf("  rank %d: %d (%g) vs %d (%g)\n", k, o.top_id[k], o.top_logit[k], r.top_id[k], r.top_logit[k]); break; }
      }
    }
    std::printf("V %ld done\n", V); std::fflush(stdout);
  }
  std::printf("%d rows checked, %d mismatches\n", checked, bad);
  return bad != 0;
}
