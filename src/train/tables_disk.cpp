#include "train/tables_disk.h"

#include <cstdio>
#include <filesystem>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "train/disk_tables.h"

namespace fs = std::filesystem;

namespace jtok {

void check_disk_table_options(const TableRunParts& p, bool sharded) {
  const TrainOptions& opt = p.opt;
  if (opt.table_store.empty()) fail("--tables disk needs --table-store DIR (the training store: made by a fresh run, reopened by --resume)");
  if (!(p.cfg.model.jtok || p.cfg.model.jtokm)) fail("--tables disk: the model has no token tables (set jtok or jtokm)");
  if (sharded)
    fail("--tables disk with --embp ", opt.embp, ": embedding parallelism shards the tables over the ranks' memory, while a ",
         "training store holds them on one process's disk, and the two do not combine yet. Tables larger than one machine's ",
         "memory: --embp with --tables ram over enough ranks that each rank's shard and its AdamW moments fit (`jtok embp-plan` ",
         "prints the bytes per rank); on one machine: drop --embp and mpirun and train with --tables disk");
  if (p.share.ranks > 1)
    fail("--tables disk runs on one process (", p.share.ranks, " ranks here): data-parallel ranks would all update the one ",
         "store; with mpirun, shard the tables in RAM with --embp (--tables ram), or train on one process with --tables disk");
}

namespace {

class TablesOnDisk final : public TablePlacement {
 public:
  using TablePlacement::TablePlacement;

  // Disk tables live in the store: made there from the random init, or from --init-from's tables
  // loaded into the model first.
  bool model_allocates_tables(bool resuming, bool init_from) const override { return !resuming && init_from; }
  bool model_loads_tables() const override { return false; }

  void start_fresh() override {
    const bool from_model = !p_.opt.init_from.empty();
    store_ = attach_disk_tables(p_.model, p_.opt.table_store, p_.opt.table_cache_mb << 20, std::nullopt, p_.opt.resume,
                                p_.opt.table_io_threads, p_.opt.table_io, from_model ? nullptr : &p_.cfg.train.seed);
    p_.adam = make_adamw_state(p_.model);
  }

  void check_resumable(const std::string& ck) const override {
    if (!fs::exists(fs::path(ck) / "table_store.json"))
      fail("--resume: checkpoint ", ck, " holds its token tables (no table_store.json): resume with --tables ram");
  }

  // The store rolled back to this checkpoint, and the steps its rows may still owe.
  void resume(const std::string& ck, int64_t step) override {
    store_ = attach_disk_tables(p_.model, p_.opt.table_store, p_.opt.table_cache_mb << 20, step, false,
                                p_.opt.table_io_threads, p_.opt.table_io);
    p_.adam.tables = make_table_moments(p_.model.tables, true, p_.adam.step);
    const std::string where = ck + "/table_store.json";
    restore_kept_steps(p_.adam.tables, nlohmann::json::parse(read_file(where), nullptr, false), where);
  }

  void attach(Activations&, JsonlLog&, int64_t) override {}

  // The rows of this step's micro-batches and of the next step's (the loader knows them a step
  // early) marked in the store, and their units not cached queued for its I/O threads, which read
  // them while this step computes: this step's first (its misses read in parallel), then the next
  // step's, into slots neither step needs.
  void begin_step(int64_t step, BatchSource& data) override {
    if (p_.opt.table_io_threads < 1 || !data.peek) return;
    const TrainConfig& t = p_.cfg.train;
    const int64_t G = t.gradient_accumulation_steps, N = t.micro_batch_size * t.seq_len;
    std::vector<int32_t> ids(static_cast<size_t>(2 * G * N));
    data.peek(2 * G, ids.data(), t.micro_batch_size, t.seq_len);
    store_->begin_step(step);
    store_->prefetch(ids.data(), G * N, step);
    store_->prefetch(ids.data() + G * N, G * N, step + 1);
  }
  void check() override { store_->check(); }
  bool rows_in_model() const override { return false; }

  void prepare_reads() override {}  // rows are brought current as they are read
  bool can_sample() const override { return false; }

  // The step's (and its validation's) table traffic: rows, units, read-ahead.
  void report_step(nlohmann::json& line) override {
    using S = TrainTableStore::Stats;
    const S now = store_->stats();
    nlohmann::json ts;
    auto put = [&](const char* name, int64_t S::*f) { ts[name] = step_.*f = now.*f - seen_.*f; };
    put("rows_read", &S::rows_read);
    put("rows_written", &S::rows_written);
    put("hits", &S::hits);
    put("waits", &S::waits);
    put("misses", &S::misses);
    put("units_read", &S::units_read);
    put("read_ahead", &S::read_ahead);
    put("prefetch_skipped", &S::prefetch_skipped);
    put("units_written", &S::units_written);
    put("units_logged", &S::units_logged);
    put("bytes_read", &S::bytes_read);
    put("bytes_written", &S::bytes_written);
    line["table_store"] = ts;
    seen_ = now;
  }
  // The step's units read (how many ahead of need) and written back.
  std::string progress_note() const override {
    char buf[128];
    std::snprintf(buf, sizeof buf, " | store %lld read (%lld ahead), %lld written", static_cast<long long>(step_.units_read),
                  static_cast<long long>(step_.read_ahead), static_cast<long long>(step_.units_written));
    return buf;
  }

  // The store flushed (not synced: the checkpoint keeps the steps rows owe), except at the run's
  // end, where every row is brought current so the store holds the trained tables; sealed once the
  // checkpoint is complete (the undo log starts over from it).
  std::string save_checkpoint(int64_t step, const nlohmann::json& state) override {
    if (step == p_.cfg.train.max_steps) sync_tables(p_.model, p_.adam);
    store_->flush(step);
    const std::string dir = save_on_lead(step, state);
    store_->seal(step);
    return dir;
  }

 private:
  std::shared_ptr<TrainTableStore> store_;
  TrainTableStore::Stats seen_;  // the counters at the last step line
  TrainTableStore::Stats step_;  // the last step line's traffic (the counters' differences)
};

}  // namespace

std::unique_ptr<TablePlacement> make_tables_on_disk(const TableRunParts& p) { return std::make_unique<TablesOnDisk>(p); }

}  // namespace jtok
