// Token-table rows on the GPU from host memory (issue 40; src/cuda/host_rows.h, row_staging.h,
// step_rows.h) against the CPU table's own gather (gather_rows), bit for bit: read in place over UVA
// from registered host memory (and from a device copy, the HBM control), staged through pinned
// memory on a side stream, and every layer's rows of a step requested at once. Part of test_cuda_ops.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "error_test_util.h"
#include "cuda/dedup.h"
#include "cuda/host_rows.h"
#include "cuda/row_staging.h"
#include "cuda/step_rows.h"
#include "cuda_case.h"
#include "io/mapped_file.h"
#include "model/token_table.h"
#include "model/transformer.h"

namespace {

using namespace jtok::cuda_test;
using jtok::Dtype;
using jtok::TokenTable;
using jtok::testing::expect_error;
using jtok::testing::randn;
using bf16 = __nv_bfloat16;

// The device RowBatch of ids (N) below V.
struct DeviceDedup {
  DeviceBuffer<int32_t> ids, unique, inverse, offsets, order, count;
  DeviceBuffer<char> scratch;
  jtok::cuda::DeviceRowBatch rb;
  DeviceDedup(const std::vector<int32_t>& host_ids, int64_t V)
      : ids(upload_exact(host_ids)), unique(host_ids.size()), inverse(host_ids.size()), offsets(host_ids.size() + 1),
        order(host_ids.size()), count(1),
        scratch(jtok::cuda::dedup_scratch_bytes(static_cast<int64_t>(host_ids.size()), V)),
        rb{unique.get(), inverse.get(), offsets.get(), order.get(), count.get()} {
    jtok::cuda::dedup_ids(rb, ids.get(), static_cast<int64_t>(host_ids.size()), V, scratch.get(), scratch.n, nullptr);
  }
};

// Skewed ids with both ends of the vocabulary and repeats of them.
std::vector<int32_t> test_ids(int64_t N, int64_t V, uint64_t seed) {
  std::vector<int32_t> ids = skewed_ids(N, V, seed);
  const int32_t last = static_cast<int32_t>(V - 1);
  for (int32_t id : {0, last, 0, last, 1, last - 1}) ids.push_back(id);
  return ids;
}

TokenTable make_table(int64_t V, int64_t d, Dtype dt, uint64_t seed) {
  TokenTable f32 = TokenTable::in_ram(V, d, randn(static_cast<size_t>(V * d), seed));
  return dt == Dtype::f32 ? f32 : jtok::quantize_table(f32, dt);
}

// The bytes a T buffer of the CPU's f32 rows holds: the f32 bits, or each rounded to bf16.
template <typename T>
std::vector<uint8_t> expected_bytes(const std::vector<float>& rows) {
  std::vector<uint8_t> b(rows.size() * sizeof(T));
  if constexpr (sizeof(T) == 4) {
    std::memcpy(b.data(), rows.data(), b.size());
  } else {
    for (size_t i = 0; i < rows.size(); ++i) {
      const uint16_t bits = f32_to_bf16_bits(rows[i]);
      std::memcpy(b.data() + 2 * i, &bits, 2);
    }
  }
  return b;
}

// The first n elements of a device buffer, as bytes (synchronous).
template <typename T>
std::vector<uint8_t> device_bytes(const T* p, int64_t n) {
  std::vector<uint8_t> b(static_cast<size_t>(n) * sizeof(T));
  JTOK_CUDA_CHECK(cudaDeviceSynchronize());
  if (n) JTOK_CUDA_CHECK(cudaMemcpy(b.data(), p, b.size(), cudaMemcpyDeviceToHost));
  return b;
}

// The CPU table's rows of the sorted unique ids (gather_rows: f32 whatever the storage).
std::vector<float> cpu_rows(const TokenTable& t, const std::vector<int32_t>& ids) {
  const jtok::RowBatch rb = jtok::dedup_ids(ids.data(), static_cast<int64_t>(ids.size()), t.rows);
  std::vector<float> out(rb.unique.size() * static_cast<size_t>(t.dim));
  jtok::gather_unique_rows(out.data(), t, rb);
  return out;
}

int64_t count_unique(const std::vector<int32_t>& ids, int64_t V) {
  return static_cast<int64_t>(jtok::dedup_ids(ids.data(), static_cast<int64_t>(ids.size()), V).unique.size());
}

template <typename T>
void check_gather(const TokenTable& t, const jtok::cuda::RowSource& src, const std::vector<int32_t>& ids,
                  const std::string& what) {
  const int64_t N = static_cast<int64_t>(ids.size()), U = count_unique(ids, t.rows);
  const std::vector<uint8_t> want = expected_bytes<T>(cpu_rows(t, ids));
  DeviceDedup dd(ids, t.rows);
  for (bool ref : {false, true}) {
    SCOPED_TRACE(what + (ref ? " (reference kernel)" : " (vector kernel)") + (sizeof(T) == 4 ? " -> f32" : " -> bf16"));
    DeviceBuffer<T> out(static_cast<size_t>(N * t.dim));
    DeviceBuffer<int32_t> err(3);
    const jtok::cuda::RowErrors errors{err.get()};
    jtok::cuda::reset_row_errors(errors, nullptr);
    if (ref)
      jtok::cuda::gather_rows_device_ref(out.get(), src, dd.rb, N, errors, nullptr);
    else
      jtok::cuda::gather_rows_device(out.get(), src, dd.rb, N, errors, nullptr);
    jtok::cuda::check_row_errors(errors, t.rows, what.c_str(), nullptr);
    EXPECT_EQ(device_bytes(out.get(), U * t.dim), want);
  }
}

// In place from registered host memory and from a device copy: bit for bit the CPU's rows, f32 and
// bf16 tables into f32 and bf16 outputs, d a multiple of 8 (16-byte loads) and not (one element a thread).
TEST(CudaHostRows, InPlaceGatherEqualsCpuRows) {
  const int64_t V = 1531;
  for (int64_t d : {64, 1024, 37}) {
    for (Dtype dt : {Dtype::f32, Dtype::bf16}) {
      const TokenTable t = make_table(V, d, dt, 7 + static_cast<uint64_t>(d));
      const std::string what = std::string(jtok::dtype_name(dt)) + " table, d " + std::to_string(d);
      const std::vector<int32_t> ids = test_ids(700, V, 11);
      jtok::cuda::RegisteredRows reg(t, "test table");
      check_gather<float>(t, reg.source(), ids, what + ", host");
      check_gather<bf16>(t, reg.source(), ids, what + ", host");
      // The HBM control: the same bytes copied to the device.
      DeviceBuffer<uint8_t> hbm(static_cast<size_t>(t.storage_bytes()));
      JTOK_CUDA_CHECK(cudaMemcpy(hbm.get(), t.raw_row(0), hbm.n, cudaMemcpyHostToDevice));
      const jtok::cuda::RowSource dev{hbm.get(), V, d, dt};
      check_gather<float>(t, dev, ids, what + ", device");
      check_gather<bf16>(t, dev, ids, what + ", device");
    }
  }
}

// Tables read in place from a memory-mapped file (--tables mmap: read-only pages, registered with
// cudaHostRegisterReadOnly): two bf16 tables side by side sharing a page, the first 16-byte
// aligned (vector loads), the second 2 bytes off (one element a thread).
TEST(CudaHostRows, InPlaceGatherFromMappedFile) {
  const int64_t V = 301, d = 64;
  const TokenTable a = make_table(V, d, Dtype::bf16, 91), b = make_table(V, d, Dtype::bf16, 92);
  const size_t bytes = static_cast<size_t>(a.storage_bytes()), off_a = 64, off_b = off_a + bytes + 2;
  std::vector<char> file(off_b + bytes, 0);
  std::memcpy(file.data() + off_a, a.raw_row(0), bytes);
  std::memcpy(file.data() + off_b, b.raw_row(0), bytes);
  const std::string path = ::testing::TempDir() + "jtok_host_rows_tables.bin";
  std::ofstream(path, std::ios::binary).write(file.data(), static_cast<std::streamsize>(file.size()));
  auto mf = jtok::MappedFile::open(path);
  const TokenTable va = TokenTable::view(V, d, Dtype::bf16, mf->data() + off_a, nullptr, mf);
  const TokenTable vb = TokenTable::view(V, d, Dtype::bf16, mf->data() + off_b, nullptr, mf);
  jtok::cuda::RegisteredRows ra(va, "mapped table a"), rb(vb, "mapped table b");
  const std::vector<int32_t> ids = test_ids(400, V, 93);
  check_gather<bf16>(a, ra.source(), ids, "mapped, aligned");
  check_gather<float>(a, ra.source(), ids, "mapped, aligned");
  check_gather<bf16>(b, rb.source(), ids, "mapped, 2 bytes off");
  ra.release();
  rb.release();
  std::remove(path.c_str());
}

// Many tables in one call (18: two launches of at most 16), f32 rows into bf16 and f32; an id out of
// range counted once whatever the number of tables.
TEST(CudaHostRows, InPlaceGatherManyTables) {
  const int64_t V = 120, d = 16, n_tables = 18;
  std::vector<TokenTable> tables;
  std::vector<jtok::cuda::RegisteredRows> reg;
  std::vector<jtok::cuda::RowSource> srcs;
  reg.reserve(static_cast<size_t>(n_tables));
  for (int64_t t = 0; t < n_tables; ++t) tables.push_back(make_table(V, d, Dtype::f32, 100 + static_cast<uint64_t>(t)));
  for (const TokenTable& t : tables) {
    reg.emplace_back(t);
    srcs.push_back(reg.back().source());
  }
  std::vector<int32_t> ids = test_ids(90, V, 101);
  ids.push_back(static_cast<int32_t>(V) + 1);
  DeviceDedup dd(ids, V + 2);
  const int64_t N = static_cast<int64_t>(ids.size()), U = count_unique(ids, V + 2);
  std::vector<DeviceBuffer<bf16>> outs;
  std::vector<bf16*> out_ptrs;
  for (int64_t t = 0; t < n_tables; ++t) {
    outs.emplace_back(static_cast<size_t>(N * d));
    out_ptrs.push_back(outs.back().get());
  }
  DeviceBuffer<int32_t> err(3);
  const jtok::cuda::RowErrors errors{err.get()};
  jtok::cuda::reset_row_errors(errors, nullptr);
  jtok::cuda::gather_rows_device_tables(out_ptrs.data(), srcs.data(), static_cast<int>(n_tables), dd.rb, N, errors,
                                        nullptr);
  expect_error([&] { jtok::cuda::check_row_errors(errors, V, "many tables", nullptr); }, {"1 token id(s) outside"});
  ids.pop_back();  // the good ids' rows: the first U - 1 (the bad id sorts last)
  for (int64_t t = 0; t < n_tables; ++t) {
    SCOPED_TRACE("table " + std::to_string(t));
    EXPECT_EQ(device_bytes(out_ptrs[static_cast<size_t>(t)], (U - 1) * d),
              expected_bytes<bf16>(cpu_rows(tables[static_cast<size_t>(t)], ids)));
  }
}

// One id per step (decode at batch 1) and a batch of a single repeated id.
TEST(CudaHostRows, InPlaceGatherOneRow) {
  const TokenTable t = make_table(300, 64, Dtype::bf16, 21);
  jtok::cuda::RegisteredRows reg(t);
  check_gather<bf16>(t, reg.source(), {299}, "one id");
  check_gather<bf16>(t, reg.source(), std::vector<int32_t>(50, 0), "one id repeated");
}

// An id out of range met on the device: reported by check_row_errors (count and the ids), its row
// zeros, the other rows still right.
TEST(CudaHostRows, InPlaceGatherReportsIdsOutOfRange) {
  const int64_t V = 200, d = 16;
  const TokenTable t = make_table(V, d, Dtype::f32, 31);
  jtok::cuda::RegisteredRows reg(t);
  const std::vector<int32_t> ids = {5, static_cast<int32_t>(V), 7, static_cast<int32_t>(V) + 3, 5};
  DeviceDedup dd(ids, V + 4);  // the dedup's bound covers the bad ids: the gather's own check is tested
  DeviceBuffer<float> out(ids.size() * d);
  DeviceBuffer<int32_t> err(3);
  const jtok::cuda::RowErrors errors{err.get()};
  jtok::cuda::reset_row_errors(errors, nullptr);
  jtok::cuda::gather_rows_device(out.get(), reg.source(), dd.rb, static_cast<int64_t>(ids.size()), errors, nullptr);
  try {
    jtok::cuda::check_row_errors(errors, V, "test gather", nullptr);
    FAIL() << "ids 200 and 203 of a 200-row table were not reported";
  } catch (const jtok::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("2 token id(s) outside the table's 200 rows"), std::string::npos) << m;
    EXPECT_NE(m.find("largest 203"), std::string::npos) << m;
  }
  const std::vector<uint8_t> got = device_bytes(out.get(), 4 * d);  // unique: 5, 7, 200, 203
  const std::vector<float> want = cpu_rows(t, {5, 7});
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4));
  for (size_t i = want.size() * 4; i < got.size(); ++i) ASSERT_EQ(got[i], 0) << "byte " << i << " of the bad rows";
}

