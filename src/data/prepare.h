// `jtok prepare`'s work: text files -> token shards. Each input file is one document; every
// document is preceded by the end-of-text token (and the tokenizer's bos token when it has one).
// Tokens fill shards of shard_tokens in input order (a document may continue in the next shard);
// shards are OUT/PREFIX_000000.bin, ... written atomically; older PREFIX_*.bin beyond the new count
// are removed so the directory holds exactly this run's output.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace jtok {

// The token stream of documents[]: eot (+ bos) before each, each encoded on the OpenMP threads in
// chunks cut at safe points (safe_chunk_bounds), so one big book does not serialise.
std::vector<int32_t> tokenize_documents(const Tokenizer& tok, const std::vector<std::string>& documents);

// Writes stream into shards of shard_tokens (at least one shard, empty if the stream is), removes the
// temporary files of an earlier, killed run and the shards of an earlier, larger one. Returns the
// number of shards written.
size_t write_token_shards(const Tokenizer& tok, const std::vector<int32_t>& stream, const std::string& out,
                          const std::string& prefix, uint64_t shard_tokens);

struct PrepareReport {
  size_t bytes = 0, tokens = 0, shards = 0;
};
// Reads files (one document each), tokenizes them and writes the shards.
PrepareReport prepare_shards(const Tokenizer& tok, const std::vector<std::string>& files, const std::string& out,
                             const std::string& prefix, uint64_t shard_tokens);

}  // namespace jtok
