// Embedding parallelism in training: the model's token-indexed tables sharded over the
// ranks by token id (dist/embedding_parallel.h), behind the model's TableProvider hook.
//
// Each rank keeps only the rows it owns of every table (a TokenTable per table: the one row store); Model::tables
// keep their shapes but no rows, and the model reaches rows through this provider:
//   JTok     forward: the micro-batch's unique ids go to their owners, rows come back once each;
//            backward: each unique id's gradient row goes to its owner.
//   JTok-M   "premix": (id, K tables, K weights) per position to the owner, which returns the mixed
//            d-vector; backward: dL/de to the owner, K weight gradients back. "naive": the unique
//            (id, table) pairs' raw rows come back and are mixed here; backward: the pairs'
//            gradient rows go to the owners. "premix-dedup" (the paper's EmbP + Dedup): per id and
//            micro-batch, premix its positions or fetch its distinct rows, whichever moves fewer
//            bytes (dist::premix_cheaper, the rule `jtok embp-plan` evaluates).
// The owners accumulate the tables' gradients (in a fixed order); the trainer's table optimizer
// (train/table_optimizer.h, over shards()) updates the owned rows, and brings a row current through
// each shard's sync before an owner answers a request for it. The global gradient norm includes
// every rank's shard (grad_sum_squares).
// No rank holds a whole table: a fresh run initialises each rank's rows alone (init_seed), a resumed
// one reads them from the checkpoint (checkpoint_dir, dist/shard_io.h); the trainer writes
// checkpoints from the shards in place, or gathers them to rank 0 (gather_to_root) as the
// reference the in-place files are tested against.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/communicator.h"
#include "dist/embedding_parallel.h"
#include "model/transformer.h"

namespace jtok::dist {

class ShardedTables : public TableProvider {
 public:
  // premix: every position premixed by the owner (d per position each way); naive: the unique
  // (id, table) pairs' raw rows fetched and mixed here; premix-dedup: per id and micro-batch,
  // whichever of the two moves fewer bytes (dist::premix_cheaper), the paper's EmbP + Dedup.
  enum class Mode { kPremix, kNaive, kPremixDedup };
  static Mode parse_mode(const std::string& s);            // "premix" | "naive" | "premix-dedup"
  static RowOwner::Kind parse_owner(const std::string& s);  // "mod" | "contiguous"

  // Takes this rank's rows out of m's tables and leaves them without rows. Every rank must hold
  // the same whole tables when called (rows current).
  // With init_seed: m's tables have no rows (make_model with tables = false) and this rank's rows
  // get make_model(m.cfg, *init_seed)'s random init, generated row by row
  // (for_each_table_init_row: the same values, no whole table ever held).
  // With checkpoint_dir (a resume: m loaded by load_checkpoint(.., tables = false)): this rank's
  // rows are read from the checkpoint's model.safetensors, a block of rows at a time.
  ShardedTables(Model& m, Mode mode, RowOwner::Kind owner, const uint64_t* init_seed = nullptr,
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
  void finish_grads();  // every gradient push completed: the shards' gradients are final
  // Sum of squares of every rank's shard gradients (a collective; the same on every rank).
  double grad_sum_squares();  // completes the gradient pushes in flight first
  // This rank's shards (per JTok table, per JTok-M layer), for the trainer's table optimizer and
  // checkpoints; shard_of(k) = (shard, table within it) of model table k.
  std::vector<TableShard>& shards() { return shards_; }
  std::pair<int, int> shard_of(int64_t k) const { return where_[static_cast<size_t>(k)]; }
  size_t table_count() const { return where_.size(); }
  // Rank 0 gets the whole tables back into m (a collective), e.g. to write a checkpoint; release()
  // takes them out again.
  void gather_to_root(Model& m);
  void release(Model& m);

  TableBytes take_bytes();  // exchanged since the last call
  int64_t table_bytes() const;  // this rank's rows
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
  std::vector<Naive> naive_;                 // per shard
  // One JTok-M layer's exchanges in flight: premix (the premixed positions: state and exchange)
  // and the rows of the pairs fetched instead (naive, premix-dedup's other ids).
  struct Posted {
    PremixState premix;
    std::vector<std::vector<int32_t>> pair_where;  // per owner: the pair of each row request
    std::unique_ptr<RequestReply> premix_fwd, pairs_fwd, premix_bwd;
  };
  std::vector<Posted> posted_;               // per shard
  std::vector<std::unique_ptr<RequestReply>> pushes_;  // gradient pushes in flight, in posting order
  std::vector<int> push_shard_;                        // the shard of each
  void post_mix(int64_t table_base, const int32_t* ids, const int32_t* sel, const float* w, int64_t N, int64_t K);
  std::vector<char> premixed_positions(const TableShard& sh, const int32_t* ids, const int32_t* sel, int64_t N, int64_t K) const;
  void post_mix_backward(int64_t table_base, const float* de, int64_t N, int64_t K);
  void mix_fetched(float* e, int s, const float* w, int64_t N, int64_t K);
  void mix_backward_fetched(float* dw, int s, const float* de, int64_t N, int64_t K);
  bool overlap_ = true;
  void post_push(std::vector<std::vector<int32_t>> msg, int s, int64_t t, bool pairs);
  void progress_pushes();
  std::vector<int64_t> jtok_tables_;         // model table index of each JTok table, layer order
  std::unique_ptr<RequestReply> pre_;        // this forward's JTok exchange
  std::vector<int32_t> pre_ids_;             // its unique ids
  std::vector<std::vector<int32_t>> pre_where_;  // per owner: index u of each requested id
  TableBytes bytes_;
  int64_t whole_bytes_ = 0;
};

}  // namespace jtok::dist
