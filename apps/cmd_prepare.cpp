// `jtok prepare`: text files -> token shards. Each input file is one document; every document
// is preceded by the end-of-text token. Tokens fill shards of --shard-tokens in input order
// (a document may continue in the next shard); shards are OUT/PREFIX_000000.bin, ... written
// atomically; older PREFIX_*.bin beyond the new count are removed so the directory holds exactly
// this run's output. Also `jtok shard-info` (below).
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include "commands.h"
#include "core/error.h"
#include "data/loader.h"
#include "data/shard.h"
#include "data/tokenizer.h"

namespace {
namespace fs = std::filesystem;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) jtok::fail("prepare: cannot open input ", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void setup(CLI::App* sub) {
  static std::string name = "gpt2", dir, out, prefix = "shard", list;
  static std::vector<std::string> files;
  static uint64_t shard_tokens = 1ull << 24;
  static int threads = 0;
  sub->add_option("--tokenizer", name, "gpt2, qwen3 or llama3 (llama3: --tokenizer-dir, e.g. an imported checkpoint)")
      ->check(CLI::IsMember({"gpt2", "qwen3", "llama3"}));
  sub->add_option("--tokenizer-dir", dir, "tokenizer files (default: see jtok tokenize)");
  sub->add_option("--out", out, "output directory")->required();
  sub->add_option("--prefix", prefix, "shard file name prefix");
  sub->add_option("--shard-tokens", shard_tokens, "tokens per shard (default 16M)");
  sub->add_option("--list", list, "file with one input path per line");
  sub->add_option("--threads", threads, "threads (default: OpenMP's)");
  sub->add_option("files", files, "input text files (UTF-8), one document each");
  sub->callback([] {
    auto t0 = std::chrono::steady_clock::now();
    if (!list.empty()) {
      std::istringstream in(slurp(list));
      for (std::string line; std::getline(in, line);) if (!line.empty()) files.push_back(line);
    }
    if (files.empty()) jtok::fail("prepare: no input files");
    if (shard_tokens == 0) jtok::fail("prepare: --shard-tokens must be > 0");
    jtok::Tokenizer tok = jtok::Tokenizer::load(name, dir);
    if (threads > 0) omp_set_num_threads(threads);

    // Work items: chunks of documents at safe cut points, so one big book does not serialise.
    std::vector<std::string> texts(files.size());
    for (size_t d = 0; d < files.size(); ++d) texts[d] = slurp(files[d]);
    struct Item { size_t doc, begin, end; };
    std::vector<Item> items;
    for (size_t d = 0; d < texts.size(); ++d) {
      auto b = jtok::safe_chunk_bounds(texts[d], 1 << 16);
      for (size_t k = 0; k + 1 < b.size(); ++k) items.push_back({d, b[k], b[k + 1]});
    }
    std::vector<std::vector<int32_t>> parts(items.size());
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < items.size(); ++i) {
      std::vector<int32_t> local;  // not parts[i] directly: neighbouring headers share a cache line
      tok.encode(std::string_view(texts[items[i].doc]).substr(items[i].begin, items[i].end - items[i].begin), local);
      parts[i] = std::move(local);
    }

    std::vector<int32_t> stream;
    size_t bytes = 0;
    for (const auto& t : texts) bytes += t.size();
    for (size_t i = 0; i < items.size(); ++i) {
      if (items[i].begin == 0) {  // a document break; a tokenizer with a bos token starts the document with it
        stream.push_back(tok.eot_id());
        if (tok.bos_id() >= 0) stream.push_back(tok.bos_id());
      }
      stream.insert(stream.end(), parts[i].begin(), parts[i].end());
    }
    fs::create_directories(out);
    // Temp files of an earlier, killed run (".PREFIX_000003.bin.tmp-PID") are garbage.
    for (const auto& e : fs::directory_iterator(out)) {
      std::string f = e.path().filename().string();
      if (f.rfind("." + prefix + "_", 0) == 0 && f.find(".bin.tmp-") != std::string::npos) fs::remove(e.path());
    }
    size_t n_shards = 0;
    for (size_t start = 0; start < stream.size() || n_shards == 0; start += shard_tokens, ++n_shards) {
      size_t end = std::min<size_t>(stream.size(), start + shard_tokens);
      std::vector<int32_t> chunk(stream.begin() + start, stream.begin() + end);
      jtok::ShardInfo info;
      info.vocab_size = tok.vocab_size();
      info.tokenizer = tok.name();
      info.tokenizer_fingerprint = tok.fingerprint();
      for (int32_t t : chunk) info.n_documents += (t == tok.eot_id());
      char fname[64];
      std::snprintf(fname, sizeof fname, "%s_%06zu.bin", prefix.c_str(), n_shards);
      jtok::write_shard((fs::path(out) / fname).string(), info, chunk);
      if (end == stream.size()) { ++n_shards; break; }
    }
    // Remove stale shards of an earlier, larger run.
    for (size_t k = n_shards;; ++k) {
      char fname[64];
      std::snprintf(fname, sizeof fname, "%s_%06zu.bin", prefix.c_str(), k);
      if (!fs::remove(fs::path(out) / fname)) break;
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("prepare %s: %zu documents, %zu bytes, %zu tokens -> %zu shard(s) in %s (%.1f s)\n", name.c_str(),
                files.size(), bytes, stream.size(), n_shards, out.c_str(), s);
  });
}
const bool registered = jtok::register_command({"prepare", "tokenize text files into token shards", setup});

// `jtok shard-info PATH...`: validates shards (header, size, checksum) and prints each header as
// one JSON line; a directory means its *.bin files. Exits with an error naming the first bad one.
void setup_info(CLI::App* sub) {
  static std::vector<std::string> paths;
  sub->add_option("paths", paths, "shard files or directories")->required();
  sub->callback([] {
    for (const auto& p : paths)
      for (const auto& f : fs::is_directory(p) ? jtok::list_shards(p) : std::vector<std::string>{p}) {
        jtok::Shard s(f);
        const auto& i = s.info();
        char fp[17];
        std::snprintf(fp, sizeof fp, "%016llx", (unsigned long long)i.tokenizer_fingerprint);
        nlohmann::json j = {{"path", f}, {"version", i.version}, {"token_bytes", i.token_bytes},
                            {"vocab_size", i.vocab_size}, {"n_tokens", i.n_tokens}, {"n_documents", i.n_documents},
                            {"tokenizer", i.tokenizer}, {"tokenizer_fingerprint", fp}};
        std::printf("%s\n", j.dump().c_str());
      }
  });
}
const bool registered_info = jtok::register_command({"shard-info", "validate token shards and print their headers", setup_info});
}  // namespace
