// Embedding parallelism in training: the model's token-indexed tables sharded over the
// ranks by token id (dist/embedding_parallel.h), behind the model's TableProvider hook.
//
// Each rank keeps only the rows it owns of every table, with their AdamW moments; Model::tables
// keep their shapes but no rows, and the model reaches rows through this provider:
//   JTok     forward: the micro-batch's unique ids go to their owners, rows come back once each;
//            backward: each unique id's gradient row goes to its owner.
//   JTok-M   "premix": (id, K tables, K weights) per position to the owner, which returns the mixed
//            d-vector; backward: dL/de to the owner, K weight gradients back. "naive": the unique
//            (id, table) pairs' raw rows come back and are mixed here; backward: the pairs'
//            gradient rows go to the owners. "premix-dedup" (the paper's EmbP + Dedup): per id and
//            micro-batch, premix its positions or fetch its distinct rows, whichever moves fewer
//            bytes (dist::premix_cheaper, the rule `jtok embp-plan` evaluates).
// The owners accumulate the tables' gradients (in a fixed order) and update their rows with AdamW:
// table_optimizer "dense" keeps torch's semantics (every row moves every step) deferred and exact,
// as train/optimizer.h does for local tables: only rows with a gradient are updated, after
// replaying the zero-gradient steps they missed, and an owner brings a row current before it
// answers a request for it (TableShard::sync); "sparse" updates the rows with a gradient only. The global gradient norm includes every rank's shard (grad_sum_squares).
// No rank holds a whole table: a fresh run initialises each rank's rows alone (init_seed), a resumed
// one reads them from the checkpoint (checkpoint_dir), and a checkpoint is written
// by every rank in place (owned_rows, train/checkpoint.h save_checkpoint_sharded); gather_to_root
// (rank 0 gathers the whole tables) remains as the reference the in-place files are tested against.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/communicator.h"
#include "dist/embedding_parallel.h"
#include "model/transformer.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"

namespace jtok::dist {

class ShardedTables : public TableProvider {
 public:
  // premix: every position premixed by the owner (d per position each way); naive: the unique
  // (id, table) pairs' raw rows fetched and mixed here; premix-dedup: per id and micro-batch,
  // whichever of the two moves fewer bytes (dist::premix_cheaper), the paper's EmbP + Dedup.
  enum class Mode { kPremix, kNaive, kPremixDedup };
  static Mode parse_mode(const std::string& s);            // "premix" | "naive" | "premix-dedup"
  static RowOwner::Kind parse_owner(const std::string& s);  // "mod" | "contiguous"

  // Takes this rank's rows (values and AdamW moments, brought current first) out of m and st and
  // leaves m.tables without rows. Every rank must hold the same whole tables when called.
  // With init_seed: m's tables have no rows (make_model with tables = false; st without table
  // moments) and this rank's rows get make_model(m.cfg, *init_seed)'s random init, generated row by
  // row (for_each_table_init_row: the same values, no whole table ever held), moments zero.
  // With checkpoint_dir (a resume: m and st loaded by load_checkpoint(.., tables = false)): this rank's
  // rows and their moments are read from the checkpoint's files, a block of rows at a time.
  ShardedTables(Model& m, AdamWState& st, Mode mode, RowOwner::Kind owner, const uint64_t* init_seed = nullptr,
                const std::string* checkpoint_dir = nullptr);

  // TableProvider (collectives: every rank calls them in the same order).
  void rows(float* out, int64_t table, const RowBatch& rb) override;
  void row_grads(int64_t table, SparseRowGrad& g) override;
  void mix(float* e, int64_t table_base, const int32_t* ids, const int32_t* sel, const float* w, int64_t N,
           int64_t K) override;
  void mix_backward(float* dw, int64_t table_base, const float* de, int64_t N, int64_t K) override;
  // With overlap (the default): JTok-M's exchanges are posted (RequestReply) when the model
  // announces them, the forward's after the layer's router (before its attention), the backward's
  // when dL/de is known (before the layer's MLP and attention backward), and mix / mix_backward
  // complete them; the JTok backward's row gradients and naive's pair gradients are pushed to
  // their owners without waiting, and the owners add them as they arrive in a fixed order (posting
  // order, then source rank: the order of the blocking path, so the same bits). Without overlap,
  // every exchange is a blocking MPI_Alltoallv where the model calls it (embedding_parallel.h).
  void mix_post(int64_t table_base, const int32_t* ids, const int32_t* sel, const float* w, int64_t N,
                int64_t K) override;
  void mix_backward_post(int64_t table_base, const float* de, int64_t N, int64_t K) override;
  void set_overlap(bool on) { overlap_ = on; }
  bool overlap() const { return overlap_; }
  // JTok's rows for all JTok tables, one non-blocking exchange per forward (RequestReply): the
  // unique ids go to their owners once (4 B per remote id, not once per layer), the owners answer
  // with the rows of every JTok table (4d B per table); rows() waits for them at the first JTok
  // layer.
  void prefetch(const RowBatch& rb) override;
  void poll() override;

