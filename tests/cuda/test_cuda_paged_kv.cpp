// The paged KV cache's kernels (src/cuda/paged_kv.h) against the CPU engine's decode attention
// (ops/attention.h attention_decode / attention_decode_bf16 on each sequence's contiguous cache)
// and RoPE (ops/rope.h at each row's position), through tests/cuda/cuda_case.h.
// Six sequences of 1, 15, 16, 17, 300 and 600 positions (across the 16-position pages and the
// kernels' 256-position chunks) on shuffled, non-contiguous pages of an 80-page pool, in table rows
// that are not their order; every position of every sequence is a row (a prefill of each: row r
// attends to 0..pos[r]), with q, k, v inside fused qkv rows (stride (H+2KV)*hd).
// Tolerances by normalised error ||gpu - cpu|| / ||cpu||:
//   fp32 1e-5: the same sums in another order (chunks of 256 combined), the GPU's expf against the CPU's.
//   bf16 1e-2: inputs bf16 on both sides; the GPU's output rounded to bf16 (2^-9 relative).
// paged_qkv (the q | k | v rows' per-head norm, RoPE at each row's position and the append) against
// the CPU's RMSNorm and RoPE, and against the unfused kernels bit for bit; the pools it writes and the
// unwritten slots bit for bit; batch invariance and determinism by bits.
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <string>

#include "cuda/paged_kv.h"
#include "cuda/rmsnorm.h"
#include "cuda/rope.h"
#include "cuda_case.h"
#include "ops/attention.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"

namespace {

using namespace jtok::cuda_test;
using jtok::testing::randn;
using bf16 = __nv_bfloat16;

struct PagedShape {
  int64_t H, KV, hd;
};
std::string describe(const PagedShape& s) {
  return "H " + std::to_string(s.H) + " KV " + std::to_string(s.KV) + " hd " + std::to_string(s.hd);
}

constexpr int64_t kPageTokens = 16, kPages = 80, kMaxPages = 40, kTableRows = 8, kMaxLen = 600;
const std::vector<int64_t> kLens{1, 15, 16, 17, 300, 600};
const std::vector<int32_t> kTableRowOf{5, 0, 7, 2, 3, 6};  // sequence i's row of the page tables
const std::vector<int> kSeqOrder{3, 0, 5, 1, 4, 2};         // the order of the sequences' rows in a step

// One step's inputs: rows (seq, pos), fused qkv rows, page tables.
struct PagedInputs {
  PagedShape s;
  int64_t W = 0, R = 0;              // fused row width (H+2KV)*hd; rows
  std::vector<int32_t> row_seq, pos;  // (R): table row, position
  std::vector<int> seq_of;            // (R): sequence index
  std::vector<int32_t> tables;        // (kTableRows, kMaxPages) page ids, -1 where unused
  std::vector<float> qkv;             // (R, W)
};

std::shared_ptr<const PagedInputs> make_inputs(const PagedShape& s, uint64_t seed) {
  auto in = std::make_shared<PagedInputs>();
  in->s = s;
  in->W = (s.H + 2 * s.KV) * s.hd;
  std::vector<int32_t> ids(kPages);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(seed));
  in->tables.assign(kTableRows * kMaxPages, -1);
  size_t next = 0;
  for (size_t i = 0; i < kLens.size(); ++i)
    for (int64_t p = 0; p < (kLens[i] + kPageTokens - 1) / kPageTokens; ++p)
      in->tables[kTableRowOf[i] * kMaxPages + p] = ids[next++];
  for (int i : kSeqOrder)
    for (int64_t p = 0; p < kLens[i]; ++p) {
      in->row_seq.push_back(kTableRowOf[i]);
      in->pos.push_back(static_cast<int32_t>(p));
      in->seq_of.push_back(i);
    }
  in->R = static_cast<int64_t>(in->pos.size());
  in->qkv = randn(static_cast<size_t>(in->R * in->W), seed + 1);
  return in;
}