// Registration: counted per table (twice is safe), the last release unpins, an unregistered table's
// release does nothing, and tables the GPU cannot read in place are refused by name.
TEST(CudaHostRows, RegisterTwiceAndUnregister) {
  const TokenTable t = make_table(100, 32, Dtype::f32, 41);
  auto type_of = [&] {
    cudaPointerAttributes a{};
    JTOK_CUDA_CHECK(cudaPointerGetAttributes(&a, t.raw_row(0)));
    return a.type;
  };
  EXPECT_FALSE(jtok::cuda::unregister_table_rows(t));
  EXPECT_EQ(type_of(), cudaMemoryTypeUnregistered);
  const jtok::cuda::RowSource a = jtok::cuda::register_table_rows(t);
  const jtok::cuda::RowSource b = jtok::cuda::register_table_rows(t);
  EXPECT_EQ(a.data, b.data);
  EXPECT_EQ(jtok::cuda::table_rows_registrations(t), 2);
  EXPECT_EQ(type_of(), cudaMemoryTypeHost);
  EXPECT_TRUE(jtok::cuda::unregister_table_rows(t));
  EXPECT_EQ(type_of(), cudaMemoryTypeHost) << "one reference left: still pinned";
  check_gather<float>(t, a, test_ids(64, 100, 42), "after one release");
  EXPECT_TRUE(jtok::cuda::unregister_table_rows(t));
  EXPECT_EQ(jtok::cuda::table_rows_registrations(t), 0);
  EXPECT_EQ(type_of(), cudaMemoryTypeUnregistered);
  EXPECT_FALSE(jtok::cuda::unregister_table_rows(t));
  {
    jtok::cuda::RegisteredRows r1(t), r2(t);
    jtok::cuda::RegisteredRows moved(std::move(r1));
    r2.release();
    r2.release();
    EXPECT_EQ(jtok::cuda::table_rows_registrations(t), 1);
  }
  EXPECT_EQ(jtok::cuda::table_rows_registrations(t), 0);
}

