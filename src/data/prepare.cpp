#include "data/prepare.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string_view>

#include "data/shard.h"
#include "data/text_inputs.h"

namespace jtok {
namespace fs = std::filesystem;

namespace {
std::string shard_name(const std::string& prefix, size_t k) {
  char fname[64];
  std::snprintf(fname, sizeof fname, "%s_%06zu.bin", prefix.c_str(), k);
  return fname;
}

// Temp files of an earlier, killed run (".PREFIX_000003.bin.tmp-PID") are garbage.
void remove_stale_temp_files(const std::string& out, const std::string& prefix) {
  for (const auto& e : fs::directory_iterator(out)) {
    std::string f = e.path().filename().string();
    if (f.rfind("." + prefix + "_", 0) == 0 && f.find(".bin.tmp-") != std::string::npos) fs::remove(e.path());
  }
}

// Removes PREFIX_<first>.bin, PREFIX_<first+1>.bin, ... up to the first that does not exist.
void remove_shards_from(const std::string& out, const std::string& prefix, size_t first) {
  for (size_t k = first;; ++k)
    if (!fs::remove(fs::path(out) / shard_name(prefix, k))) break;
}
}  // namespace

std::vector<int32_t> tokenize_documents(const Tokenizer& tok, const std::vector<std::string>& documents) {
  struct Item { size_t doc, begin, end; };
  std::vector<Item> items;
  for (size_t d = 0; d < documents.size(); ++d) {
    auto b = safe_chunk_bounds(documents[d], 1 << 16);
    for (size_t k = 0; k + 1 < b.size(); ++k) items.push_back({d, b[k], b[k + 1]});
  }
  std::vector<std::vector<int32_t>> parts(items.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < items.size(); ++i) {
    std::vector<int32_t> local;  // not parts[i] directly: neighbouring headers share a cache line
    tok.encode(std::string_view(documents[items[i].doc]).substr(items[i].begin, items[i].end - items[i].begin), local);
    parts[i] = std::move(local);
  }
  std::vector<int32_t> stream;
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].begin == 0) {  // a document break; a tokenizer with a bos token starts the document with it
      stream.push_back(tok.eot_id());
      if (tok.bos_id() >= 0) stream.push_back(tok.bos_id());
    }
    stream.insert(stream.end(), parts[i].begin(), parts[i].end());
  }
  return stream;
}

size_t write_token_shards(const Tokenizer& tok, const std::vector<int32_t>& stream, const std::string& out,
                          const std::string& prefix, uint64_t shard_tokens) {
  fs::create_directories(out);
  remove_stale_temp_files(out, prefix);
  size_t n_shards = 0;
  for (size_t start = 0; start < stream.size() || n_shards == 0; start += shard_tokens, ++n_shards) {
    size_t end = std::min<size_t>(stream.size(), start + shard_tokens);
    std::vector<int32_t> chunk(stream.begin() + start, stream.begin() + end);
    ShardInfo info;
    info.vocab_size = tok.vocab_size();
    info.tokenizer = tok.name();
    info.tokenizer_fingerprint = tok.fingerprint();
    for (int32_t t : chunk) info.n_documents += (t == tok.eot_id());
    write_shard((fs::path(out) / shard_name(prefix, n_shards)).string(), info, chunk);
    if (end == stream.size()) { ++n_shards; break; }
  }
  remove_shards_from(out, prefix, n_shards);  // the stale shards of an earlier, larger run
  return n_shards;
}

PrepareReport prepare_shards(const Tokenizer& tok, const std::vector<std::string>& files, const std::string& out,
                             const std::string& prefix, uint64_t shard_tokens) {
  std::vector<std::string> texts(files.size());
  for (size_t d = 0; d < files.size(); ++d) texts[d] = read_input_file(files[d], "prepare");
  PrepareReport r;
  for (const auto& t : texts) r.bytes += t.size();
  const std::vector<int32_t> stream = tokenize_documents(tok, texts);
  r.tokens = stream.size();
  r.shards = write_token_shards(tok, stream, out, prefix, shard_tokens);
  return r;
}

}  // namespace jtok