// Sequence i's keys (kv_off = H*hd) or values as a contiguous (len, KV, hd) cache.
std::vector<float> seq_cache(const PagedInputs& in, const std::vector<float>& qkv, int i, int64_t kv_off) {
  const int64_t kvd = in.s.KV * in.s.hd;
  std::vector<float> c(static_cast<size_t>(kLens[i] * kvd));
  for (int64_t r = 0; r < in.R; ++r)
    if (in.seq_of[r] == i) std::copy_n(qkv.begin() + r * in.W + kv_off, kvd, c.begin() + in.pos[r] * kvd);
  return c;
}

std::vector<uint16_t> bf16_bits(const std::vector<float>& x) {
  std::vector<uint16_t> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = f32_to_bf16_bits(x[i]);
  return b;
}

// The CPU twin: each row's q against its sequence's contiguous cache. q_t is E's precision, kv_t the
// pages' (k and v pass through E first).
Outputs cpu_paged(const PagedInputs& in, DType q_t, DType kv_t) {
  const auto [H, KV, hd] = in.s;
  const bool kv_bf16 = q_t == DType::bf16 || kv_t == DType::bf16;
  const auto qkv = to_dtype(in.qkv, q_t);
  std::vector<float> out(static_cast<size_t>(in.R * H * hd)), scratch(static_cast<size_t>(H * kMaxLen));
  for (int i = 0; i < static_cast<int>(kLens.size()); ++i) {
    const auto k = to_dtype(seq_cache(in, qkv, i, H * hd), kv_bf16 ? DType::bf16 : DType::f32);
    const auto v = to_dtype(seq_cache(in, qkv, i, (H + KV) * hd), kv_bf16 ? DType::bf16 : DType::f32);
    const auto kb = bf16_bits(k), vb = bf16_bits(v);
    for (int64_t r = 0; r < in.R; ++r) {
      if (in.seq_of[r] != i) continue;
      float* o = out.data() + r * H * hd;
      const float* q = qkv.data() + r * in.W;
      if (kv_t == DType::bf16)
        jtok::attention_decode_bf16(o, q, kb.data(), vb.data(), in.pos[r], H, KV, hd, scratch.data());
      else
        jtok::attention_decode(o, q, k.data(), v.data(), in.pos[r], H, KV, hd, scratch.data());
    }
  }
  return {{"out", out}};
}

template <typename T>
void poison(DeviceBuffer<T>& d) {
  JTOK_CUDA_CHECK(cudaMemset(d.get(), 0xff, d.n * sizeof(T)));
}