TEST(CudaHostRows, RegisterRefusesOtherTables) {
  const TokenTable q8 = make_table(100, 32, Dtype::int8, 51), q4 = make_table(100, 32, Dtype::int4, 52);
  expect_error([&] { jtok::cuda::register_table_rows(q8, "layer 3's table"); }, {"layer 3's table (100 x 32, int8)"});
  expect_error([&] { jtok::cuda::register_table_rows(q4); }, {"rows stored as int4"});
  const TokenTable shard = TokenTable::shard_in_ram(100, 1, 2, 50, 32);
  expect_error([&] { jtok::cuda::register_table_rows(shard); }, {"a rank's shard"});
  const TokenTable unbound = TokenTable::unbound(100, 32);
  expect_error([&] { jtok::cuda::register_table_rows(unbound); }, {"unbound"});
}

// Sources the kernel cannot read are refused before anything is launched (no GPU needed): rows
// not aligned to their elements, int8 rows, tables of different shapes in one call, no ids.
TEST(CudaHostRows, GatherRefusesBadSources) {
  alignas(16) static float rows[64];
  const jtok::cuda::DeviceRowBatch rb{};
  float* out = nullptr;
  const jtok::cuda::RowSource good{rows, 4, 16, Dtype::f32};
  const jtok::cuda::RowSource off{reinterpret_cast<const char*>(rows) + 2, 4, 16, Dtype::f32};
  expect_error([&] { jtok::cuda::gather_rows_device(out, off, rb, 8, {}, nullptr); }, {"not aligned to their 4-byte f32"});
  const jtok::cuda::RowSource q8{rows, 4, 16, Dtype::int8};
  expect_error([&] { jtok::cuda::gather_rows_device(out, q8, rb, 8, {}, nullptr); }, {"rows stored as int8"});
  const jtok::cuda::RowSource pair[2] = {good, {rows, 4, 8, Dtype::f32}};
  float* outs[2] = {nullptr, nullptr};
  expect_error([&] { jtok::cuda::gather_rows_device_tables(outs, pair, 2, rb, 8, {}, nullptr); },
               {"table 1 is 4 x 8 f32, table 0 4 x 16 f32"});
  expect_error([&] { jtok::cuda::gather_rows_device(out, good, rb, 0, {}, nullptr); }, {"N = 0"});
  const std::vector<int32_t> ids = {0, 3, 4};
  expect_error([&] { jtok::cuda::check_ids_in_range(ids.data(), 3, 4, "step"); }, {"step: token id 4 at position 2"});
}

