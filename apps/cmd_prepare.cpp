// `jtok prepare`: text files -> token shards (src/data/prepare.h says how). Also `jtok shard-info`
// (below).
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include "commands.h"
#include "core/error.h"
#include "data/loader.h"
#include "data/prepare.h"
#include "data/text_inputs.h"
#include "data/shard.h"
#include "data/tokenizer.h"

namespace cmd_prepare {
namespace fs = std::filesystem;

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
    if (!list.empty())
      for (auto& path : jtok::read_path_list(list, "prepare")) files.push_back(std::move(path));
    if (files.empty()) jtok::fail("prepare: no input files");
    if (shard_tokens == 0) jtok::fail("prepare: --shard-tokens must be > 0");
    jtok::Tokenizer tok = jtok::Tokenizer::load(name, dir);
    if (threads > 0) omp_set_num_threads(threads);
    const jtok::PrepareReport r = jtok::prepare_shards(tok, files, out, prefix, shard_tokens);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("prepare %s: %zu documents, %zu bytes, %zu tokens -> %zu shard(s) in %s (%.1f s)\n", name.c_str(),
                files.size(), r.bytes, r.tokens, r.shards, out.c_str(), s);
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
}  // namespace cmd_prepare