// The device side of one step: pools (poisoned), tables, rows, the fused qkv rows.
template <typename E, typename KvT>
struct DeviceStep {
  const PagedInputs& in;
  DeviceBuffer<E> qkv;
  DeviceBuffer<KvT> k_pool, v_pool;
  DeviceBuffer<int32_t> tables, row_seq, pos;
  explicit DeviceStep(const PagedInputs& i)
      : in(i), qkv(upload<E>(i.qkv)), k_pool(pool_size(i)), v_pool(pool_size(i)), tables(upload_exact(i.tables)),
        row_seq(upload_exact(i.row_seq)), pos(upload_exact(i.pos)) {
    poison(k_pool);
    poison(v_pool);
  }
  static size_t pool_size(const PagedInputs& i) { return static_cast<size_t>(kPages * kPageTokens * i.s.KV * i.s.hd); }
  jtok::cuda::PagedKv kv() const { return {k_pool.get(), v_pool.get(), kPageTokens, in.s.KV, in.s.hd}; }
  jtok::cuda::PagedRows rows() const { return {row_seq.get(), pos.get(), tables.get(), kMaxPages, in.R}; }
  // k and v into the pages as they are: paged_qkv with no norm and the identity rotation (cos 1,
  // sin 0: x * 1 - y * 0 is x for every finite non-zero x).
  void append() {
    const int64_t half = in.s.hd / 2;
    DeviceBuffer<E> q(static_cast<size_t>(in.R * in.s.H * in.s.hd)), k(static_cast<size_t>(in.R * in.s.KV * in.s.hd)),
        v(k.n);
    auto cos = upload<float>(std::vector<float>(static_cast<size_t>(kMaxLen * half), 1.0f));
    auto sin = upload<float>(std::vector<float>(static_cast<size_t>(kMaxLen * half), 0.0f));
    const jtok::cuda::QkvRows<E> rows_in{qkv.get(), in.W, in.s.H, nullptr, nullptr, 0.0f, cos.get(), sin.get()};
    jtok::cuda::paged_qkv<E, KvT>({q.get(), k.get(), v.get()}, rows_in, kv(), rows(), nullptr);
    JTOK_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // out (r.R, H, hd) for rows r (q rows of stride W), max_len positions at most; a scratch of
  // scratch_rows rows (0: all of them).
  std::vector<float> attend(const jtok::cuda::PagedRows& r, int64_t max_len, const E* q, int64_t scratch_rows = 0) {
    DeviceBuffer<E> out(static_cast<size_t>(r.R * in.s.H * in.s.hd));
    const int64_t rows = scratch_rows > 0 ? scratch_rows : r.R;
    DeviceBuffer<float> scratch(
        static_cast<size_t>(jtok::cuda::paged_attention_scratch(rows, in.s.H, in.s.hd, max_len)));
    DeviceBuffer<int32_t> counters(static_cast<size_t>(r.R * in.s.H));
    poison(out);
    poison(scratch);
    JTOK_CUDA_CHECK(cudaMemset(counters.get(), 0, counters.n * sizeof(int32_t)));
    jtok::cuda::paged_attention<E, KvT>(out.get(), q, in.W, kv(), r, in.s.H, max_len,
                                        {scratch.get(), static_cast<int64_t>(scratch.n)}, counters.get(), nullptr);
    EXPECT_EQ(download_exact(counters), std::vector<int32_t>(counters.n, 0)) << "counters left non-zero";
    return download(out);
  }
};

template <typename E, typename KvT>
Outputs gpu_paged(const PagedInputs& in) {
  DeviceStep<E, KvT> d(in);
  d.append();
  return {{"out", d.attend(d.rows(), kMaxLen, d.qkv.get())}};
}

CudaCase paged_case(const PagedShape& s) {
  const auto in = make_inputs(s, 300 + static_cast<uint64_t>(s.H * 7 + s.KV * 3 + s.hd));
  CudaCase c{"paged attention", describe(s), {1e-5, 1e-2}};
  c.cpu = [in](DType t) { return cpu_paged(*in, t, t); };
  c.gpu = [in](DType t) { return by_dtype(t, [&](auto e) { return gpu_paged<decltype(e), decltype(e)>(*in); }); };
  return c;
}

class CudaPagedAttention : public ::testing::TestWithParam<PagedShape> {};

TEST_P(CudaPagedAttention, MatchesCpuDecodeAttention) { run_case(paged_case(GetParam())); }

// GQA (2 query heads a kv head), MHA, and 6 query heads on one kv head (two passes of the kernel's
// 4-head batches, the second partial; more heads than warps in the softmax).
std::vector<PagedShape> paged_shapes() {
  std::vector<PagedShape> shapes;
  for (int64_t hd : {32, 64, 128})
    for (int64_t kv : {2, 4}) shapes.push_back({4, kv, hd});
  shapes.push_back({6, 1, 64});
  shapes.push_back({6, 1, 128});
  return shapes;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaPagedAttention, ::testing::ValuesIn(paged_shapes()),
                         [](const ::testing::TestParamInfo<PagedShape>& i) {
                           std::string name = "H";  // appended: GCC 12's -Wrestrict misfires on "H" + ...
                           name += std::to_string(i.param.H) + "_KV" + std::to_string(i.param.KV);
                           name += "_hd" + std::to_string(i.param.hd);
                           return name;
                         });

void expect_within(const char* what, const std::vector<float>& got, const std::vector<float>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_TRUE(std::isfinite(got[i])) << what << " element " << i;
  const double err = jtok::testing::rel_err(got, want);
  std::printf("cuda case %-40s err %.3e (tol %.1e)\n", what, err, tol);
  EXPECT_LE(err, tol) << what;
}

// fp32 activations over bf16 pages, and bf16 activations over fp32 pages.
TEST(CudaPagedKv, MixedPageTypesMatchCpu) {
  for (const PagedShape& s : {PagedShape{4, 2, 64}, PagedShape{4, 4, 128}}) {
    const auto in = make_inputs(s, 41);
    const std::string what = describe(s);
    expect_within(("fp32 q, bf16 pages " + what).c_str(), gpu_paged<float, bf16>(*in)[0].second,
                  cpu_paged(*in, DType::f32, DType::bf16)[0].second, 1e-5);
    expect_within(("bf16 q, fp32 pages " + what).c_str(), gpu_paged<bf16, float>(*in)[0].second,
                  cpu_paged(*in, DType::bf16, DType::f32)[0].second, 1e-2);
  }
}

// Device KvT array -> each element's bits widened to 32.
template <typename KvT>
std::vector<uint32_t> pool_bits(const DeviceBuffer<KvT>& d) {
  std::vector<KvT> h(d.n);
  JTOK_CUDA_CHECK(cudaDeviceSynchronize());
  JTOK_CUDA_CHECK(cudaMemcpy(h.data(), d.get(), d.n * sizeof(KvT), cudaMemcpyDeviceToHost));
  std::vector<uint32_t> bits(d.n);
  for (size_t i = 0; i < d.n; ++i) {
    if constexpr (sizeof(KvT) == 4) std::memcpy(&bits[i], &h[i], 4);
    else {
      uint16_t b;
      std::memcpy(&b, &h[i], 2);
      bits[i] = b;
    }
  }
  return bits;
}

// The pool paged_qkv's append should leave: poison everywhere, each row's k (or v) in its page slot, as KvT's
// bits of E's value (bf16 pages: rounded to nearest even).
template <typename E, typename KvT>
std::vector<uint32_t> expected_pool(const PagedInputs& in, int64_t kv_off) {
  const int64_t kvd = in.s.KV * in.s.hd;
  const uint32_t poison_bits = sizeof(KvT) == 4 ? 0xffffffffu : 0xffffu;
  std::vector<uint32_t> pool(static_cast<size_t>(kPages * kPageTokens * kvd), poison_bits);
  const auto qkv = to_dtype(in.qkv, sizeof(E) == 4 ? DType::f32 : DType::bf16);
  for (int64_t r = 0; r < in.R; ++r) {
    const int32_t page = in.tables[in.row_seq[r] * kMaxPages + in.pos[r] / kPageTokens];
    const int64_t at = (static_cast<int64_t>(page) * kPageTokens + in.pos[r] % kPageTokens) * kvd;
    for (int64_t j = 0; j < kvd; ++j) {
      const float x = qkv[r * in.W + kv_off + j];
      if constexpr (sizeof(KvT) == 4) std::memcpy(&pool[at + j], &x, 4);
      else pool[at + j] = f32_to_bf16_bits(x);
    }
  }
  return pool;
}

// Ties for bf16 rounding among the keys: 1 + 2^-8 (even: down to 1) and 1 + 3 * 2^-8 (even: up).
std::shared_ptr<const PagedInputs> with_ties(std::shared_ptr<const PagedInputs> in) {
  auto t = std::make_shared<PagedInputs>(*in);
  const int64_t k0 = t->s.H * t->s.hd;
  for (int64_t r = 0; r < t->R; r += 7) {
    t->qkv[r * t->W + k0] = 1.0f + 0.00390625f;
    t->qkv[r * t->W + k0 + 1] = -(1.0f + 3 * 0.00390625f);
  }
  return t;
}

// Equal bit for bit; else the count of differing elements and the first one.
void expect_same_bits(const std::vector<uint32_t>& got, const std::vector<uint32_t>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = got.size(); i-- > 0;)
    if (got[i] != want[i]) ++bad, first = i;
  EXPECT_EQ(bad, 0u) << what << ": first at element " << first << ": 0x" << std::hex << got[first] << ", want 0x"
                     << want[first];
}

