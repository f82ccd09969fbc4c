// StepRows' staged path (src/cuda/step_rows.h, issue 40): the host's gathers are host functions on
// the rows' side stream, so request() only queues. Requests back to back, with no host sync between
// them (the ring of host states reused) and device work reading each request's rows after its
// waits, give the CPU gather's rows and the in-place and hbm paths' bits; a gather that throws, or a
// disk store's failed read, is a jtok::Error from check_error() after the consumer's sync, naming
// the layer and table, once; the failed request's rows are zeros from the failing layer on (later
// layers not gathered); the next request works.
// Part of test_cuda_ops.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "error_test_util.h"
#include "cuda/step_rows.h"
#include "cuda_case.h"
#include "model/token_table.h"

namespace {

using namespace jtok::cuda_test;
using jtok::Dtype;
using jtok::TokenTable;
using jtok::testing::expect_error;
using jtok::cuda::LayerTables;
using jtok::cuda::RowPath;
using jtok::cuda::StepRows;
using bf16 = __nv_bfloat16;
using Bytes = std::vector<uint8_t>;

constexpr int64_t kV = 997, kD = 64, kMaxN = 600;

TokenTable random_table(Dtype dt, uint64_t seed) {
  TokenTable f32 = TokenTable::in_ram(kV, kD, jtok::testing::randn(static_cast<size_t>(kV * kD), seed));
  return dt == Dtype::f32 ? f32 : jtok::quantize_table(f32, dt);
}

int64_t count_unique(const std::vector<int32_t>& ids) {
  return static_cast<int64_t>(jtok::dedup_ids(ids.data(), static_cast<int64_t>(ids.size()), kV).unique.size());
}

// The bytes a T buffer of t's rows of the sorted unique ids holds (the CPU's gather; bf16 rounded).
template <typename T>
Bytes cpu_bytes(const TokenTable& t, const std::vector<int32_t>& ids) {
  const jtok::RowBatch rb = jtok::dedup_ids(ids.data(), static_cast<int64_t>(ids.size()), kV);
  std::vector<float> rows(rb.unique.size() * static_cast<size_t>(kD));
  jtok::gather_unique_rows(rows.data(), t, rb);
  Bytes b(rows.size() * sizeof(T));
  for (size_t i = 0; i < rows.size(); ++i) {
    if constexpr (sizeof(T) == 4) {
      std::memcpy(b.data() + 4 * i, &rows[i], 4);
    } else {
      const uint16_t bits = f32_to_bf16_bits(rows[i]);
      std::memcpy(b.data() + 2 * i, &bits, 2);
    }
  }
  return b;
}

// Every request of `steps` queued on `consumer` back to back, no host sync between them: the
// request, then per layer its wait and a device copy of each table's U rows (device work reading
// them after the wait, before the next request's gathers may overwrite them). One sync at the end,
// then per step, per (layer, table) in order, the rows' bytes. Buffers are made before the first
// request (cudaMalloc may synchronise).
template <typename T>
std::vector<std::vector<Bytes>> run_back_to_back(StepRows<T>& step, const std::vector<std::vector<int32_t>>& steps,
                                                 cudaStream_t consumer) {
  const std::vector<LayerTables>& layers = step.layers();
  std::vector<std::unique_ptr<DeviceBuffer<T>>> copies;
  for (size_t s = 0; s < steps.size(); ++s)
    for (const LayerTables& lt : layers)
      for (size_t i = 0; i < lt.tables.size(); ++i) copies.push_back(std::make_unique<DeviceBuffer<T>>(kMaxN * kD));
  size_t c = 0;
  for (const std::vector<int32_t>& ids : steps) {
    step.request(ids.data(), static_cast<int64_t>(ids.size()), consumer);
    const size_t bytes = static_cast<size_t>(count_unique(ids) * kD) * sizeof(T);
    for (int64_t k = 0; k < static_cast<int64_t>(layers.size()); ++k) {
      step.wait(k, consumer);
      for (size_t i = 0; i < layers[static_cast<size_t>(k)].tables.size(); ++i, ++c)
        JTOK_CUDA_CHECK(cudaMemcpyAsync(copies[c]->get(), step.rows(k, static_cast<int64_t>(i)), bytes,
                                        cudaMemcpyDeviceToDevice, consumer));
    }
  }
  JTOK_CUDA_CHECK(cudaStreamSynchronize(consumer));
  std::vector<std::vector<Bytes>> out(steps.size());
  c = 0;
  for (size_t s = 0; s < steps.size(); ++s)
    for (const LayerTables& lt : layers)
      for (size_t i = 0; i < lt.tables.size(); ++i, ++c) {
        Bytes b(static_cast<size_t>(count_unique(steps[s]) * kD) * sizeof(T));
        JTOK_CUDA_CHECK(cudaMemcpy(b.data(), copies[c]->get(), b.size(), cudaMemcpyDeviceToHost));
        out[s].push_back(std::move(b));
      }
  return out;
}

// Each step's rows against the CPU's, every (layer, table).
template <typename T>
void expect_cpu_rows(const std::vector<std::vector<Bytes>>& got, const std::vector<LayerTables>& layers,
                     const std::vector<std::vector<int32_t>>& steps, const std::string& what) {
  for (size_t s = 0; s < steps.size(); ++s) {
    size_t c = 0;
    for (const LayerTables& lt : layers)
      for (size_t i = 0; i < lt.tables.size(); ++i, ++c)
        EXPECT_EQ(got[s][c], cpu_bytes<T>(*lt.tables[i], steps[s]))
            << what << ": step " << s << ", layer " << lt.layer << "'s table " << i;
  }
}

// A failed request's rows: the CPU's before the failing (layer, table) slot `first_zero`, zeros from
// its layer's first slot on.
template <typename T>
void expect_failed_rows(const std::vector<Bytes>& got, const std::vector<LayerTables>& layers,
                        const std::vector<int32_t>& ids, size_t first_zero) {
  size_t c = 0;
  for (const LayerTables& lt : layers)
    for (size_t i = 0; i < lt.tables.size(); ++i, ++c) {
      const Bytes want = c < first_zero ? cpu_bytes<T>(*lt.tables[i], ids) : Bytes(got[c].size(), 0);
      EXPECT_EQ(got[c], want) << "failed request: layer " << lt.layer << "'s table " << i;
    }
}

struct Consumer {
  cudaStream_t s = nullptr;
  Consumer() { JTOK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Consumer() { cudaStreamDestroy(s); }
};

// Three requests back to back (ring entries 0, 1, 0), different ids and sizes: staged == in place
// == hbm == the CPU's rows, bit for bit, f32 and bf16 tables into float and bf16 rows.
template <typename T>
void check_back_to_back(Dtype dt) {
  std::vector<TokenTable> tables;
  for (uint64_t i = 0; i < 8; ++i) tables.push_back(random_table(dt, 100 + i));
  const std::vector<LayerTables> layers = {{0, {&tables[0]}},
                                           {1, {&tables[1], &tables[2], &tables[3]}},
                                           {3, {&tables[4], &tables[5], &tables[6], &tables[7]}}};
  std::vector<std::vector<int32_t>> steps = {skewed_ids(590, kV, 1), skewed_ids(16, kV, 2), skewed_ids(300, kV, 3)};
  steps[2].push_back(static_cast<int32_t>(kV - 1));
  steps[2].push_back(0);
  Consumer consumer;
  std::vector<std::vector<Bytes>> got[3];
  const RowPath paths[3] = {RowPath::staged, RowPath::in_place, RowPath::hbm};
  for (int p = 0; p < 3; ++p) {
    StepRows<T> step(layers, kMaxN, paths[p]);
    got[p] = run_back_to_back(step, steps, consumer.s);
    EXPECT_NO_THROW(step.check_error());
    EXPECT_EQ(step.last_unique(), count_unique(steps.back()));
  }
  const std::string what = std::string(jtok::dtype_name(dt)) + (sizeof(T) == 4 ? " -> f32" : " -> bf16");
  EXPECT_TRUE(got[0] == got[1]) << what << ": staged against in place";
  EXPECT_TRUE(got[0] == got[2]) << what << ": staged against hbm";
  expect_cpu_rows<T>(got[0], layers, steps, what + " staged");
}

TEST(CudaStepRowsStaged, BackToBackRequestsEqualInPlaceAndHbm) {
  for (Dtype dt : {Dtype::f32, Dtype::bf16}) {
    check_back_to_back<float>(dt);
    check_back_to_back<bf16>(dt);
  }
}

// A rank's shard of the table (the even ids only; the same rows and dim as the others): its gather
// throws on an odd id, in the host function.
TokenTable even_ids_table(uint64_t seed) {
  TokenTable t = TokenTable::shard_in_ram(2 * kV, 0, 2, kV, kD);
  const std::vector<float> v = jtok::testing::randn(static_cast<size_t>(kV * kD), seed);
  std::copy(v.begin(), v.end(), t.mutable_data());
  return t;
}

// The error belongs to its request: thrown once at its check, not at a later request's; the next
// request's rows are right.
TEST(CudaStepRowsStaged, GatherErrorAtCheckThenNextRequestWorks) {
  std::vector<TokenTable> tables;
  tables.push_back(random_table(Dtype::f32, 200));
  tables.push_back(random_table(Dtype::f32, 201));
  tables.push_back(even_ids_table(202));
  tables.push_back(random_table(Dtype::bf16, 203));
  const std::vector<LayerTables> layers = {{0, {&tables[0]}}, {2, {&tables[1], &tables[2]}}, {5, {&tables[3]}}};
  const std::vector<int32_t> good = {0, 2, 40, 2, 996, 500}, bad = {0, 2, 7, 40};
  StepRows<float> step(layers, kMaxN, RowPath::staged);
  Consumer consumer;
  expect_failed_rows<float>(run_back_to_back(step, {bad}, consumer.s)[0], layers, bad, 1);  // layer 2's on
  expect_error([&] { step.check_error(); }, {"layer 2's table 1: token table gather: id 7 is not held"});
  EXPECT_NO_THROW(step.check_error());  // once
  expect_cpu_rows<float>(run_back_to_back(step, {good}, consumer.s), layers, {good}, "after a failed request");
  EXPECT_NO_THROW(step.check_error());
  // A failed request left unchecked, then a good one: its check is the good one's.
  const std::vector<std::vector<Bytes>> two = run_back_to_back(step, {bad, good}, consumer.s);
  EXPECT_NO_THROW(step.check_error());
  expect_failed_rows<float>(two[0], layers, bad, 1);
  expect_cpu_rows<float>({two[1]}, layers, {good}, "after an unchecked failed request");
  run_back_to_back(step, {bad}, consumer.s);
  expect_error([&] { step.check_error(); }, {"id 7 is not held"});
}

// A disk store's rows in memory whose reads of `bad` fail as a store's do (read_row never throws:
// zeros, the error kept for take_error()); reads counted.
class FlakyDiskRows final : public jtok::DiskRows {
 public:
  FlakyDiskRows(TokenTable rows, int64_t bad) : t_(std::move(rows)), bad_(bad) {}
  const std::string& name() const override { return name_; }
  int64_t ids() const override { return t_.rows; }
  int64_t dim() const override { return t_.dim; }
  Dtype dtype() const override { return Dtype::f32; }
  const std::string& dir() const override { return dir_; }
  void read_row(int64_t id, void* raw, float* scale) const override {
    ++reads_;
    *scale = 0.0f;
    if (id != bad_) return t_.read_row(id, static_cast<float*>(raw));
    std::fill(static_cast<float*>(raw), static_cast<float*>(raw) + t_.dim, 0.0f);
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) error_ = "test-store: the read of token " + std::to_string(id) + " failed";
  }
  std::string take_error() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(error_, std::string());
  }
  int64_t reads() const { return reads_; }

