#include "train/shard_optimizer.h"

#include <filesystem>
#include <optional>

#include "core/error.h"
#include "core/profile.h"
#include "dist/communicator.h"
#include "dist/shard_io.h"

namespace jtok {

ShardOptimizer::ShardOptimizer(dist::ShardedTables& tables, Model& m, AdamWState& st,
                               const std::string* checkpoint_dir)
    : tables_(tables) {
  std::vector<dist::TableShard>& shards = tables_.shards();
  moments_.reserve(shards.size());  // opt_ refers to them: no reallocation after
  for (auto& s : shards) moments_.push_back(make_table_moments(s.tables, true, st.step));
  if (checkpoint_dir) {  // the owned rows' moments, 4096 rows a read
    const StIndex idx =
        read_safetensors_index((std::filesystem::path(*checkpoint_dir) / "optimizer.safetensors").string());
    for (size_t k = 0; k < m.tables.size(); ++k) {
      const auto [si, t] = tables_.shard_of(static_cast<int64_t>(k));
      const TokenTable& shard = shards[static_cast<size_t>(si)].tables[static_cast<size_t>(t)];
      TableMoments& mo = moments_[static_cast<size_t>(si)];
      dist::read_owned_rows(idx, "exp_avg." + m.table_names[k], shard, mo.m[static_cast<size_t>(t)].data());
      dist::read_owned_rows(idx, "exp_avg_sq." + m.table_names[k], shard, mo.v[static_cast<size_t>(t)].data());
    }
  }
  opt_.reserve(shards.size());  // each shard's sync refers to its optimizer: no reallocation after
  for (size_t s = 0; s < shards.size(); ++s) {
    opt_.emplace_back(shards[s].tables, shards[s].grads, moments_[s]);
    shards[s].sync = opt_.back().row_sync();
  }
  release(m, st);
}

void ShardOptimizer::release(Model& m, AdamWState& st) {
  tables_.release(m);
  for (auto& v : st.tables.m) std::vector<float>().swap(v);
  for (auto& v : st.tables.v) std::vector<float>().swap(v);
  mark_tables_current(m, st);
}

void ShardOptimizer::step(const TrainConfig& t, const StepStats& st, int64_t step) {
  JTOK_PROFILE("embp_optimizer");
  tables_.finish_grads();
  const AdamWHyper h = table_adamw_hyper(t, st, step);
  for (auto& o : opt_) o.step(h, t.table_optimizer != "sparse");
}

void ShardOptimizer::sync_all() {
  tables_.finish_grads();
  for (auto& o : opt_) o.sync_all();
}

std::vector<TableRows> ShardOptimizer::owned_rows() {
  sync_all();  // the rows written must be current
  std::vector<dist::TableShard>& shards = tables_.shards();
  std::vector<TableRows> out;
  for (int64_t k = 0; k < static_cast<int64_t>(tables_.table_count()); ++k) {
    const auto [si, t] = tables_.shard_of(k);
    const TokenTable& shard = shards[static_cast<size_t>(si)].tables[static_cast<size_t>(t)];
    const TableMoments& mo = moments_[static_cast<size_t>(si)];
    TableRows r;
    r.V = shard.id_count;
    r.dim = shard.dim;
    r.rows = shard.rows;
    r.global = [first = shard.id_first, stride = shard.id_stride](int64_t row) { return first + row * stride; };
    r.w = shard.data();
    r.m = mo.m[static_cast<size_t>(t)].data();
    r.v = mo.v[static_cast<size_t>(t)].data();
    out.push_back(std::move(r));
  }
  return out;
}

void ShardOptimizer::gather_to_root(Model& m, AdamWState& st) {
  sync_all();  // the rows written must be current
  tables_.gather_to_root(m);
  const bool root = dist::rank() == 0;
  std::vector<dist::TableShard>& shards = tables_.shards();
  for (size_t k = 0; k < m.tables.size(); ++k) {
    const auto [si, t] = tables_.shard_of(static_cast<int64_t>(k));
    const dist::TableShard& s = shards[static_cast<size_t>(si)];
    const TokenTable& shard = s.tables[static_cast<size_t>(t)];
    const TableMoments& mo = moments_[static_cast<size_t>(si)];
    for (int part = 0; part < 2; ++part) {
      std::vector<float>& whole = part == 0 ? st.tables.m[k] : st.tables.v[k];
      if (root) whole.assign(static_cast<size_t>(s.own.V * s.dim), 0.0f);
      const std::vector<float>& mine = part == 0 ? mo.m[static_cast<size_t>(t)] : mo.v[static_cast<size_t>(t)];
      dist::gather_rows_to_root(s.own, shard, mine.data(), root ? whole.data() : nullptr);
    }
  }
  if (root) mark_tables_current(m, st);
}

int64_t ShardOptimizer::moment_bytes() const {
  int64_t b = 0;
  for (const auto& mo : moments_)
    for (const auto& m : mo.m) b += 2 * static_cast<int64_t>(m.size() * sizeof(float));
  return b;
}

}  // namespace jtok