template <typename E, typename KvT>
void check_append(const PagedInputs& in, const char* what) {
  SCOPED_TRACE(what);
  DeviceStep<E, KvT> d(in);
  d.append();
  const int64_t H = in.s.H, KV = in.s.KV, hd = in.s.hd;
  expect_same_bits(pool_bits(d.k_pool), expected_pool<E, KvT>(in, H * hd), "K pool");
  expect_same_bits(pool_bits(d.v_pool), expected_pool<E, KvT>(in, (H + KV) * hd), "V pool");
}

// paged_qkv's append: every position's k and v in its page slot bit for bit, nothing else written.
TEST(CudaPagedKv, AppendRoundTrip) {
  const auto in = with_ties(make_inputs({4, 2, 32}, 51));
  check_append<float, float>(*in, "fp32 -> fp32 pages");
  check_append<float, bf16>(*in, "fp32 -> bf16 pages");
  check_append<bf16, float>(*in, "bf16 -> fp32 pages");
  check_append<bf16, bf16>(*in, "bf16 -> bf16 pages");
  ASSERT_EQ(f32_to_bf16_bits(1.0f + 0.00390625f), 0x3f80);  // the ties' expected rounding
  ASSERT_EQ(f32_to_bf16_bits(-(1.0f + 3 * 0.00390625f)), 0xbf82);
}