 private:
  TokenTable t_;
  int64_t bad_;
  std::string name_ = "jtok_0", dir_ = "test-store";
  mutable std::mutex mu_;
  mutable std::string error_;
  mutable std::atomic<int64_t> reads_{0};
};

// A disk table's failed read fails its request at the check (the store's error, named by layer and
// table), the request's later layers are not gathered, and the next request reads right.
TEST(CudaStepRowsStaged, DiskReadErrorAtCheck) {
  auto flaky = std::make_shared<FlakyDiskRows>(random_table(Dtype::f32, 300), 9);
  auto counted = std::make_shared<FlakyDiskRows>(random_table(Dtype::f32, 301), -1);
  const TokenTable a = TokenTable::on_disk(flaky), b = TokenTable::on_disk(counted);
  const std::vector<LayerTables> layers = {{0, {&a}}, {1, {&b}}};
  StepRows<bf16> step(layers, kMaxN, RowPath::staged);
  Consumer consumer;
  const int64_t before = counted->reads();
  const std::vector<int32_t> bad = {1, 9, 3};
  expect_failed_rows<bf16>(run_back_to_back(step, {bad}, consumer.s)[0], layers, bad, 0);
  expect_error([&] { step.check_error(); }, {"layer 0's table 0: test-store: the read of token 9 failed"});
  EXPECT_EQ(counted->reads(), before) << "layer 1 gathered after layer 0 failed";
  const std::vector<int32_t> good = {1, 3, 996, 3};
  const std::vector<std::vector<Bytes>> got = run_back_to_back(step, {good}, consumer.s);
  EXPECT_NO_THROW(step.check_error());
  EXPECT_EQ(counted->reads() - before, count_unique(good));
  expect_cpu_rows<bf16>(got, layers, {good}, "after a failed read");
}

}  // namespace
