// The stores' tables as the model reads them (store/disk_rows.h): one DiskRows per table, which
// keeps its store open.
#include <utility>

#include "core/error.h"
#include "store/table_store.h"
#include "store/train_table_store.h"

namespace jtok {

namespace {

// Table k of a serving store: its cached blocks' raw elements.
class TableStoreDiskRows final : public DiskRows {
 public:
  TableStoreDiskRows(std::shared_ptr<const TableStore> s, int64_t k)
      : s_(std::move(s)), k_(k), t_(s_->tables()[static_cast<size_t>(k)]) {}
  const std::string& name() const override { return t_.name; }
  int64_t ids() const override { return s_->ids(); }
  int64_t dim() const override { return t_.dim; }
  Dtype dtype() const override { return t_.dtype; }
  const std::string& dir() const override { return s_->dir(); }
  void read_row(int64_t id, void* raw, float* scale) const override { s_->read_raw(k_, id, raw, scale); }
  int64_t prefetch(const int32_t* ids, int64_t n) const override { return s_->prefetch(ids, n); }
  std::string take_error() const override { return s_->take_error(); }
  const TableStore* store() const { return s_.get(); }

 private:
  std::shared_ptr<const TableStore> s_;
  int64_t k_;
  const TableStoreTable& t_;
};

// Table k of a training store: the rows' values (f32); the table optimizer reaches the moments and
// steps through the store itself (train_store_of).
class TrainStoreDiskRows final : public DiskRows {
 public:
  TrainStoreDiskRows(std::shared_ptr<TrainTableStore> s, int64_t k)
      : s_(std::move(s)), k_(k), t_(s_->tables()[static_cast<size_t>(k)]) {}
  const std::string& name() const override { return t_.name; }
  int64_t ids() const override { return s_->ids(); }
  int64_t dim() const override { return t_.dim; }
  Dtype dtype() const override { return Dtype::f32; }
  const std::string& dir() const override { return s_->dir(); }
  void read_row(int64_t id, void* raw, float* scale) const override {
    s_->read_value(k_, id, static_cast<float*>(raw));
    *scale = 0.0f;
  }
  bool trained_in_store() const override { return true; }
  TrainStoreTableRef ref() const { return {s_.get(), k_}; }

 private:
  std::shared_ptr<TrainTableStore> s_;
  int64_t k_;
  const TrainStoreTable& t_;
};

}  // namespace

std::shared_ptr<const DiskRows> disk_rows(std::shared_ptr<const TableStore> store, int64_t k) {
  JTOK_CHECK(store && k >= 0 && k < static_cast<int64_t>(store->tables().size()), "disk_rows: no table ", k);
  return std::make_shared<TableStoreDiskRows>(std::move(store), k);
}

std::vector<std::shared_ptr<const DiskRows>> disk_rows(const std::shared_ptr<const TableStore>& store) {
  std::vector<std::shared_ptr<const DiskRows>> out;
  for (size_t k = 0; k < store->tables().size(); ++k) out.push_back(disk_rows(store, static_cast<int64_t>(k)));
  return out;
}

const TableStore* table_store_of(const DiskRows* rows) {
  const auto* r = dynamic_cast<const TableStoreDiskRows*>(rows);
  return r ? r->store() : nullptr;
}

std::shared_ptr<const DiskRows> disk_rows(std::shared_ptr<TrainTableStore> store, int64_t k) {
  JTOK_CHECK(store && k >= 0 && k < static_cast<int64_t>(store->tables().size()), "disk_rows: no table ", k);
  return std::make_shared<TrainStoreDiskRows>(std::move(store), k);
}

std::vector<std::shared_ptr<const DiskRows>> disk_rows(const std::shared_ptr<TrainTableStore>& store) {
  std::vector<std::shared_ptr<const DiskRows>> out;
  for (size_t k = 0; k < store->tables().size(); ++k) out.push_back(disk_rows(store, static_cast<int64_t>(k)));
  return out;
}

TrainStoreTableRef train_store_of(const DiskRows* rows) {
  const auto* r = dynamic_cast<const TrainStoreDiskRows*>(rows);
  return r ? r->ref() : TrainStoreTableRef{};
}

}  // namespace jtok