// The CPU side of paged_qkv on rows [0, R) of `in`: q, k heads through the per-head RMSNorm (gains:
// null, none) rounded to t, then RoPE at each row's position; q (R, H hd), k, v (R, KV hd) packed.
Outputs cpu_ready_qkv(const PagedInputs& in, int64_t R, const std::vector<float>* gains, const jtok::RopeTable& tab,
                      DType t) {
  const auto [H, KV, hd] = in.s;
  const auto x = to_dtype(in.qkv, t);
  std::vector<float> q, k, v, rstd(static_cast<size_t>(H));
  for (int64_t r = 0; r < R; ++r) {
    std::vector<float> qr(x.begin() + r * in.W, x.begin() + r * in.W + H * hd);
    std::vector<float> kr(x.begin() + r * in.W + H * hd, x.begin() + r * in.W + (H + KV) * hd);
    if (gains) {
      jtok::rmsnorm_forward(qr.data(), rstd.data(), qr.data(), gains->data(), H, hd, 1e-6f);
      jtok::rmsnorm_forward(kr.data(), rstd.data(), kr.data(), gains->data() + hd, KV, hd, 1e-6f);
      qr = to_dtype(qr, t), kr = to_dtype(kr, t);
    }
    jtok::rope_forward(qr.data(), tab, 1, 1, H, hd, in.pos[r]);
    jtok::rope_forward(kr.data(), tab, 1, 1, KV, hd, in.pos[r]);
    q.insert(q.end(), qr.begin(), qr.end());
    k.insert(k.end(), kr.begin(), kr.end());
    v.insert(v.end(), x.begin() + r * in.W + (H + KV) * hd, x.begin() + (r + 1) * in.W);
  }
  return {{"q", q}, {"k", k}, {"v", v}};
}

