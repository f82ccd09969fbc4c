// What the model needs of a disk storage, shown with one that is neither store: rows kept in a
// vector behind DiskRows (store/disk_rows.h), which is all a new storage implements.
//   - gather_rows through TokenTable::on_disk gives its rows (and equals gather_rows_ref);
//     prefetch_rows and check_table_reads reach it; the table is read-only and not a training
//     store's;
//   - attach_disk_rows (model/table_attach.h), the one attach of inference and training, matches a
//     model's tables by name in any order, and refuses a missing table, another shape or another
//     count of tables naming the manifest;
//   - ClockSlots (store/clock_slots.h), the stores' one cache index: CLOCK gives a referenced slot a
//     second chance, never claims a slot the store rules out, and unbind forgets the key.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "model/table_attach.h"
#include "model/token_table.h"
#include "ops/lowp_convert.h"
#include "store/clock_slots.h"
#include "store/disk_rows.h"

using namespace jtok;

namespace {

// f32 rows, or (bf16) their bf16 roundings as the stored elements.
class VectorRows final : public DiskRows {
 public:
  VectorRows(std::string name, int64_t ids, int64_t dim, bool bf16 = false)
      : name_(std::move(name)), ids_(ids), dim_(dim), bf16_(bf16) {
    for (int64_t i = 0; i < ids * dim; ++i)
      v_.push_back(0.25f * static_cast<float>(i) - 3.0f + 1e-3f * static_cast<float>(i % 7));
    for (float x : v_) h_.push_back(f32_to_bf16(x));
  }
  const std::string& name() const override { return name_; }
  int64_t ids() const override { return ids_; }
  int64_t dim() const override { return dim_; }
  Dtype dtype() const override { return bf16_ ? Dtype::bf16 : Dtype::f32; }
  const std::string& dir() const override { return dir_; }
  void read_row(int64_t id, void* raw, float* scale) const override {
    if (bf16_)
      std::memcpy(raw, h_.data() + id * dim_, sizeof(uint16_t) * static_cast<size_t>(dim_));
    else
      std::memcpy(raw, v_.data() + id * dim_, sizeof(float) * static_cast<size_t>(dim_));
    *scale = 0.0f;
  }
  int64_t prefetch(const int32_t* ids, int64_t n) const override {
    prefetched += n;
    return n;
  }
  std::string take_error() const override { return std::exchange(error, std::string()); }
  float at(int64_t id, int64_t j) const { return v_[static_cast<size_t>(id * dim_ + j)]; }
  mutable int64_t prefetched = 0;
  mutable std::string error;

