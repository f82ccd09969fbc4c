// Int8 matrices dequantised on the GPU (src/cuda/q8_dequant.h, the GPU decoder's int8-only prefills)
// against the CPU's dequantize_rows (ops/lowp_convert.h, what the host's upload of an int8 export's
// copy runs): matrices of other widths back to back as one layer's runs, each matrix two runs of one
// width (as a layer's consecutive experts lie); rows read 4 bytes a thread and one at a time (an odd
// width, or a multiple of 4 starting off a 4-byte address); rows past 65,535 blocks (grid-stride).
// fp32 out: bit for bit the CPU's values; bf16: those rounded to nearest even. The gather (an
// int8_only decoder's embedding) likewise against the CPU's rows of the ids, repeated ids among them.
// `--gtest_filter='CudaQ8Dequant.*'`; a GPU host only (in test_cuda_ops).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cuda/q8_dequant.h"
#include "cuda_case.h"
#include "ops/lowp_convert.h"

namespace {

using namespace jtok::cuda_test;
using jtok::testing::randn;
using bf16 = __nv_bfloat16;

struct Matrix {
  int64_t rows, cols;
};

// The matrices quantised as the export does, back to back (values and scale rows), their CPU
// dequantisation, and the runs: two a matrix, its first half of rows and the rest.
struct Layer {
  std::vector<int8_t> q;
  std::vector<float> scale, want;
  std::vector<jtok::cuda::Q8Run> runs;
  int64_t rows = 0;
};

Layer make_layer(const std::vector<Matrix>& ms, uint64_t seed) {
  Layer L;
  for (const Matrix& m : ms) {
    const std::vector<float> w = randn(m.rows * m.cols, seed++, 0.2f);
    std::vector<int8_t> q(static_cast<size_t>(m.rows * m.cols));
    std::vector<float> scale(static_cast<size_t>(m.rows)), deq(w.size());
    jtok::quantize_int8_rows(q.data(), scale.data(), w.data(), m.rows, m.cols);
    jtok::dequantize_rows(deq.data(), {jtok::Dtype::int8, q.data(), scale.data(), m.rows, m.cols}, 0, m.rows);
    const int64_t half = m.rows / 2;  // two runs of one width: their rows continue each other
    L.runs.push_back({L.rows, half, m.cols, static_cast<int64_t>(L.q.size())});
    L.runs.push_back({L.rows + half, m.rows - half, m.cols, static_cast<int64_t>(L.q.size()) + half * m.cols});
    L.q.insert(L.q.end(), q.begin(), q.end());
    L.scale.insert(L.scale.end(), scale.begin(), scale.end());
    L.want.insert(L.want.end(), deq.begin(), deq.end());
    L.rows += m.rows;
  }
  return L;
}

template <typename E>
std::vector<float> dequantised_on_gpu(const Layer& L) {
  auto q = upload_exact(L.q);
  auto scale = upload_exact(L.scale);
  auto runs = upload_exact(L.runs);
  DeviceBuffer<E> out(L.want.size());
  jtok::cuda::dequantize_q8_rows<E>(out.get(), q.get(), scale.get(), runs.get(), static_cast<int64_t>(L.runs.size()),
                                    L.rows, nullptr);
  return download(out);
}

void expect_cpu_values(const std::vector<Matrix>& ms, uint64_t seed) {
  const Layer L = make_layer(ms, seed);
  const std::vector<float> f32 = dequantised_on_gpu<float>(L), b16 = dequantised_on_gpu<bf16>(L);
  ASSERT_EQ(f32.size(), L.want.size());
  EXPECT_EQ(0, std::memcmp(f32.data(), L.want.data(), f32.size() * sizeof(float))) << "fp32: not the CPU's values";
  const std::vector<float> rounded = to_dtype(L.want, DType::bf16);
  EXPECT_EQ(0, std::memcmp(b16.data(), rounded.data(), b16.size() * sizeof(float)))
      << "bf16: not the CPU's values rounded";
}

TEST(CudaQ8Dequant, RowsAreTheCpusDequantisedRows) {
  expect_cpu_values({{96, 64}, {64, 48}, {37, 300}}, 11);  // q | k | v, o, an odd width
  expect_cpu_values({{5, 1}, {3, 257}}, 12);
  expect_cpu_values({{1, 3}, {4, 64}, {6, 8}}, 14);  // widths of 4 values starting off a 4-byte address
}

TEST(CudaQ8Dequant, MoreRowsThanBlocks) { expect_cpu_values({{70000, 3}}, 13); }

template <typename E>
std::vector<float> gathered_on_gpu(const Layer& L, const std::vector<int32_t>& ids, int64_t C) {
  auto q = upload_exact(L.q);
  auto scale = upload_exact(L.scale);
  auto d_ids = upload_exact(ids);
  const int64_t N = static_cast<int64_t>(ids.size());
  DeviceBuffer<E> out(N * C);
  jtok::cuda::gather_q8_rows<E>(out.get(), d_ids.get(), q.get(), scale.get(), N, C, nullptr);
  return download(out);
}

// A (V, C) matrix's rows at N ids (every third id repeated, the last row among them).
void expect_gathered_rows(int64_t V, int64_t C, int64_t N, uint64_t seed) {
  const Layer L = make_layer({{V, C}}, seed);
  std::vector<int32_t> ids(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) ids[n] = static_cast<int32_t>(n % 3 == 2 ? ids[n - 1] : (n * 7919 + 5) % V);
  ids.back() = static_cast<int32_t>(V - 1);
  std::vector<float> want(static_cast<size_t>(N * C));
  for (int64_t n = 0; n < N; ++n)
    std::memcpy(want.data() + n * C, L.want.data() + ids[n] * C, sizeof(float) * static_cast<size_t>(C));
  const std::vector<float> f32 = gathered_on_gpu<float>(L, ids, C), b16 = gathered_on_gpu<bf16>(L, ids, C);
  ASSERT_EQ(f32.size(), want.size());
  EXPECT_EQ(0, std::memcmp(f32.data(), want.data(), f32.size() * sizeof(float))) << "fp32: not the CPU's rows";
  const std::vector<float> rounded = to_dtype(want, DType::bf16);
  EXPECT_EQ(0, std::memcmp(b16.data(), rounded.data(), b16.size() * sizeof(float)))
      << "bf16: not the CPU's rows rounded";
}

TEST(CudaQ8Dequant, GatheredRowsAreTheCpusRows) {
  expect_gathered_rows(50, 64, 37, 21);   // 4 bytes a thread
  expect_gathered_rows(40, 299, 11, 22);  // an odd width: one at a time
  expect_gathered_rows(9, 2, 70000, 23);  // more ids than blocks
}

}  // namespace
