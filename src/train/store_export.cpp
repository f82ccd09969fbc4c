#include "train/store_export.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "store/table_store.h"
#include "store/train_store_snapshot.h"
#include "ops/int4_rows.h"
#include "ops/lowp_linear.h"
#include "train/disk_tables.h"
#include "train/table_optimizer.h"
#include "train/trainer_state.h"

namespace jtok {

namespace fs = std::filesystem;

namespace {

nlohmann::json read_json(const std::string& path) {
  try {
    return nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail(path, " is not valid JSON: ", e.what());
  }
}

// For each of m's tables, its index in the training store (names and shapes checked, naming the manifest).
std::vector<size_t> match_tables(const Model& m, const TrainStoreLayout& l) {
  if (l.tables.size() != m.tables.size()) fail(l.manifest, ": ", l.tables.size(), " tables, the model has ", m.tables.size());
  std::vector<size_t> src;
  for (size_t k = 0; k < m.tables.size(); ++k) {
    const auto it = std::find_if(l.tables.begin(), l.tables.end(), [&](const TrainStoreTable& t) { return t.name == m.table_names[k]; });
    if (it == l.tables.end()) fail(l.manifest, ": no table ", m.table_names[k], " (the model has it)");
    if (it->dim != m.tables[k].dim || l.ids != m.tables[k].rows)
      fail(l.manifest, ": table ", it->name, " is ", l.ids, " x ", it->dim, ", the model's ", m.tables[k].rows, " x ", m.tables[k].dim);
    src.push_back(static_cast<size_t>(it - l.tables.begin()));
  }
  return src;
}

// out (d elements of dt, and *scale for int8 / int4) = row p (d floats).
void store_row_as(Dtype dt, const float* p, int64_t d, void* out, float* scale) {
  if (dt == Dtype::f32) std::memcpy(out, p, static_cast<size_t>(4 * d));
  else if (dt == Dtype::bf16) quantize_bf16(static_cast<uint16_t*>(out), p, d);
  else if (dt == Dtype::int8) quantize_int8_rows(static_cast<int8_t*>(out), scale, p, 1, d);
  else quantize_int4_rows(static_cast<uint8_t*>(out), scale, p, 1, d);
}

}  // namespace

std::optional<std::string> disk_tables_store(const std::string& ckpt_dir) {
  const std::string where = (fs::path(ckpt_dir) / "table_store.json").string();
  if (!fs::exists(where)) return std::nullopt;
  const nlohmann::json j = read_json(where);
  if (!j.is_object() || !j.contains("store") || !j["store"].is_string()) fail(where, ": no field store (the training store's directory)");
  return j["store"].get<std::string>();
}

StoreExportStats export_disk_tables(const std::string& ck, const Model& m, const std::string& out, Dtype dt) {
  const std::string where = (fs::path(ck) / "table_store.json").string();
  const std::string store = disk_tables_store(ck).value_or("");
  if (store.empty()) fail("checkpoint ", ck, " has no table_store.json: its tables are in model.safetensors");
  if (!fs::exists(store)) fail(where, " names the table store ", store, ", which does not exist (moved or deleted?)");
  TableMoments st;  // the AdamW constants of the steps rows may still owe
  restore_kept_steps(st, read_json(where), where);
  const std::string sp = (fs::path(ck) / "trainer_state.json").string();
  const int64_t step = parse_trainer_state(read_json(sp), sp).step;
  if (st.current_step() != step)
    fail(where, ": its kept AdamW steps end at step ", st.current_step(), ", the checkpoint is at step ", step);
  const auto snap = TrainStoreSnapshot::open(store, step, ck);
  const TrainStoreLayout& l = snap->layout();
  const std::vector<size_t> src = match_tables(m, l);
  std::vector<TableStoreSpec> specs;
  for (size_t k = 0; k < m.tables.size(); ++k) specs.push_back({m.table_names[k], m.tables[k].dim, dt});
  TableStoreSource source;
  source.checkpoint = dir_basename(ck);
  source.step = step;
  source.train_store = dir_basename(store);
  source.train_store_step = step;  // the snapshot is the store at `step`
  StoreExportStats s{l.ids, static_cast<int64_t>(specs.size()), snap->units_from_log(), 0};
  std::vector<uint8_t> unit(static_cast<size_t>(l.unit_bytes));
  std::vector<float> row;
  int64_t cached = -1;  // the unit in `unit`
  write_table_store(out, l.ids, specs, [&](int64_t id, int64_t k, void* raw, float* scale) {
    if (id / l.per_page != cached) snap->read_unit(cached = id / l.per_page, unit.data());
    const TrainStoreTable& t = l.tables[src[static_cast<size_t>(k)]];
    const int64_t d = t.dim;
    const uint8_t* b = unit.data() + (id % l.per_page) * l.block_bytes + t.offset;
    row.resize(static_cast<size_t>(3 * d));  // value, exp_avg, exp_avg_sq
    int32_t have;
    t.layout().read(b, row.data(), row.data() + d, row.data() + 2 * d, &have);
    if (have > step || (!st.consts.empty() && have < st.consts_base))
      fail(l.data_path, ": token ", id, " of ", t.name, " is at step ", have, "; the checkpoint ", ck, " (step ", step,
           ") keeps the AdamW steps ", st.consts_base + 1, "..", step, " (the store is not this checkpoint's)");
    if (!st.consts.empty() && have < step) {
      replay_steps(row.data(), row.data() + d, row.data() + 2 * d, d, have, step, st);
      ++s.rows_replayed;
    }
    store_row_as(dt, row.data(), d, raw, scale);
  }, source);
  try {
    snap->check_unchanged();
  } catch (...) {
    fs::remove_all(out);
    throw;
  }
  return s;
}

void write_table_store(const std::string& dir, const std::vector<TokenTable>& tables, const std::vector<std::string>& names,
                       const TableStoreSource& source) {
  JTOK_CHECK(!tables.empty() && tables.size() == names.size(), "table store: ", tables.size(), " tables, ", names.size(), " names");
  const int64_t V = tables[0].rows;
  std::vector<TableStoreSpec> specs;
  for (size_t k = 0; k < tables.size(); ++k) {
    const TokenTable& t = tables[k];
    JTOK_CHECK(t.rows == V && t.id_count == V && t.id_first == 0, "table store: table ", names[k], " has ", t.rows,
               " rows of ", t.id_count, ", the first ", V);
    specs.push_back({names[k], t.dim, t.dtype()});
  }
  write_table_store(dir, V, specs, [&](int64_t id, int64_t k, void* raw, float* scale) {
    const TokenTable& t = tables[static_cast<size_t>(k)];
    std::memcpy(raw, t.raw_row(id), static_cast<size_t>(t.row_stride_bytes()));
    if (dtype_scaled(t.dtype())) *scale = t.scales()[id];
  }, source);
}

}  // namespace jtok