// The staged path's host half (no GPU needed: any host buffer stands in for the pinned one): the
// rows in the activation type, bit for bit the CPU gather's (a bf16 table's stored bits).
template <typename T>
void check_staging_host(const TokenTable& t, const std::vector<int32_t>& ids, const std::string& what) {
  SCOPED_TRACE(what + (sizeof(T) == 4 ? " -> f32" : " -> bf16"));
  const jtok::RowBatch rb = jtok::dedup_ids(ids.data(), static_cast<int64_t>(ids.size()), t.rows);
  std::vector<T> staging(rb.unique.size() * static_cast<size_t>(t.dim));
  jtok::cuda::gather_rows_to_staging(staging.data(), t, rb.unique.data(), static_cast<int64_t>(rb.unique.size()));
  std::vector<uint8_t> got(staging.size() * sizeof(T));
  std::memcpy(got.data(), staging.data(), got.size());
  EXPECT_EQ(got, expected_bytes<T>(cpu_rows(t, ids)));
}

TEST(CudaHostRows, StagingHostGather) {
  const int64_t V = 1531, d = 64;
  for (Dtype dt : {Dtype::f32, Dtype::bf16, Dtype::int8, Dtype::int4}) {
    const TokenTable t = make_table(V, d, dt, 65);
    check_staging_host<float>(t, test_ids(900, V, 66), jtok::dtype_name(dt));
    check_staging_host<bf16>(t, test_ids(900, V, 67), jtok::dtype_name(dt));
  }
  const TokenTable bf = make_table(V, d, Dtype::bf16, 68);  // its stored bits exactly
  const std::vector<int32_t> ids = {0, static_cast<int32_t>(V - 1)};
  std::vector<bf16> staging(2 * d);
  jtok::cuda::gather_rows_to_staging(staging.data(), bf, ids.data(), 2);
  EXPECT_EQ(0, std::memcmp(staging.data(), bf.raw_row(0), d * 2));
  EXPECT_EQ(0, std::memcmp(staging.data() + d, bf.raw_row(V - 1), d * 2));
}