  void clear_grads();
  // Sum of squares of every rank's shard gradients (a collective; the same on every rank).
  double grad_sum_squares();  // completes the gradient pushes in flight first
  // AdamW on the owned rows with the step optimizer_step just took.
  void optimizer_step(const TrainConfig& t, const StepStats& st, int64_t step);
  // Rank 0 gets the whole tables and moments back into m and st (a collective), e.g. to write a
  // checkpoint; release() takes them out again.
  void gather_to_root(Model& m, AdamWState& st);
  // This rank's rows of every model table, brought current (for save_checkpoint_sharded: each rank
  // writes its own rows in place, no whole table anywhere). Valid until the next step.
  std::vector<TableRows> owned_rows();
  void release(Model& m, AdamWState& st);

  ExchangeBytes2 take_bytes();  // exchanged since the last call
  int64_t table_bytes() const;  // this rank's rows
  int64_t moment_bytes() const;
  int64_t single_process_table_bytes() const { return whole_bytes_; }
  Mode mode() const { return mode_; }

 private:
  struct Naive {  // what the naive backward needs of its forward
    std::vector<int32_t> pair_ids, pair_tables, slot;  // slot (N, K): pair of each (position, k)
    std::vector<float> rows;                            // (S, d)
    std::vector<float> w;                               // (N, K)
  };
  Mode mode_;
  std::vector<TableShard> shards_;           // per JTok table, per JTok-M layer (its n_e tables)
  std::vector<std::pair<int, int>> where_;   // model table -> (shard, table within it)
  std::vector<PremixState> premix_;          // per shard
  std::vector<Naive> naive_;                 // per shard
  // Overlap: one JTok-M layer's posted exchanges.
  struct Posted {
    int64_t N = 0, K = 0;
    std::vector<std::vector<int32_t>> where;   // per owner: position (premix) or pair (naive) of each request
    std::vector<std::vector<int32_t>> where2;  // premix-dedup: per owner, the pair of each row request
    std::vector<std::vector<int32_t>> recv;    // premix, as owner: each source's forward requests (1 + 2K words)
    std::unique_ptr<RequestReply> fwd, bwd;    // fwd: premix requests (naive: row requests)
    std::unique_ptr<RequestReply> fwd2;        // premix-dedup: the row requests
  };
  std::vector<Posted> posted_;               // per shard
  std::vector<std::unique_ptr<RequestReply>> pushes_;  // gradient pushes in flight, in posting order
  std::vector<int> push_shard_;                        // the shard of each
  RequestReply::Serve premix_serve(int si, int64_t K);
  RequestReply::Serve naive_serve(int si);
  void post_mix(int64_t table_base, const int32_t* ids, const int32_t* sel, const float* w, int64_t N, int64_t K);
  void post_mix_backward(int64_t table_base, const float* de, int64_t N, int64_t K);
  bool overlap_ = true;
  void post_push(std::vector<std::vector<int32_t>> msg, int64_t item, int s, int64_t t, bool pairs);
  void progress_pushes();
  void finish_pushes();  // every push completed: the shards' gradients are final
  // Deferred dense AdamW: row r of table t of shard s has had row_step_[s][t][r] steps; the
  // constants of the steps after consts_base_ are kept (step k: consts_[k - consts_base_ - 1]).
  std::vector<std::vector<std::vector<int32_t>>> row_step_;
  std::vector<AdamWStepConsts> consts_;
  int64_t consts_base_ = 0;
  int64_t tables_step() const { return consts_base_ + static_cast<int64_t>(consts_.size()); }
  void catch_up(int s, int64_t t, int64_t r, int64_t to);
  void sync_all();  // every owned row current; the kept constants dropped
  std::vector<int64_t> jtok_tables_;         // model table index of each JTok table, layer order
  std::unique_ptr<RequestReply> pre_;        // this forward's JTok exchange
  std::vector<int32_t> pre_ids_;             // its unique ids
  std::vector<std::vector<int32_t>> pre_where_;  // per owner: index u of each requested id
  ExchangeBytes2 bytes_;
  int64_t whole_bytes_ = 0;
};

}  // namespace jtok::dist
