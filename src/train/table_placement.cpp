// The placement chosen once per run (choose_table_placement), and the ram placement: every process
// holds the whole tables in the model.
#include "train/table_placement.h"

#include <filesystem>

#include "core/error.h"
#include "train/checkpoint.h"
#include "train/tables_cuda.h"
#include "train/tables_disk.h"
#include "train/tables_sharded.h"

namespace fs = std::filesystem;

namespace jtok {

std::string TablePlacement::save_on_lead(int64_t step, const nlohmann::json& state) {
  if (!p_.lead) return "";
  return jtok::save_checkpoint(p_.opt.out_dir, step, p_.cfg, p_.model, p_.adam, state, p_.cfg.train.keep_checkpoints);
}

void refuse_table_store_checkpoint(const std::string& ck) {
  if (fs::exists(fs::path(ck) / "table_store.json"))
    fail("--resume: checkpoint ", ck, " keeps its token tables in a table store (table_store.json): resume with "
         "--tables disk --table-store DIR");
}

namespace {

class TablesInRam final : public TablePlacement {
 public:
  using TablePlacement::TablePlacement;
  bool model_allocates_tables(bool, bool) const override { return true; }
  bool model_loads_tables() const override { return true; }
  void start_fresh() override { p_.adam = make_adamw_state(p_.model); }
  void check_resumable(const std::string& ck) const override { refuse_table_store_checkpoint(ck); }
  void resume(const std::string&, int64_t) override {}
  void attach(Activations&, JsonlLog&, int64_t) override {}
  void begin_step(int64_t, BatchSource&) override {}
  bool rows_in_model() const override { return true; }
  void prepare_reads() override { sync_tables(p_.model, p_.adam); }
  std::string save_checkpoint(int64_t step, const nlohmann::json& state) override {
    sync_tables(p_.model, p_.adam);
    return save_on_lead(step, state);
  }
};

}  // namespace

std::unique_ptr<TablePlacement> choose_table_placement(const TableRunParts& p) {
  const TrainOptions& opt = p.opt;
  const bool has_tables = p.cfg.model.jtok || p.cfg.model.jtokm;
  if (opt.tables != "ram" && opt.tables != "disk") fail("--tables must be ram or disk for training, got '", opt.tables, "'");
  if (!p.cfg.train.table_dedup && opt.device != "cuda")
    fail("table_dedup false (a benchmark's naive gather and scatter of the token tables, a row per position) runs "
         "with --device cuda only, not with --device ", opt.device);
  if (opt.device == "cuda" || opt.device == "loopback") return make_tables_on_gpu(p);
  const bool sharded = opt.embp != "off" && has_tables;
  if ((sharded || opt.tables == "disk") && p.cfg.train.table_optimizer == "dense-eager")
    fail("table_optimizer dense-eager (a benchmark's naive pass over every row) runs with --tables ram only, not with ",
         sharded ? "--embp" : "--tables disk");
  if (opt.tables == "disk") {
    check_disk_table_options(p, sharded);
    return make_tables_on_disk(p);
  }
  if (sharded) return make_sharded_tables(p);
  return std::make_unique<TablesInRam>(p);
}

}  // namespace jtok
