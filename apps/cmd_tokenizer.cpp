// `jtok tokenizer train`: a byte-level BPE tokenizer of our own from text files (GPT-2's
// pre-tokenizer, src/tokenizer/bpe_train.h), written as encoder.json + vocab.bpe, which
// `--tokenizer gpt2 --tokenizer-dir DIR` reads like GPT-2's own files.
#include <chrono>
#include <cstdio>

#include "commands.h"
#include "core/error.h"
#include "data/text_inputs.h"
#include "data/tokenizer.h"
#include "tokenizer/bpe_files.h"
#include "tokenizer/bpe_train.h"

namespace cmd_tokenizer {

struct Args {
  int64_t vocab_size = 8192;
  std::string out, list;
  std::vector<std::string> files;
  bool no_check = false;
} args;

void train() {
  using namespace jtok;
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  if (!args.list.empty())
    for (auto& path : read_path_list(args.list, "tokenizer train")) args.files.push_back(std::move(path));
  if (args.files.empty()) fail("tokenizer train: no input files");
  const PieceCounter counter = count_file_pieces(args.files);
  auto t1 = clock::now();
  std::printf("tokenizer train: %zu files, %lld bytes, %lld pieces, %zu distinct (%.1f s)\n", args.files.size(),
              static_cast<long long>(counter.bytes()), static_cast<long long>(counter.pieces()), counter.counts().size(),
              std::chrono::duration<double>(t1 - t0).count());
  BpeModel m = train_bpe(counter.counts(), args.vocab_size);
  auto t2 = clock::now();
  write_gpt2_tokenizer(m, args.out);
  std::printf("tokenizer train: %zu tokens (%zu merges + 256 bytes + <|endoftext|>) in %.1f s -> %s/{encoder.json,vocab.bpe}\n",
              m.vocab.size(), m.merges.size(), std::chrono::duration<double>(t2 - t1).count(), args.out.c_str());
  if (int64_t(m.vocab.size()) < args.vocab_size)
    std::printf("tokenizer train: the text ran out of pairs before --vocab-size %lld\n", static_cast<long long>(args.vocab_size));
  if (args.no_check) return;
  // Reads the files back the way training and prepare do, and measures compression on the input.
  Tokenizer tok = Tokenizer::load(TokenizerKind::Gpt2, args.out);
  const TokenizerCheck c = check_tokenizer_on_files(tok, args.files, [](const std::string& f) {
    std::printf("tokenizer train: note: %s does not round-trip byte for byte (invalid UTF-8?)\n", f.c_str());
  });
  std::printf("tokenizer train: %.3f bytes per token on the input (%lld tokens), vocab_size %u (%.1f s in all)\n",
              c.tokens ? double(c.bytes) / double(c.tokens) : 0.0, static_cast<long long>(c.tokens), tok.vocab_size(),
              std::chrono::duration<double>(clock::now() - t0).count());
}

void setup(CLI::App* sub) {
  sub->require_subcommand(1);
  CLI::App* tr = sub->add_subcommand("train", "byte-level BPE (GPT-2 pre-tokenizer) from text files -> encoder.json + vocab.bpe");
  tr->add_option("--vocab-size", args.vocab_size, "tokens in all: 256 bytes + merges + <|endoftext|> (>= 257)");
  tr->add_option("--out", args.out, "output directory")->required();
  tr->add_option("--list", args.list, "file with one input path per line");
  tr->add_flag("--no-check", args.no_check, "skip loading the result and measuring bytes per token on the input");
  tr->add_option("files", args.files, "input text files (UTF-8)");
  tr->callback(train);
}

const bool registered = jtok::register_command({"tokenizer", "train a tokenizer of our own (jtok tokenizer train)", setup});

}  // namespace cmd_tokenizer