// paged_qkv on rows [0, R) of d's step: q, k, v, and the pages' k and v gathered back by each row's
// slot (KvT = E: the pool holds k and v's own bits).
template <typename E>
Outputs gpu_ready_qkv(DeviceStep<E, E>& d, int64_t R, const std::vector<float>* gains, const jtok::RopeTable& tab) {
  const auto [H, KV, hd] = d.in.s;
  const int64_t kvd = KV * hd;
  DeviceBuffer<E> q(static_cast<size_t>(R * H * hd)), k(static_cast<size_t>(R * kvd)), v(k.n);
  auto g = upload<E>(gains ? *gains : std::vector<float>(static_cast<size_t>(2 * hd)));
  auto cos = upload<float>(tab.cos), sin = upload<float>(tab.sin);
  const E* gq = gains ? g.get() : nullptr;
  const E* gk = gains ? g.get() + hd : nullptr;
  jtok::cuda::PagedRows rows = d.rows();
  rows.R = R;
  const jtok::cuda::QkvRows<E> in{d.qkv.get(), d.in.W, H, gq, gk, 1e-6f, cos.get(), sin.get()};
  jtok::cuda::paged_qkv<E, E>({q.get(), k.get(), v.get()}, in, d.kv(), rows, nullptr);
  const auto pool_k = download(d.k_pool), pool_v = download(d.v_pool);
  std::vector<float> pk, pv;
  for (int64_t r = 0; r < R; ++r) {
    const int32_t page = d.in.tables[d.in.row_seq[r] * kMaxPages + d.in.pos[r] / kPageTokens];
    const int64_t at = (static_cast<int64_t>(page) * kPageTokens + d.in.pos[r] % kPageTokens) * kvd;
    pk.insert(pk.end(), pool_k.begin() + at, pool_k.begin() + at + kvd);
    pv.insert(pv.end(), pool_v.begin() + at, pool_v.begin() + at + kvd);
  }
  return {{"q", download(q)}, {"k", download(k)}, {"v", download(v)}, {"k pages", pk}, {"v pages", pv}};
}

// paged_qkv against the CPU's per-head RMSNorm and RoPE at each row's position (with and without the
// norm; GQA at hd 64, MHA at hd 32); the pages hold what k and v hold.
TEST(CudaPagedKv, ReadyQkvMatchesCpu) {
  for (const PagedShape& s : {PagedShape{4, 2, 64}, PagedShape{2, 2, 32}})
    for (const bool norm : {false, true}) {
      const auto in = make_inputs(s, 61);
      const auto gains = std::make_shared<std::vector<float>>(randn(static_cast<size_t>(2 * s.hd), 62));
      const std::vector<float>* g = norm ? gains.get() : nullptr;
      const jtok::RopeTable tab = jtok::make_rope_table(kMaxLen, s.hd, 10000.0);
      CudaCase c{"ready qkv", "R " + std::to_string(in->R) + ", " + describe(s) + (norm ? ", qk norm" : ""),
                 {1e-6, 1e-2}};
      c.cpu = [&](DType t) {
        Outputs o = cpu_ready_qkv(*in, in->R, g, tab, t);
        o.push_back({"k pages", o[1].second});
        o.push_back({"v pages", o[2].second});
        return o;
      };
      c.gpu = [&](DType t) {
        return by_dtype(t, [&]<typename E>(E) {
          DeviceStep<E, E> d(*in);
          return gpu_ready_qkv(d, in->R, g, tab);
        });
      };
      run_case(c);
    }
}