// Staged: host gather into pinned staging, copy on a side stream, the consumer waits on the event;
// bit for bit the CPU's rows, for f32, bf16 and int8 tables (the CPU's dequantized rows).
template <typename T>
void check_staged(const TokenTable& t, const std::vector<int32_t>& ids, const std::string& what) {
  SCOPED_TRACE(what + (sizeof(T) == 4 ? " -> f32" : " -> bf16"));
  const jtok::RowBatch rb = jtok::dedup_ids(ids.data(), static_cast<int64_t>(ids.size()), t.rows);
  const int64_t U = static_cast<int64_t>(rb.unique.size());
  jtok::cuda::PinnedArray<T> staging(U * t.dim);
  DeviceBuffer<T> out(static_cast<size_t>(U * t.dim));
  cudaStream_t side, consumer;
  cudaEvent_t ready;
  JTOK_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  JTOK_CUDA_CHECK(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
  JTOK_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  jtok::cuda::stage_rows(out.get(), staging.get(), t, rb.unique.data(), U, side, ready);
  jtok::cuda::wait_rows(consumer, ready);
  std::vector<uint8_t> got(static_cast<size_t>(U * t.dim) * sizeof(T));
  JTOK_CUDA_CHECK(cudaMemcpyAsync(got.data(), out.get(), got.size(), cudaMemcpyDeviceToHost, consumer));
  JTOK_CUDA_CHECK(cudaStreamSynchronize(consumer));
  EXPECT_EQ(got, expected_bytes<T>(cpu_rows(t, ids)));
  cudaEventDestroy(ready);
  cudaStreamDestroy(consumer);
  cudaStreamDestroy(side);
}

TEST(CudaHostRows, StagedGatherEqualsCpuRows) {
  const int64_t V = 1531, d = 64;
  for (Dtype dt : {Dtype::f32, Dtype::bf16, Dtype::int8}) {
    const TokenTable t = make_table(V, d, dt, 61);
    const std::string what = std::string(jtok::dtype_name(dt)) + " table";
    check_staged<float>(t, test_ids(900, V, 62), what);
    check_staged<bf16>(t, test_ids(900, V, 63), what);
  }
  const TokenTable t = make_table(V, d, Dtype::f32, 64);
  jtok::cuda::PinnedArray<float> staging(2 * d);
  const std::vector<int32_t> bad = {3, static_cast<int32_t>(V)};
  expect_error([&] { jtok::cuda::gather_rows_to_staging(staging.get(), t, bad.data(), 2); },
               {"id 1531 is not held by this table"});
}

// Three layers: JTok (1 table), JTok-M (3 tables), both (4 tables). Every layer's rows after its
// event, for two steps in a row (the second reuses the buffers), by both paths and both output types.
template <typename T>
void check_step_rows(jtok::cuda::RowPath path, Dtype dt) {
  const int64_t V = 997, d = 64, max_n = 600;
  std::vector<TokenTable> tables;
  for (int i = 0; i < 8; ++i) tables.push_back(make_table(V, d, dt, 70 + static_cast<uint64_t>(i)));
  std::vector<jtok::cuda::LayerTables> layers = {{0, {&tables[0]}}, {1, {&tables[1], &tables[2], &tables[3]}},
                                                 {3, {&tables[4], &tables[5], &tables[6], &tables[7]}}};
  jtok::cuda::StepRows<T> step(layers, max_n, path);
  cudaStream_t consumer;
  JTOK_CUDA_CHECK(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
  for (uint64_t s = 0; s < 2; ++s) {
    const std::vector<int32_t> ids = test_ids(s == 0 ? 590 : 16, V, 80 + s);
    step.request(ids.data(), static_cast<int64_t>(ids.size()), consumer);
    const int64_t U = count_unique(ids, V);
    EXPECT_EQ(step.last_unique(), U);
    for (int64_t k = 0; k < 3; ++k) {
      step.wait(k, consumer);
      for (size_t i = 0; i < layers[static_cast<size_t>(k)].tables.size(); ++i) {
        SCOPED_TRACE(std::string(row_path_name(path)) + " step " + std::to_string(s) + " layer index " +
                     std::to_string(k) + " table " + std::to_string(i));
        std::vector<uint8_t> got(static_cast<size_t>(U * d) * sizeof(T));
        JTOK_CUDA_CHECK(cudaMemcpyAsync(got.data(), step.rows(k, static_cast<int64_t>(i)), got.size(),
                                        cudaMemcpyDeviceToHost, consumer));
        JTOK_CUDA_CHECK(cudaStreamSynchronize(consumer));
        EXPECT_EQ(got, expected_bytes<T>(cpu_rows(*layers[static_cast<size_t>(k)].tables[i], ids)));
      }
    }
  }
  const std::vector<int32_t> bad = {1, 2, -1};
  expect_error([&] { step.request(bad.data(), 3, consumer); }, {"token id -1 at position 2"});
  JTOK_CUDA_CHECK(cudaStreamSynchronize(consumer));
  cudaStreamDestroy(consumer);
}

TEST(CudaHostRows, StepRowsEveryLayer) {
  for (jtok::cuda::RowPath path :
       {jtok::cuda::RowPath::in_place, jtok::cuda::RowPath::staged, jtok::cuda::RowPath::hbm})
    for (Dtype dt : {Dtype::f32, Dtype::bf16}) {
      SCOPED_TRACE(jtok::dtype_name(dt));
      check_step_rows<float>(path, dt);
      check_step_rows<bf16>(path, dt);
    }
  // The device copy of an int8 table: the host's dequantized rows (as staged).
  check_step_rows<float>(jtok::cuda::RowPath::hbm, Dtype::int8);
  check_step_rows<bf16>(jtok::cuda::RowPath::hbm, Dtype::int8);
}

// A model's layers: JTok on layer 1, JTok-M (3 tables) on both layers.
TEST(CudaHostRows, LayerTablesOfModel) {
  jtok::ModelConfig c;
  c.vocab_size = 250;
  c.hidden_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.intermediate_size = 96;
  c.max_position_embeddings = 32;
  c.jtok = true;
  c.jtok_layers = std::string("1");
  c.jtokm = true;
  c.jtokm_n_e = 3;
  const jtok::Model m = jtok::make_model(c, 5);
  const auto layers = jtok::cuda::layer_tables(m);
  ASSERT_EQ(layers.size(), 2u);
  EXPECT_EQ(layers[0].tables.size(), 3u);
  ASSERT_EQ(layers[1].tables.size(), 4u);
  EXPECT_EQ(layers[1].tables[0], &m.tables[static_cast<size_t>(m.jtok_table[1])]);
  EXPECT_EQ(layers[1].tables[1], &m.tables[static_cast<size_t>(m.jtokm_table[1])]);
}

}  // namespace
