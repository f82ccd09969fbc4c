// Shared command-line plumbing of the commands that read configs and checkpoints.
#pragma once
#include <CLI/CLI.hpp>
#include <map>
#include <string>
#include <vector>

#include "cuda/decoder.h"
#include "data/tokenizer.h"
#include "model/transformer.h"
#include "store/table_io.h"
#include "train/config.h"

namespace jtok {

// Adds --<field> for every config field (strings; parsed by the field's type later) to `sub`.
// Returned map is filled by CLI11 when parsing.
std::map<std::string, std::string>& add_config_field_options(CLI::App* sub);
// "name=value" overrides from the --<field> options that were given, plus --set ones.
std::vector<std::string> collect_overrides(CLI::App* sub, const std::map<std::string, std::string>& fields,
                                           const std::vector<std::string>& sets);
// A checkpoint directory, or a run directory (then its newest complete checkpoint).
std::string resolve_checkpoint(const std::string& path);

// --cuda-graphs on | off (default on): the GPU decoder's decode steps replayed as CUDA graphs
// (cuda::DecoderSettings::cuda_graphs; off: launched kernel by kernel, the same bits).
void add_cuda_graphs_option(CLI::App* sub, std::string& value);
bool cuda_graphs_on(const std::string& value);  // "on" or "off" (else it fails naming the flag)
// --int8-decode on | off | only (cuda::DecoderSettings::int8_decode: an int8 export's decode steps
// read its int8 matrices as stored, or the bf16 copy alone; only: int8_only, no copy of the layers').
void add_int8_decode_option(CLI::App* sub, std::string& value);
void set_int8_decode(cuda::DecoderSettings& s, const std::string& value);  // else it fails naming the flag
// --pdl on | off and --tensor-cores on | off (default off, both): cuda::DecoderSettings::pdl and
// ::tensor_cores, off until a GPU has measured them (docs/cuda-inference.md).
void add_pdl_option(CLI::App* sub, std::string& value);
void add_tensor_cores_option(CLI::App* sub, std::string& value);
bool on_off(const std::string& value, const char* flag);  // "on" or "off" (else it fails naming flag)

// A checkpoint loaded for inference: its directory, config, weights and tokenizer.
struct LoadedCheckpoint {
  std::string dir;
  Config cfg;
  Model model;
  Tokenizer tokenizer;
  // Where generation stops: trainer_state.json's eos_token_ids (an imported model's, from its
  // generation_config.json), else the tokenizer's end of text.
  std::vector<int32_t> eos_ids;
};
// map_tables: the token tables stay in the checkpoint's model.safetensors, mapped read-only and read
// in place (--tables mmap); otherwise everything is copied into RAM.
LoadedCheckpoint load_for_inference(const std::string& checkpoint_or_run, bool map_tables = false);

// Where an inference command's token tables come from: --tables ram | mmap | disk, with disk's
// --table-store DIR (a token-major store, `jtok export --table-store`), --table-cache-mb and
// --table-io-threads (the store's read-ahead threads) and --table-io (auto | direct | pread;
// --table-direct-io: direct).
struct TableSource {
  std::string kind = "ram", store, io = "auto";
  int64_t cache_mb = 256;
  int io_threads = 8;
  bool direct_io = false;
  bool hbm = false;  // --tables hbm (resolve_hbm_tables): loaded as ram, every table copied to the GPU
  std::string placement() const { return hbm ? "hbm" : kind; }  // where a step's rows are read from
};
void add_table_source_options(CLI::App* sub, TableSource& src);
// --table-io's value with --table-direct-io (the same as direct), for --tables `tables`: a conflict
// fails naming both, either flag without --tables disk naming the flag.
TableIo table_io_option(const std::string& table_io, bool direct_flag, const std::string& tables);
// The options checked, naming the flag and value.
void check_table_source(const TableSource& src);
// --tables disk: src's store opened and m's tables made its rows (names and shapes checked against
// whose, the model's owner in a message: "the checkpoint DIR"); its source printed on stderr.
// Returns how it is read ("O_DIRECT ..." or "pread ...", store/table_io.h).
std::string attach_table_store(Model& m, const TableSource& src, const std::string& whose);
// Checks the options (naming the flag and value) and loads: disk tables are the store's (its
// table names and shapes checked against the checkpoint's, naming the manifest; its source, the
// checkpoint it was exported from, printed on stderr). on_cpu: the CPU decodes it, so a low-precision
// copy's line on stderr says which of this host's kernels multiply its matrices.
LoadedCheckpoint load_for_inference(const std::string& checkpoint_or_run, const TableSource& src, bool on_cpu);

// Where `generate`, `serve` and `eval` decode: --device cpu | cuda, and for cuda --precision bf16 |
// fp32 (auto: bf16), --table-rows auto | hbm | in_place | staged, --cuda-graphs on | off,
// --int8-decode on | off | only, --pdl on | off and --tensor-cores on | off (cuda::DecoderSettings).
struct DecoderChoice {
  std::string device = "cpu", precision = "auto", table_rows = "auto", cuda_graphs = "on", int8_decode = "on";
  std::string pdl = "off", tensor_cores = "off";
};
void add_decoder_options(CLI::App* sub, DecoderChoice& c);
// --device cuda: the GPU or require_cuda_device()'s error, before anything is read (--tensor-cores on
// with --precision fp32 fails naming both); the GPU decoder's options given with --device cpu fail
// naming the option (the CPU decodes in fp32, the rows
// where --tables keeps them).
void check_decoder_choice(const DecoderChoice& c);
// --tables hbm, the control of issue 40 (generate / eval / serve): the tables read into RAM and every
// one copied to the GPU (--table-rows hbm); with --device cpu, or another --table-rows, it fails
// naming both. src.kind becomes ram and src.hbm is set. Other --tables: nothing.
void resolve_hbm_tables(TableSource& src, DecoderChoice& c);
// The GPU decoder's settings (its batch, prefill and KV sizes left to the caller); kv_bf16 from --kv-dtype.
cuda::DecoderSettings decoder_settings(const DecoderChoice& c, bool kv_bf16);

}  // namespace jtok