// paged_qkv's q and k bits are rmsnorm_forward's over the heads, then rope_forward's at the row's
// position: the kernels the trainer runs, one after another (fp32 and bf16; 40 rows).
template <typename E>
void expect_ready_qkv_bits_of_unfused() {
  const PagedShape s{4, 2, 64};
  const auto in = make_inputs(s, 81);
  const int64_t R = 40, hd = s.hd, heads = s.H + s.KV;
  const std::vector<float> gains = randn(static_cast<size_t>(2 * hd), 82);
  const jtok::RopeTable tab = jtok::make_rope_table(kMaxLen, hd, 10000.0);
  DeviceStep<E, E> d(*in);
  const Outputs fused = gpu_ready_qkv(d, R, &gains, tab);
  auto g = upload<E>(gains);
  auto cos = upload<float>(tab.cos), sin = upload<float>(tab.sin);
  DeviceBuffer<E> x(static_cast<size_t>(heads * hd));
  DeviceBuffer<float> rstd(static_cast<size_t>(heads));
  std::vector<float> q, k;
  for (int64_t r = 0; r < R; ++r) {  // row r's q and k heads, normed then rotated in place
    const E* row = d.qkv.get() + r * in->W;
    jtok::cuda::rmsnorm_forward<E>(x.get(), rstd.get(), row, g.get(), s.H, hd, 1e-6f, nullptr);
    jtok::cuda::rmsnorm_forward<E>(x.get() + s.H * hd, rstd.get(), row + s.H * hd, g.get() + hd, s.KV, hd, 1e-6f,
                                   nullptr);
    jtok::cuda::rope_forward<E>(x.get(), cos.get(), sin.get(), 1, 1, heads, hd, heads * hd, in->pos[r], nullptr);
    const std::vector<float> h = download(x);
    q.insert(q.end(), h.begin(), h.begin() + s.H * hd);
    k.insert(k.end(), h.begin() + s.H * hd, h.end());
  }
  EXPECT_EQ(0, std::memcmp(fused[0].second.data(), q.data(), q.size() * sizeof(float))) << "q";
  EXPECT_EQ(0, std::memcmp(fused[1].second.data(), k.data(), k.size() * sizeof(float))) << "k";
}

TEST(CudaPagedKv, ReadyQkvBitsAreTheUnfusedKernels) {
  expect_ready_qkv_bits_of_unfused<float>();
  expect_ready_qkv_bits_of_unfused<bf16>();
}

// Rows i of a step given as a step of their own (device row arrays of those rows only).
template <typename E, typename KvT>
std::vector<float> attend_rows(DeviceStep<E, KvT>& d, const std::vector<int64_t>& which, int64_t max_len) {
  std::vector<int32_t> seq, pos;
  for (int64_t i : which) {
    seq.push_back(d.in.row_seq[i]);
    pos.push_back(d.in.pos[i]);
  }
  // q rows gathered the same way (the kernel reads q by row index)
  std::vector<float> q;
  for (int64_t i : which) q.insert(q.end(), d.in.qkv.begin() + i * d.in.W, d.in.qkv.begin() + (i + 1) * d.in.W);
  auto dq = upload<E>(q);
  auto dseq = upload_exact(seq), dpos = upload_exact(pos);
  const jtok::cuda::PagedRows rows{dseq.get(), dpos.get(), d.tables.get(), kMaxPages, static_cast<int64_t>(which.size())};
  return d.attend(rows, max_len, dq.get());
}

// A row's bits are the same alone (with max_len its own length), inside the whole step, and inside a
// step of the sequences' last positions (a decode step); rows past max_len come out NaN.
template <typename E, typename KvT>
void check_batch_invariance() {
  const auto in = make_inputs({4, 2, 64}, 71);
  DeviceStep<E, KvT> d(*in);
  d.append();
  const int64_t hd = in->s.hd, ow = in->s.H * hd;
  const std::vector<float> all = d.attend(d.rows(), kMaxLen, d.qkv.get());
  std::vector<int64_t> last;  // the last row of each sequence, 599 the longest
  for (int64_t r = 0; r < in->R; ++r)
    if (r + 1 == in->R || in->seq_of[r + 1] != in->seq_of[r]) last.push_back(r);
  const std::vector<float> decode = attend_rows(d, last, kMaxLen);
  for (size_t i = 0; i < last.size(); ++i) {
    const int64_t r = last[i];
    const std::vector<float> alone = attend_rows(d, {r}, in->pos[r] + 1);
    EXPECT_EQ(0, std::memcmp(alone.data(), all.data() + r * ow, ow * sizeof(float))) << "row " << r << " alone";
    EXPECT_EQ(0, std::memcmp(decode.data() + i * ow, all.data() + r * ow, ow * sizeof(float))) << "row " << r;
  }
  // A scratch for 1 or 3 rows: the step's rows in groups of launches, the same bits.
  for (int64_t rows : {1, 3}) {
    const std::vector<float> grouped = d.attend(d.rows(), kMaxLen, d.qkv.get(), rows);
    EXPECT_EQ(0, std::memcmp(grouped.data(), all.data(), all.size() * sizeof(float))) << rows << " rows a launch";
  }
  const std::vector<float> short_len = d.attend(d.rows(), 300, d.qkv.get());  // two chunks at most
  for (int64_t r = 0; r < in->R; ++r) {
    if (in->pos[r] < 300)
      ASSERT_EQ(0, std::memcmp(short_len.data() + r * ow, all.data() + r * ow, ow * sizeof(float))) << "row " << r;
    else
      for (int64_t j = 0; j < ow; ++j) ASSERT_TRUE(std::isnan(short_len[r * ow + j])) << "row " << r << " past max_len";
  }
}

