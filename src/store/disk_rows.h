// The rows of one token table kept by a disk store, as the model's one view reads them
// (TokenTable::on_disk, model/token_table.h): all the model knows of a store. The token-major
// serving store (store/table_store.h) and the training store (store/train_table_store.h) each hand
// out one DiskRows per table (disk_rows()); a new storage implements this and nothing in the
// model changes.
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace jtok {

class DiskRows {
 public:
  virtual ~DiskRows() = default;
  virtual const std::string& name() const = 0;  // the table's name in the store's manifest
  virtual int64_t ids() const = 0;              // rows: one per token id
  virtual int64_t dim() const = 0;
  virtual Dtype dtype() const = 0;
  virtual const std::string& dir() const = 0;   // the store's directory (for messages)
  // raw = the row of id (dim elements of dtype(), dtype_row_bytes) and, int8 / int4, *scale its
  // scale. Thread-safe and never throws (the gathers call it in parallel loops): a failed read gives
  // zeros and is reported later (take_error, or the training store's check()).
  virtual void read_row(int64_t id, void* raw, float* scale) const = 0;
  // Read-ahead: the store starts reading the rows of ids[0..n) (of every table it holds) and
  // returns at once, with the reads queued. 0 where the store reads ahead another way (the
  // training store: the trainer marks each step's ids).
  virtual int64_t prefetch(const int32_t* ids, int64_t n) const { return 0; }
  // The first failed read since the last call, naming the file; "" when none.
  virtual std::string take_error() const { return {}; }
  // True when a trainer updates these rows in the store (a training store's): a checkpoint neither
  // copies nor scans them.
  virtual bool trained_in_store() const { return false; }
};

}  // namespace jtok
