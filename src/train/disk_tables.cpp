#include "train/disk_tables.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "core/error.h"
#include "model/table_attach.h"

namespace jtok {

namespace fs = std::filesystem;

// A fresh run's store made from the random init of seed (make_model's values): every table's
// stream advances side by side, one token block after another, so no table is ever whole in memory.
static void create_from_init(const Model& m, const std::string& dir, uint64_t seed) {
  std::vector<TableInitStream> init;
  std::vector<TrainStoreTable> specs;
  for (size_t k = 0; k < m.tables.size(); ++k) {
    init.emplace_back(m, seed, static_cast<int64_t>(k));
    specs.push_back({m.table_names[k], m.tables[k].dim, 0});
  }
  TrainTableStore::create(dir, specs, m.tables[0].rows, 0,
                          [&](int64_t, int64_t k, float* values) { init[static_cast<size_t>(k)].next(values); });
}

void create_train_store(const std::string& dir, const std::vector<TokenTable>& tables, const std::vector<std::string>& names,
                        int64_t step) {
  JTOK_CHECK(!tables.empty() && tables.size() == names.size(), "training table store: ", tables.size(), " tables, ",
             names.size(), " names");
  const int64_t V = tables[0].rows;
  std::vector<TrainStoreTable> specs;
  for (size_t k = 0; k < tables.size(); ++k) {
    const TokenTable& t = tables[k];
    JTOK_CHECK(t.rows == V && t.id_count == V && t.id_first == 0 && t.dtype() == Dtype::f32, "training table store: table ",
               names[k], " is ", t.rows, " rows of ", t.id_count, " (", dtype_name(t.dtype()), "), expected ", V, " f32 rows");
    specs.push_back({names[k], t.dim, 0});
  }
  TrainTableStore::create(dir, specs, V, step,
                          [&](int64_t id, int64_t k, float* values) { tables[static_cast<size_t>(k)].read_row(id, values); });
}

std::shared_ptr<TrainTableStore> attach_disk_tables(Model& m, const std::string& dir, int64_t cache_bytes,
                                                    std::optional<int64_t> resume_step, bool reuse, int io_threads,
                                                    TableIo io, const uint64_t* init_seed) {
  JTOK_CHECK(!m.tables.empty(), "--tables disk: the model has no token tables");
  int64_t step = resume_step.value_or(0);
  if (!resume_step && !(reuse && fs::exists(dir))) {
    if (init_seed) create_from_init(m, dir, *init_seed);
    else create_train_store(dir, m.tables, m.table_names, 0);
    std::printf("table store: %s made from the %s tables\n", dir.c_str(), init_seed ? "random init of the" : "initial");
  }
  std::shared_ptr<TrainTableStore> s = TrainTableStore::open(dir, cache_bytes, step, std::max(1, io_threads), io);
  std::printf("table store: %s read with %s\n", dir.c_str(), describe_table_reads(s->direct_io(), io));
  attach_disk_rows(m, disk_rows(s), (fs::path(dir) / "manifest.json").string(), "the model");  // the RAM rows are freed
  return s;
}

nlohmann::json kept_steps_json(const std::string& store_dir, const TableMoments& st) {
  nlohmann::json consts = nlohmann::json::array();
  for (const AdamWStepConsts& c : st.consts)
    consts.push_back({std::bit_cast<uint32_t>(c.b1), std::bit_cast<uint32_t>(c.b2), std::bit_cast<uint32_t>(c.eps),
                      std::bit_cast<uint32_t>(c.step_size), std::bit_cast<uint32_t>(c.inv_sqrt_bc2),
                      std::bit_cast<uint32_t>(c.decay), std::bit_cast<uint32_t>(c.grad_scale)});
  return {{"store", fs::absolute(store_dir).string()}, {"consts_base", st.consts_base}, {"consts_f32_bits", consts}};
}

void restore_kept_steps(TableMoments& st, const nlohmann::json& j, const std::string& where) {
  try {
    st.consts_base = j.at("consts_base").get<int64_t>();
    st.consts.clear();
    for (const auto& c : j.at("consts_f32_bits")) {
      if (!c.is_array() || c.size() != 7) fail(where, ": field consts_f32_bits: each entry must be 7 integers");
      auto f = [&](int i) { return std::bit_cast<float>(c.at(i).get<uint32_t>()); };
      st.consts.push_back({f(0), f(1), f(2), f(3), f(4), f(5), f(6)});
    }
  } catch (const nlohmann::json::exception& e) {
    fail(where, ": missing or mistyped field (", e.what(), ")");
  }
}

}  // namespace jtok
