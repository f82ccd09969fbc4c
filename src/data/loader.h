// Data loader over token shards. Batches are (B, T) row-major int32: inputs[b*T + t] and
// targets[b*T + t] = the token after inputs[b*T + t] (inputs shifted by one).
//   random:     each row is a window at a position drawn uniformly over all shards; batch k
//               depends only on (seed, k), so the state is just the step counter.
//   sequential: rows are consecutive windows (stride T) through the shards in order, wrapping
//               around (epoch + 1) at the end.
// state() / restore() give the exact position for resume; ValidationSet is a fixed sequence.
// Every token is checked against the model's vocab size; errors name the shard.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#include "data/shard.h"

namespace jtok {

struct Batch {
  int B = 0, T = 0;
  std::vector<int32_t> inputs, targets;  // (B, T)
};

struct LoaderState {
  std::string mode = "random";  // "random" | "sequential"
  uint64_t seed = 0;
  uint64_t step = 0;    // batches served so far
  uint64_t shard = 0;   // sequential: shard of the next row
  uint64_t offset = 0;  // sequential: token offset of the next row in that shard
  uint64_t epoch = 0;   // sequential: completed passes
  bool operator==(const LoaderState&) const = default;
};
nlohmann::json to_json(const LoaderState& s);
LoaderState loader_state_from_json(const nlohmann::json& j);  // fails naming the bad field

struct LoaderOptions {
  std::string mode = "random";
  uint64_t seed = 0;
  uint32_t vocab_size = 0;          // the model's; 0: take the shards' own
  std::string tokenizer;            // expected tokenizer name; empty: any (but all shards alike)
  uint64_t tokenizer_fingerprint = 0;
};

// Shard paths matching DIR/*.bin (sorted), or the file itself if a file is given.
std::vector<std::string> list_shards(const std::string& dir_or_file);

class ShardSet;
// Every token of the set, shard after shard (each checked against the vocabulary as read() does).
std::vector<int32_t> read_all_tokens(const ShardSet& set);

class ShardSet {
 public:
  ShardSet(const std::vector<std::string>& paths, const LoaderOptions& opt);
  size_t count() const { return shards_.size(); }
  const Shard& shard(size_t i) const { return *shards_[i]; }
  uint64_t total_tokens() const { return total_; }
  // Copies n tokens of shard s from offset into out, checking each id against the vocab size.
  void read(size_t s, uint64_t offset, size_t n, int32_t* out) const;
  uint32_t vocab_size() const { return vocab_size_; }

 private:
  std::vector<std::unique_ptr<Shard>> shards_;
  uint64_t total_ = 0;
  uint32_t vocab_size_ = 0;
};

class DataLoader {
 public:
  DataLoader(const std::vector<std::string>& paths, const LoaderOptions& opt);
  Batch next_batch(int B, int T);
  // The inputs of the next n batches next_batch would give, (n,B,T); the position is unchanged.
  std::vector<int32_t> peek_inputs(int n, int B, int T);
  LoaderState state() const { return st_; }
  void restore(const LoaderState& s);  // fails if mode differs or the position is outside the data
  const ShardSet& shards() const { return set_; }

 private:
  ShardSet set_;
  LoaderState st_;
  std::vector<uint64_t> windows_cum_;  // random mode: cumulative count of window starts, per T
  int cum_T_ = -1;
};

// Fixed validation batches: all non-overlapping windows (stride T) of all shards in order,
// grouped B at a time (a last partial batch is dropped).
class ValidationSet {
 public:
  ValidationSet(const std::vector<std::string>& paths, const LoaderOptions& opt, int B, int T);
  size_t num_batches() const { return windows_.size() / size_t(B_); }
  Batch batch(size_t i) const;

 private:
  ShardSet set_;
  int B_, T_;
  std::vector<std::pair<uint32_t, uint64_t>> windows_;  // (shard, offset)
};

}  // namespace jtok
