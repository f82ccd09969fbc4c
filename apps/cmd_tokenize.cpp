// `jtok tokenize`: encode a file (or stdin, "-") and print its token ids on one line,
// space-separated, with no special tokens added (several FILEs: one line each); --with-bos puts
// the tokenizer's bos token first when it has one (Hugging Face's encode). Other modes:
//   --decode      FILE holds ids (whitespace-separated); print their text.
//   --roundtrip   check decode(encode(x)) == x for each FILE (Qwen3: == NFC(x)); print a summary.
//   --bench N     encode FILE N times and print MB/s (tokenizer loading not counted) to stdout.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include "commands.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "data/unicode.h"

namespace cmd_tokenize {
std::string slurp(const std::string& path) {
  if (path == "-") {
    std::ostringstream ss;
    ss << std::cin.rdbuf();
    return ss.str();
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) jtok::fail("tokenize: cannot open ", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void print_ids(const std::vector<int32_t>& ids) {
  std::string line;
  line.reserve(ids.size() * 6 + 1);
  char buf[16];
  for (size_t i = 0; i < ids.size(); ++i) {
    int n = std::snprintf(buf, sizeof buf, i ? " %d" : "%d", ids[i]);
    line.append(buf, n);
  }
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stdout);
}

struct Args {
  std::string name = "gpt2", dir;
  std::vector<std::string> files;
  bool decode = false, roundtrip = false, with_bos = false;
  int threads = 0, bench = 0;
} args;

// --roundtrip: decode(encode(x)) against x (made valid UTF-8; Qwen3: NFC) for every file.
void check_roundtrips(const jtok::Tokenizer& tok) {
  size_t bad = 0, bytes = 0, tokens = 0;
  for (const auto& f : args.files) {
    std::string text = slurp(f);
    std::vector<int32_t> ids = tok.encode_parallel(text, args.threads);
    std::string expect = jtok::unicode::sanitize_utf8(text);
    if (args.name == "qwen3") expect = jtok::unicode::nfc(expect);
    bytes += text.size();
    tokens += ids.size();
    if (tok.decode(ids) != expect) { ++bad; std::printf("MISMATCH %s\n", f.c_str()); }
  }
  std::printf("roundtrip %s: %zu files, %zu bytes, %zu tokens, %zu mismatches\n", args.name.c_str(),
              args.files.size(), bytes, tokens, bad);
  if (bad) jtok::fail("roundtrip failed for ", bad, " file(s)");
}

// --decode: text holds whitespace-separated ids; prints their text.
void print_decoded(const jtok::Tokenizer& tok, const std::string& text) {
  std::istringstream in(text);
  std::vector<int32_t> ids;
  long long v;
  while (in >> v) ids.push_back(int32_t(v));
  std::string out = tok.decode(ids);
  std::fwrite(out.data(), 1, out.size(), stdout);
}

// --bench N: encodes text N times and prints MB/s.
void print_bench(const jtok::Tokenizer& tok, const std::string& text) {
  auto t0 = std::chrono::steady_clock::now();
  size_t n = 0;
  for (int r = 0; r < args.bench; ++r) n = tok.encode_parallel(text, args.threads).size();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%.2f MB/s (%zu bytes x %d in %.3f s, %zu tokens)\n", text.size() * double(args.bench) / s / 1e6,
              text.size(), args.bench, s, n);
}

// The ids of text, with the bos token first under --with-bos (when the tokenizer has one).
std::vector<int32_t> ids_of(const jtok::Tokenizer& tok, const std::string& text) {
  std::vector<int32_t> ids = tok.encode_parallel(text, args.threads);
  if (args.with_bos && tok.bos_id() >= 0) ids.insert(ids.begin(), tok.bos_id());
  return ids;
}

void run() {
  jtok::Tokenizer tok = jtok::Tokenizer::load(args.name, args.dir);
  if (args.roundtrip) return check_roundtrips(tok);
  if (args.files.size() > 1 && !args.decode && args.bench == 0) {  // one line of ids per file
    for (const auto& f : args.files) print_ids(ids_of(tok, slurp(f)));
    return;
  }
  if (args.files.size() != 1) jtok::fail("tokenize: give one FILE with --decode or --bench");
  std::string text = slurp(args.files[0]);
  if (args.decode) return print_decoded(tok, text);
  if (args.bench > 0) return print_bench(tok, text);
  print_ids(ids_of(tok, text));
}

void setup(CLI::App* sub) {
  sub->add_option("--tokenizer", args.name, "gpt2, qwen3 or llama3 (llama3 needs --tokenizer-dir)")->check(CLI::IsMember({"gpt2", "qwen3", "llama3"}));
  sub->add_option("--tokenizer-dir", args.dir,
                  "directory with encoder.json+vocab.bpe (gpt2) or tokenizer.json (qwen3); "
                  "default: .cache/npm/... found from $JTOK_ROOT, the cwd or the binary");
  sub->add_option("--threads", args.threads, "encoding threads (default: OpenMP's)");
  sub->add_flag("--decode", args.decode, "FILE holds token ids; print the text");
  sub->add_flag("--with-bos", args.with_bos,
                "put the bos token that tokenizer.json's post_processor adds (Llama 3) first, as HF's encode does");
  sub->add_flag("--roundtrip", args.roundtrip, "check decode(encode(x)) == x for every FILE");
  sub->add_option("--bench", args.bench, "encode FILE this many times and report MB/s");
  sub->add_option("files", args.files, "input file(s), - for stdin")->required();
  sub->callback(run);
}
const bool registered = jtok::register_command({"tokenize", "print the token ids of a file (gpt2 or qwen3)", setup});
}  // namespace cmd_tokenize
