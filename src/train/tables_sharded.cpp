#include "train/tables_sharded.h"

#include <cstdio>
#include <vector>

#include "dist/sharded_tables.h"
#include "train/shard_optimizer.h"
#include "train/jsonl_log.h"

namespace jtok {

namespace {

// No rank holds a whole table: a fresh run allocates none and each rank initialises its own rows
// (the same values as one process); a resumed one reads each rank's rows from the checkpoint.
class ShardedTablesPlacement final : public TablePlacement {
 public:
  using TablePlacement::TablePlacement;

  bool model_allocates_tables(bool, bool) const override { return false; }
  bool model_loads_tables() const override { return false; }

  void start_fresh() override {
    p_.adam = make_adamw_state(p_.model, /*tables=*/false);
    shard(nullptr);
  }
  void check_resumable(const std::string& ck) const override { refuse_table_store_checkpoint(ck); }
  void resume(const std::string& ck, int64_t) override { shard(&ck); }

  void attach(Activations& acts, JsonlLog& log, int64_t start_step) override {
    acts.tables = shards_.get();
    report(log, start_step);
  }

  void begin_step(int64_t, BatchSource&) override { shards_->clear_grads(); }
  bool rows_in_model() const override { return false; }
  double grad_sum_squares_elsewhere() override { return shards_->grad_sum_squares(); }
  void step_tables(const StepStats& st) override { opt_->step(p_.cfg.train, st, p_.adam.step); }
  // The table exchanges of this step's forwards and backwards, per rank.
  void add_exchange_bytes(nlohmann::json& bytes) override {
    const dist::TableBytes eb = shards_->take_bytes();
    std::vector<int64_t> sent, recv;
    dist::gather_pairs(p_.share, eb.sent, eb.recv, sent, recv);
    bytes["embp_sent"] = sent;
    bytes["embp_recv"] = recv;
  }

  void prepare_reads() override { sync_tables(p_.model, p_.adam); }
  void after_reads() override { shards_->take_bytes(); }  // not a training step's exchange
  bool every_rank_reads() const override { return true; }
  bool can_sample() const override { return false; }

  // Every rank writes its own rows in place, or (a fault-injection check) rank 0 gathers the whole
  // tables and writes them as a single process would.
  std::string save_checkpoint(int64_t step, const nlohmann::json& state) override {
    sync_tables(p_.model, p_.adam);
    const TrainConfig& t = p_.cfg.train;
    if (!p_.faults.gather_checkpoints) {
      const std::string dir = save_checkpoint_sharded(p_.opt.out_dir, step, p_.cfg, p_.model, p_.adam, state,
                                                      t.keep_checkpoints, opt_->owned_rows());
      return p_.lead ? dir : "";
    }
    opt_->gather_to_root(p_.model, p_.adam);  // rank 0 holds the whole tables while it writes
    if (!p_.lead) return "";
    const std::string dir = save_on_lead(step, state);
    opt_->release(p_.model, p_.adam);
    return dir;
  }

 private:
  void shard(const std::string* ck) {
    const TrainOptions& opt = p_.opt;
    shards_ = std::make_unique<dist::ShardedTables>(p_.model, dist::ShardedTables::parse_mode(opt.embp),
                                                    dist::ShardedTables::parse_owner(opt.embp_owner),
                                                    ck ? nullptr : &p_.cfg.train.seed, ck);
    opt_ = std::make_unique<ShardOptimizer>(*shards_, p_.model, p_.adam, ck);
    shards_->set_overlap(opt.embp_overlap);
  }

  // Each rank's table and moment bytes (a collective), logged and printed.
  void report(JsonlLog& log, int64_t start_step) {
    const TrainOptions& opt = p_.opt;
    std::vector<int64_t> tb, mb;
    dist::gather_pairs(p_.share, shards_->table_bytes(), opt_->moment_bytes(), tb, mb);
    log.write({{"type", "embp"}, {"step", start_step}, {"mode", opt.embp}, {"owner", opt.embp_owner},
               {"table_bytes", tb}, {"moment_bytes", mb}, {"single_process_table_bytes", shards_->single_process_table_bytes()}});
    std::printf("embp: %s, rows by %s over %lld ranks | table bytes per rank %s of %lld (+ AdamW moments x2)\n",
                opt.embp.c_str(), opt.embp_owner.c_str(), static_cast<long long>(p_.share.ranks), nlohmann::json(tb).dump().c_str(),
                static_cast<long long>(shards_->single_process_table_bytes()));
    if (p_.cfg.train.sample_interval > 0) std::printf("embp: periodic samples are off (generation does not reach sharded tables yet)\n");
  }

  std::unique_ptr<dist::ShardedTables> shards_;
  std::unique_ptr<ShardOptimizer> opt_;  // the owned rows' moments and their table optimizer
};

}  // namespace

std::unique_ptr<TablePlacement> make_sharded_tables(const TableRunParts& p) { return std::make_unique<ShardedTablesPlacement>(p); }

}  // namespace jtok