TEST(CudaPagedKv, RowsAreBatchInvariant) {
  check_batch_invariance<float, float>();
  check_batch_invariance<bf16, bf16>();
}

TEST(CudaPagedKv, TwoRunsAreBitwiseEqual) {
  const CudaCase c = paged_case({4, 1, 128});
  expect_deterministic(c, DType::f32);
  expect_deterministic(c, DType::bf16);
}

// Head dims other than 32, 64, 128, KV not dividing H, short q rows: refused by value before any
// launch (null pointers are never touched).
TEST(CudaPagedKv, RefusesUnsupportedShapes) {
  const jtok::cuda::PagedRows rows{nullptr, nullptr, nullptr, 4, 1};
  for (int64_t hd : {16, 48, 96, 256}) {
    const jtok::cuda::PagedKv kv{nullptr, nullptr, 16, 2, hd};
    try {
      jtok::cuda::paged_attention<float, float>(nullptr, nullptr, 4 * hd, kv, rows, 4, 64, {}, nullptr, nullptr);
      ADD_FAILURE() << "head dim " << hd << " was accepted";
    } catch (const jtok::Error& e) {
      EXPECT_NE(std::string(e.what()).find("head dim " + std::to_string(hd)), std::string::npos) << e.what();
    }
  }
  // q_stride, kv, H, max_len -> whether paged_attention refuses them
  const auto refused = [&](int64_t q_stride, const jtok::cuda::PagedKv& kv, int64_t H, int64_t max_len) {
    try {
      jtok::cuda::paged_attention<bf16, bf16>(nullptr, nullptr, q_stride, kv, rows, H, max_len, {}, nullptr, nullptr);
    } catch (const jtok::Error& e) {
      std::printf("refused: %s\n", e.what());
      return true;
    }
    return false;
  };
  EXPECT_TRUE(refused(256, {nullptr, nullptr, 16, 3, 64}, 4, 64));  // KV 3 does not divide H 4
  EXPECT_TRUE(refused(255, {nullptr, nullptr, 16, 2, 64}, 4, 64));  // q rows shorter than H*hd
  EXPECT_TRUE(refused(256, {nullptr, nullptr, 16, 2, 64}, 4, 0));   // max_len 0
  EXPECT_TRUE(refused(256, {nullptr, nullptr, 0, 2, 64}, 4, 64));   // empty pages
  // A scratch one float short of a row (4 heads, one chunk, 64 + 2 floats each): refused by value.
  const int64_t row = jtok::cuda::paged_attention_scratch(1, 4, 64, 64);
  ASSERT_EQ(row, 4 * 66);
  try {
    jtok::cuda::paged_attention<bf16, bf16>(nullptr, nullptr, 256, {nullptr, nullptr, 16, 2, 64}, rows, 4, 64,
                                            {nullptr, row - 1}, nullptr, nullptr);
    ADD_FAILURE() << "a scratch of no row was accepted";
  } catch (const jtok::Error& e) {
    EXPECT_NE(std::string(e.what()).find("a scratch of 263 floats holds no row (264 floats a row"), std::string::npos)
        << e.what();
  }
}

}  // namespace