 private:
  std::string name_, dir_ = "vector";
  int64_t ids_, dim_;
  bool bf16_;
  std::vector<float> v_;
  std::vector<uint16_t> h_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

Model two_tables() {
  Model m;
  m.tables = {TokenTable::in_ram(10, 4), TokenTable::in_ram(10, 6)};
  m.table_names = {"a", "b"};
  return m;
}

}  // namespace

TEST(DiskRows, TheOneGatherReadsANewStorage) {
  auto rows = std::make_shared<VectorRows>("t", 9, 5);
  TokenTable t = TokenTable::on_disk(rows);
  EXPECT_EQ(t.rows, 9);
  EXPECT_EQ(t.dim, 5);
  EXPECT_TRUE(t.in_store() && t.read_only() && !t.trained_in_store());
  const std::vector<int32_t> ids = {8, 0, 3, 3};
  std::vector<float> out(ids.size() * 5), ref(ids.size() * 5);
  gather_rows(out.data(), t, ids.data(), static_cast<int64_t>(ids.size()));
  gather_rows_ref(ref.data(), t, ids.data(), static_cast<int64_t>(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(out[i * 5 + static_cast<size_t>(j)], rows->at(ids[i], j));
  EXPECT_EQ(out, ref);
  EXPECT_EQ(prefetch_rows(t, ids.data(), 2), 2);
  EXPECT_EQ(rows->prefetched, 2);
  rows->error = "vector: row 3 unreadable";
  EXPECT_EQ(error_of([&] { check_table_reads({t}); }), "vector: row 3 unreadable");
  EXPECT_EQ(error_of([&] { check_table_reads({t}); }), "(no error)");  // taken: cleared
  EXPECT_NE(error_of([&] { scatter_rows(t, ids.data(), out.data(), 1); }).find("disk store vector"), std::string::npos);
}

// The bf16 gather (a GPU's staging) over a disk storage: an f32 store's rows rounded, a bf16 store's
// raw reads as they are; both the rounded f32 gather's bits, serial and parallel.
TEST(DiskRows, Bf16GatherReadsTheStoredBits) {
  for (bool bf16 : {false, true})
    for (int64_t n : {int64_t{4}, int64_t{400}}) {  // 4 x 64 serial, 400 x 64 past kParallelMin
      SCOPED_TRACE(std::string(bf16 ? "bf16" : "f32") + " store, n " + std::to_string(n));
      auto rows = std::make_shared<VectorRows>("t", 50, 64, bf16);
      const TokenTable t = TokenTable::on_disk(rows);
      std::vector<int32_t> ids(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 17) % 50);
      std::vector<float> ref(static_cast<size_t>(n * 64));
      gather_rows_ref(ref.data(), t, ids.data(), n);
      std::vector<uint16_t> want(ref.size()), got(ref.size());
      for (size_t i = 0; i < ref.size(); ++i) want[i] = f32_to_bf16(ref[i]);
      gather_rows_bf16(got.data(), t, ids.data(), n);
      EXPECT_EQ(got, want);
      EXPECT_EQ(got[64], f32_to_bf16(rows->at(ids[1], 0)));
    }
  EXPECT_GE(400 * 64, kParallelMin);
}

TEST(DiskRows, AttachMatchesTablesByName) {
  Model m = two_tables();
  const std::vector<std::shared_ptr<const DiskRows>> rows = {std::make_shared<VectorRows>("b", 10, 6),
                                                             std::make_shared<VectorRows>("a", 10, 4)};
  attach_disk_rows(m, rows, "m.json", "the model");
  EXPECT_EQ(m.tables[0].disk_rows(), rows[1].get());
  EXPECT_EQ(m.tables[1].disk_rows(), rows[0].get());
  EXPECT_EQ(m.tables[1].dim, 6);
}

TEST(DiskRows, AttachRefusesAnotherModelsStore) {
  auto attach = [](std::vector<std::shared_ptr<const DiskRows>> rows) {
    return error_of([&] {
      Model m = two_tables();
      attach_disk_rows(m, rows, "s/manifest.json", "the checkpoint ck");
    });
  };
  auto r = [](const char* n, int64_t ids, int64_t d) { return std::make_shared<VectorRows>(n, ids, d); };
  EXPECT_EQ(attach({r("a", 10, 4), r("c", 10, 6)}), "s/manifest.json: no table b (the checkpoint ck has it)");
  EXPECT_EQ(attach({r("a", 10, 4), r("b", 10, 5)}), "s/manifest.json: table b is 10 x 5, the checkpoint ck has 10 x 6");
  EXPECT_EQ(attach({r("a", 11, 4), r("b", 10, 6)}), "s/manifest.json: table a is 11 x 4, the checkpoint ck has 10 x 4");
  EXPECT_EQ(attach({r("a", 10, 4), r("b", 10, 6), r("c", 10, 6)}), "s/manifest.json: 3 tables, the checkpoint ck has 2");
}

TEST(ClockSlots, SecondChanceSkipAndUnbind) {
  ClockSlots c;
  c.init(3, 10);
  for (int64_t s = 0; s < 3; ++s) c.bind(s, 5 + s);
  EXPECT_EQ(c.slot_of(6), 1);
  EXPECT_EQ(c.key_of(2), 7);
  EXPECT_EQ(c.slot_of(0), -1);
  auto none = [](int64_t) { return false; };
  c.touch(0);
  EXPECT_EQ(c.claim(none), 1);  // slot 0 referenced: its bit cleared, passed over
  c.unbind(1);
  EXPECT_EQ(c.slot_of(6), -1);
  EXPECT_EQ(c.key_of(1), -1);
  EXPECT_EQ(c.claim([](int64_t s) { return s == 2; }), 0);  // hand at 2 (ruled out), then 0 (bit cleared)
  c.touch(1);
  c.touch(2);
  EXPECT_EQ(c.claim([](int64_t s) { return s == 0; }), 1);  // two sweeps clear the bits
  EXPECT_EQ(c.claim([](int64_t) { return true; }), -1);   // every slot ruled out
}
