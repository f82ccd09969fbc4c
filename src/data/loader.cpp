// Loader over mmapped shards. Random mode hashes (seed, step, row) into a window position so
// any batch can be regenerated from the state alone.
#include "data/loader.h"

#include <type_traits>
#include <algorithm>
#include <filesystem>
#include <utility>
#include "core/error.h"
#include "core/json_int.h"
#include "core/splitmix.h"

namespace jtok {
namespace fs = std::filesystem;

nlohmann::json to_json(const LoaderState& s) {
  return {{"mode", s.mode}, {"seed", s.seed}, {"step", s.step}, {"shard", s.shard}, {"offset", s.offset}, {"epoch", s.epoch}};
}

LoaderState loader_state_from_json(const nlohmann::json& j) {
  LoaderState s;
  auto field = [&](const char* k, auto& v) {
    if (!j.contains(k)) fail("loader state: missing field '", k, "'");
    const nlohmann::json& x = j.at(k);
    if constexpr (std::is_integral_v<std::remove_reference_t<decltype(v)>>) {
      static_assert(std::is_same_v<std::remove_reference_t<decltype(v)>, uint64_t>);
      const auto u = json_uint64(x);  // not a float (1e300), not a negative wrapped to 2^64 - 1
      if (!u) fail("loader state: field '", k, "' must be a non-negative integer, got ", x.dump());
      v = *u;
    } else {
      try { x.get_to(v); } catch (const nlohmann::json::exception&) { fail("loader state: field '", k, "' has the wrong type"); }
    }
  };
  field("mode", s.mode);
  field("seed", s.seed);
  field("step", s.step);
  field("shard", s.shard);
  field("offset", s.offset);
  field("epoch", s.epoch);
  if (s.mode != "random" && s.mode != "sequential") fail("loader state: mode '", s.mode, "' (expected random or sequential)");
  return s;
}

std::vector<std::string> list_shards(const std::string& p) {
  std::vector<std::string> out;
  if (fs::is_regular_file(p)) return {p};
  if (!fs::is_directory(p)) fail("shards: ", p, " is neither a shard file nor a directory");
  for (const auto& e : fs::directory_iterator(p))
    if (e.is_regular_file() && e.path().extension() == ".bin" && e.path().filename().string()[0] != '.')
      out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  if (out.empty()) fail("shards: no *.bin files in ", p, " (run jtok prepare or scripts/prepare_data.sh)");
  return out;
}

ShardSet::ShardSet(const std::vector<std::string>& paths, const LoaderOptions& opt) {
  if (paths.empty()) fail("data loader: no shards given");
  for (const auto& p : paths) {
    auto s = std::make_unique<Shard>(p);
    const ShardInfo& in = s->info();
    if (!opt.tokenizer.empty()) s->check_tokenizer(opt.tokenizer, opt.tokenizer_fingerprint);
    else if (!shards_.empty()) {
      const ShardInfo& f = shards_[0]->info();
      if (in.tokenizer != f.tokenizer || in.tokenizer_fingerprint != f.tokenizer_fingerprint)
        fail("shard ", p, ": made by tokenizer '", in.tokenizer, "' but ", shards_[0]->path(), " by '", f.tokenizer,
             "' (fingerprints differ); all shards must come from one tokenizer");
    }
    if (opt.vocab_size && in.vocab_size > opt.vocab_size)
      fail("shard ", p, ": made for a vocabulary of ", in.vocab_size, " tokens, larger than the model's ", opt.vocab_size);
    total_ += in.n_tokens;
    shards_.push_back(std::move(s));
  }
  vocab_size_ = opt.vocab_size ? opt.vocab_size : shards_[0]->info().vocab_size;
}

void ShardSet::read(size_t s, uint64_t offset, size_t n, int32_t* out) const {
  const Shard& sh = *shards_[s];
  JTOK_CHECK(offset + n <= sh.size());
  for (size_t i = 0; i < n; ++i) {
    uint32_t t = sh.token(offset + i);
    if (t >= vocab_size_)
      fail("shard ", sh.path(), ": token id ", t, " at position ", offset + i, " is >= the model's vocab size ", vocab_size_);
    out[i] = int32_t(t);
  }
}

DataLoader::DataLoader(const std::vector<std::string>& paths, const LoaderOptions& opt) : set_(paths, opt) {
  if (opt.mode != "random" && opt.mode != "sequential") fail("data loader: mode '", opt.mode, "' (expected random or sequential)");
  st_.mode = opt.mode;
  st_.seed = opt.seed;
}

void DataLoader::restore(const LoaderState& s) {
  if (s.mode != st_.mode) fail("loader state: mode '", s.mode, "' but this loader is '", st_.mode, "'");
  if (s.mode == "sequential" && (s.shard >= set_.count() || s.offset > set_.shard(s.shard).size()))
    fail("loader state: position shard ", s.shard, " offset ", s.offset, " is outside the data (", set_.count(), " shards)");
  st_ = s;
}

namespace {
// A (B, T) batch whose rows BatchRows::fill sets.
struct BatchRows {
  Batch b;
  std::vector<int32_t> row;  // T + 1 tokens
  BatchRows(int B, int T) : row(size_t(T) + 1) {
    b.B = B;
    b.T = T;
    b.inputs.resize(size_t(B) * T);
    b.targets.resize(size_t(B) * T);
  }
  // Row r: the T + 1 tokens of shard s from offset off; the inputs are its first T, the targets its last T.
  void fill(const ShardSet& set, int r, size_t s, uint64_t off) {
    set.read(s, off, row.size(), row.data());
    std::copy(row.begin(), row.end() - 1, b.inputs.begin() + size_t(r) * b.T);
    std::copy(row.begin() + 1, row.end(), b.targets.begin() + size_t(r) * b.T);
  }
};
}  // namespace

Batch DataLoader::next_batch(int B, int T) {
  if (B <= 0 || T <= 0) fail("data loader: batch shape (", B, ", ", T, ") must be positive");
  BatchRows out(B, T);
  auto emit = [&](int r, size_t s, uint64_t off) { out.fill(set_, r, s, off); };
  if (st_.mode == "random") {
    if (cum_T_ != T) {  // window starts per shard: n - T (a window needs T + 1 tokens)
      windows_cum_.assign(set_.count() + 1, 0);
      for (size_t s = 0; s < set_.count(); ++s) {
        uint64_t n = set_.shard(s).size();
        windows_cum_[s + 1] = windows_cum_[s] + (n > uint64_t(T) ? n - T : 0);
      }
      cum_T_ = T;
    }
    uint64_t total = windows_cum_.back();
    if (total == 0) fail("data loader: no shard has ", T + 1, " tokens (first shard ", set_.shard(0).path(), ")");
    uint64_t x = st_.seed * 0x2545F4914F6CDD1DULL + st_.step;
    for (int r = 0; r < B; ++r) {
      uint64_t g = splitmix64(x) % total;
      size_t s = size_t(std::upper_bound(windows_cum_.begin(), windows_cum_.end(), g) - windows_cum_.begin()) - 1;
      emit(r, s, g - windows_cum_[s]);
    }
  } else {
    for (int r = 0; r < B; ++r) {
      size_t tried = 0;
      while (st_.offset + T + 1 > set_.shard(st_.shard).size()) {  // row does not fit: next shard
        st_.offset = 0;
        if (++st_.shard == set_.count()) { st_.shard = 0; ++st_.epoch; }
        if (++tried > set_.count())
          fail("data loader: no shard has ", T + 1, " tokens (first shard ", set_.shard(0).path(), ")");
      }
      emit(r, st_.shard, st_.offset);
      st_.offset += T;
    }
  }
  ++st_.step;
  return std::move(out.b);
}

std::vector<int32_t> DataLoader::peek_inputs(int n, int B, int T) {
  const LoaderState at = st_;
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(n) * B * T);
  try {
    for (int i = 0; i < n; ++i) {
      const Batch b = next_batch(B, T);
      out.insert(out.end(), b.inputs.begin(), b.inputs.end());
    }
  } catch (...) {
    st_ = at;
    throw;
  }
  st_ = at;
  return out;
}

ValidationSet::ValidationSet(const std::vector<std::string>& paths, const LoaderOptions& opt, int B, int T)
    : set_(paths, opt), B_(B), T_(T) {
  if (B <= 0 || T <= 0) fail("validation set: batch shape (", B, ", ", T, ") must be positive");
  for (size_t s = 0; s < set_.count(); ++s)
    for (uint64_t off = 0; off + T + 1 <= set_.shard(s).size(); off += T) windows_.emplace_back(uint32_t(s), off);
}

Batch ValidationSet::batch(size_t i) const {
  if (i >= num_batches()) fail("validation set: batch ", i, " of ", num_batches());
  BatchRows out(B_, T_);
  for (int r = 0; r < B_; ++r) {
    auto [s, off] = windows_[i * B_ + r];
    out.fill(set_, r, s, off);
  }
  return std::move(out.b);
}

std::vector<int32_t> read_all_tokens(const ShardSet& set) {
  std::vector<int32_t> tokens(set.total_tokens());
  size_t at = 0;
  for (size_t s = 0; s < set.count(); ++s) {
    set.read(s, 0, set.shard(s).size(), tokens.data() + at);
    at += set.shard(s).size();
  }
  return tokens;
}

}  // namespace jtok
