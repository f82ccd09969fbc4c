// GGUF export: the writer's bytes parse back with a small independent reader (header, every
// metadata type, tensor infos, offsets aligned to general.alignment, data); f32 -> f16 rounding
// against the compiler's _Float16; the q/k row permutation turns our rotate_half RoPE into
// llama.cpp's interleaved one; a tiny model's file has llama.cpp's names, shapes and metadata;
// JTok / JTok-M models and MoEs that llama.cpp's qwen3moe cannot express are refused naming `jtok
// serve`; a Qwen3-MoE-shaped one is written as qwen3moe with its experts stacked.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <variant>

#include "core/atomic_file.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "export/gguf_export.h"
#include "export/gguf_writer.h"
#include "model/moe.h"
#include "ops/rope.h"

using namespace jtok;
namespace fs = std::filesystem;

namespace {

// ---- A minimal GGUF v3 reader, written from the format description (not from the writer) ----
struct Value {
  uint32_t type = 0, elem_type = 0;       // elem_type for arrays
  uint64_t u = 0;                         // unsigned / bool
  int64_t i = 0;                          // signed
  double f = 0;                           // float
  std::string s;
  std::vector<std::string> strs;          // array of strings
  std::vector<int64_t> ints;              // array of integers
};
struct TensorInfo {
  std::vector<uint64_t> ne;
  uint32_t type = 0;
  uint64_t offset = 0;
};
struct Parsed {
  uint32_t version = 0;
  std::map<std::string, Value> kv;
  std::vector<std::string> kv_order;
  std::map<std::string, TensorInfo> tensors;
  std::vector<std::string> tensor_order;
  uint64_t data_start = 0, alignment = 32;
  std::string bytes;
};

struct Cursor {
  const std::string& b;
  size_t p = 0;
  template <typename T>
  T get() {
    if (p + sizeof(T) > b.size()) throw std::runtime_error("gguf read past the end at " + std::to_string(p));
    T v;
    std::memcpy(&v, b.data() + p, sizeof(T));
    p += sizeof(T);
    return v;
  }
  std::string str() {
    const uint64_t n = get<uint64_t>();
    if (p + n > b.size()) throw std::runtime_error("gguf string past the end");
    std::string s = b.substr(p, n);
    p += n;
    return s;
  }
};

void read_scalar(Cursor& c, uint32_t t, Value& v) {
  switch (t) {
    case 0: v.u = c.get<uint8_t>(); break;
    case 1: v.i = c.get<int8_t>(); break;
    case 2: v.u = c.get<uint16_t>(); break;
    case 3: v.i = c.get<int16_t>(); break;
    case 4: v.u = c.get<uint32_t>(); break;
    case 5: v.i = c.get<int32_t>(); break;
    case 6: v.f = c.get<float>(); break;
    case 7: v.u = c.get<uint8_t>(); break;
    case 8: v.s = c.str(); break;
    case 10: v.u = c.get<uint64_t>(); break;
    case 11: v.i = c.get<int64_t>(); break;
    case 12: v.f = c.get<double>(); break;
    default: throw std::runtime_error("bad gguf type " + std::to_string(t));
  }
}

Parsed parse(const std::string& bytes) {
  Parsed r;
  r.bytes = bytes;
  Cursor c{r.bytes};
  EXPECT_EQ(r.bytes.substr(0, 4), "GGUF");
  c.get<uint32_t>();
  r.version = c.get<uint32_t>();
  const uint64_t n_tensors = c.get<uint64_t>(), n_kv = c.get<uint64_t>();
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = c.str();
    Value v;
    v.type = c.get<uint32_t>();
    if (v.type == 9) {
      v.elem_type = c.get<uint32_t>();
      const uint64_t n = c.get<uint64_t>();
      for (uint64_t i = 0; i < n; ++i) {
        Value e;
        read_scalar(c, v.elem_type, e);
        if (v.elem_type == 8) v.strs.push_back(e.s);
        else v.ints.push_back(e.i ? e.i : static_cast<int64_t>(e.u));
      }
    } else {
      read_scalar(c, v.type, v);
    }
    EXPECT_EQ(r.kv.count(key), 0u) << "key twice: " << key;
    r.kv_order.push_back(key);
    r.kv[key] = v;
  }
  if (r.kv.count("general.alignment")) r.alignment = r.kv["general.alignment"].u;
  for (uint64_t t = 0; t < n_tensors; ++t) {
    std::string name = c.str();
    TensorInfo ti;
    const uint32_t nd = c.get<uint32_t>();
    for (uint32_t d = 0; d < nd; ++d) ti.ne.push_back(c.get<uint64_t>());
    ti.type = c.get<uint32_t>();
    ti.offset = c.get<uint64_t>();
    r.tensor_order.push_back(name);
    r.tensors[name] = ti;
  }
  r.data_start = (c.p + r.alignment - 1) / r.alignment * r.alignment;
  for (size_t p = c.p; p < r.data_start; ++p) EXPECT_EQ(r.bytes[p], '\0') << "padding byte " << p;
  return r;
}

uint64_t numel(const TensorInfo& t) {
  uint64_t n = 1;
  for (auto d : t.ne) n *= d;
  return n;
}
std::vector<float> tensor_values(const Parsed& p, const std::string& name) {
  const TensorInfo& t = p.tensors.at(name);
  const uint64_t n = numel(t), at = p.data_start + t.offset;
  std::vector<float> out(n);
  if (t.type == 0) {
    EXPECT_LE(at + 4 * n, p.bytes.size());
    std::memcpy(out.data(), p.bytes.data() + at, 4 * n);
  } else {
    EXPECT_LE(at + 2 * n, p.bytes.size());
    for (uint64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, p.bytes.data() + at + 2 * i, 2);
      out[i] = static_cast<float>(std::bit_cast<_Float16>(h));
    }
  }
  return out;
}

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::string tmp_path(const std::string& name) {
  return (fs::temp_directory_path() / (name + "." + std::to_string(::getpid()))).string();
}

}  // namespace

TEST(Gguf, WriterBytesParseBack) {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u32("a.u32", 4000000000u);
  w.add_i32("a.i32", -7);
  w.add_u64("a.u64", 1ull << 40);
  w.add_f32("a.f32", 0.25f);
  w.add_bool("a.bool", true);
  w.add_string_array("a.strs", {"x", "", "Ġthe"});
  w.add_i32_array("a.ints", {1, -2, 3});
  EXPECT_THROW(w.add_u32("a.u32", 1), Error);
  // Odd sizes, so that every tensor but the first needs padding to the alignment.
  const auto a = randn(3 * 5, 1), b = randn(7, 2), c = randn(2 * 3 * 1, 3);
  w.add_tensor("t.a", {3, 5}, GgmlType::F32, a.data());
  w.add_tensor("t.b", {7}, GgmlType::F16, b.data());
  w.add_tensor("t.c", {2, 3, 1}, GgmlType::F32, std::vector<float>(c));
  EXPECT_THROW(w.add_tensor("t.a", {1}, GgmlType::F32, a.data()), Error);
  EXPECT_THROW(w.add_tensor("t.d", {0, 2}, GgmlType::F32, a.data()), Error);

  const std::string path = tmp_path("jtok_test.gguf");
  w.write(path);
  EXPECT_FALSE(fs::exists(path + ".tmp." + std::to_string(::getpid())));
  const std::string bytes = read_file(path);
  fs::remove(path);
  EXPECT_EQ(bytes.size(), w.file_size());
  Parsed p = parse(bytes);
  EXPECT_EQ(p.version, 3u);
  EXPECT_EQ(p.alignment, 32u);
  EXPECT_EQ(p.kv.at("general.alignment").type, 4u);
  EXPECT_EQ(p.kv.at("general.architecture").type, 8u);
  EXPECT_EQ(p.kv.at("general.architecture").s, "llama");
  EXPECT_EQ(p.kv.at("a.u32").type, 4u);
  EXPECT_EQ(p.kv.at("a.u32").u, 4000000000u);
  EXPECT_EQ(p.kv.at("a.i32").type, 5u);
  EXPECT_EQ(p.kv.at("a.i32").i, -7);
  EXPECT_EQ(p.kv.at("a.u64").type, 10u);
  EXPECT_EQ(p.kv.at("a.u64").u, 1ull << 40);
  EXPECT_EQ(p.kv.at("a.f32").type, 6u);
  EXPECT_EQ(p.kv.at("a.f32").f, 0.25);
  EXPECT_EQ(p.kv.at("a.bool").type, 7u);
  EXPECT_EQ(p.kv.at("a.bool").u, 1u);
  EXPECT_EQ(p.kv.at("a.strs").elem_type, 8u);
  EXPECT_EQ(p.kv.at("a.strs").strs, (std::vector<std::string>{"x", "", "Ġthe"}));
  EXPECT_EQ(p.kv.at("a.ints").elem_type, 5u);
  EXPECT_EQ(p.kv.at("a.ints").ints, (std::vector<int64_t>{1, -2, 3}));
  ASSERT_EQ(p.tensor_order, (std::vector<std::string>{"t.a", "t.b", "t.c"}));
  EXPECT_EQ(p.tensors.at("t.a").ne, (std::vector<uint64_t>{5, 3}));     // innermost first
  EXPECT_EQ(p.tensors.at("t.c").ne, (std::vector<uint64_t>{1, 3, 2}));
  EXPECT_EQ(p.tensors.at("t.b").type, 1u);
  uint64_t end = 0;
  for (const auto& name : p.tensor_order) {
    const TensorInfo& t = p.tensors.at(name);
    EXPECT_EQ(t.offset % 32, 0u) << name;
    EXPECT_EQ((p.data_start + t.offset) % 32, 0u) << name;
    EXPECT_GE(t.offset, end) << name << " overlaps the previous tensor";
    end = t.offset + numel(t) * (t.type == 0 ? 4 : 2);
  }
  EXPECT_EQ(p.data_start % 32, 0u);
  EXPECT_LE(p.data_start + end, bytes.size());
  EXPECT_EQ(tensor_values(p, "t.a"), a);
  EXPECT_EQ(tensor_values(p, "t.c"), c);
  const auto bh = tensor_values(p, "t.b");
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(bh[i], static_cast<float>(static_cast<_Float16>(b[i])));
}

TEST(Gguf, WriteFailureLeavesNothing) {
  GgufWriter w;
  w.add_u32("x", 1);
  const std::string path = "/nonexistent-dir-jtok/x.gguf";
  try {
    w.write(path);
    FAIL() << "write to a missing directory succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir-jtok/x.gguf.tmp"), std::string::npos) << e.what();
  }
}

// The reference here is the compiler's float -> _Float16 conversion (round to nearest even).
TEST(Gguf, F16RoundingMatchesCompiler) {
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.0f, 65520.0f, 1e9f, -1e9f,
                           6.1035156e-05f, 6.0e-05f, 5.9604645e-08f, 2.98e-08f, 2.9802322e-08f, 1e-10f,
                           std::numeric_limits<float>::infinity(), 3.14159265f, 1.0f / 3.0f};
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = static_cast<uint32_t>(rng());
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f)) continue;
    xs.push_back(f);
  }
  // Every tie between neighbouring halves in the normal and subnormal ranges.
  for (uint32_t h = 0; h < 0x7bffu; h += 37) {
    const float lo = static_cast<float>(std::bit_cast<_Float16>(static_cast<uint16_t>(h)));
    const float hi = static_cast<float>(std::bit_cast<_Float16>(static_cast<uint16_t>(h + 1)));
    xs.push_back((lo + hi) / 2);
  }
  for (float f : xs) {
    const uint16_t want = std::bit_cast<uint16_t>(static_cast<_Float16>(f));
    ASSERT_EQ(f32_to_f16(f), want) << "f = " << f;
    if ((want & 0x7c00u) != 0x7c00u) {
      ASSERT_EQ(f16_to_f32(want), static_cast<float>(std::bit_cast<_Float16>(want)));
    }
  }
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
}

// llama.cpp's `llama` RoPE ("normal" mode) rotates the pairs (2j, 2j+1) of a head by t*theta^(-2j/hd).
// Written here plainly from that description.
static void rope_interleaved(std::vector<float>& x, int64_t T, int64_t H, int64_t hd, double theta) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < hd / 2; ++j) {
        const double ang = t * std::pow(theta, -2.0 * j / hd);
        float* p = &x[(t * H + h) * hd + 2 * j];
        const double a = p[0], b = p[1];
        p[0] = static_cast<float>(a * std::cos(ang) - b * std::sin(ang));
        p[1] = static_cast<float>(a * std::sin(ang) + b * std::cos(ang));
      }
}

TEST(Gguf, PermutedRowsTurnRotateHalfIntoInterleavedRope) {
  const int64_t T = 6, H = 3, hd = 8, d = 5;
  const double theta = 10000.0;
  const auto W = randn(H * hd * d, 11), x = randn(T * d, 12);
  const auto Wp = permute_rope_rows(W.data(), H, hd, d);
  auto project = [&](const std::vector<float>& w) {
    std::vector<float> q(T * H * hd, 0.0f);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = 0; r < H * hd; ++r) {
        double s = 0;
        for (int64_t k = 0; k < d; ++k) s += double(w[r * d + k]) * x[t * d + k];
        q[t * H * hd + r] = static_cast<float>(s);
      }
    return q;
  };
  auto ours = project(W);
  rope_forward_ref(ours.data(), 1, T, H, hd, theta);  // rotate_half
  auto theirs = project(Wp);
  rope_interleaved(theirs, T, H, hd, theta);
  // theirs is ours with each head's rows in the permuted order: element 2j+s <- s*hd/2 + j.
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < hd / 2; ++j)
        for (int64_t s = 0; s < 2; ++s)
          EXPECT_NEAR(theirs[(t * H + h) * hd + 2 * j + s], ours[(t * H + h) * hd + s * hd / 2 + j], 1e-4);
  // Without the permutation the two RoPEs disagree (the test can fail).
  auto unpermuted = project(W);
  rope_interleaved(unpermuted, T, H, hd, theta);
  double diff = 0;
  for (size_t i = 0; i < ours.size(); ++i) diff = std::max(diff, double(std::abs(unpermuted[i] - ours[i])));
  EXPECT_GT(diff, 1e-2);
}

namespace {
ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 50257;  // the gpt2 tokenizer's
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.intermediate_size = 24;
  c.max_position_embeddings = 64;
  c.rope_theta = 5000.0;
  c.rms_norm_eps = 1e-5;
  return c;
}
}  // namespace

TEST(Gguf, TinyModelHasLlamaNamesShapesAndMetadata) {
  for (GgmlType dtype : {GgmlType::F32, GgmlType::F16}) {
    const ModelConfig c = tiny_config();
    const Model m = make_model(c, 3, {.init = true, .grads = false});
    GgufWriter w;
    GgufExportOptions opt;
    opt.dtype = dtype;
    build_gguf(m, opt, w);
    const std::string path = tmp_path("jtok_tiny.gguf");
    w.write(path);
    Parsed p = parse(read_file(path));
    fs::remove(path);
    auto u = [&](const std::string& k) { return p.kv.at(k).u; };
    EXPECT_EQ(p.kv.at("general.architecture").s, "llama");
    EXPECT_EQ(u("general.file_type"), dtype == GgmlType::F32 ? 0u : 1u);
    EXPECT_EQ(u("llama.context_length"), 64u);
    EXPECT_EQ(u("llama.embedding_length"), 16u);
    EXPECT_EQ(u("llama.block_count"), 2u);
    EXPECT_EQ(u("llama.feed_forward_length"), 24u);
    EXPECT_EQ(u("llama.attention.head_count"), 4u);
    EXPECT_EQ(u("llama.attention.head_count_kv"), 2u);
    EXPECT_EQ(u("llama.rope.dimension_count"), 4u);
    EXPECT_EQ(u("llama.vocab_size"), 50257u);
    EXPECT_FLOAT_EQ(p.kv.at("llama.rope.freq_base").f, 5000.0f);
    EXPECT_FLOAT_EQ(p.kv.at("llama.attention.layer_norm_rms_epsilon").f, 1e-5f);
    EXPECT_EQ(p.kv.at("tokenizer.ggml.model").s, "gpt2");
    EXPECT_EQ(p.kv.at("tokenizer.ggml.pre").s, "gpt-2");
    const auto& toks = p.kv.at("tokenizer.ggml.tokens").strs;
    ASSERT_EQ(toks.size(), 50257u);
    EXPECT_EQ(toks[50256], "<|endoftext|>");
    EXPECT_EQ(toks[262], "\xC4\xA0the");  // "Ġthe"
    const auto& types = p.kv.at("tokenizer.ggml.token_type").ints;
    ASSERT_EQ(types.size(), 50257u);
    EXPECT_EQ(types[50256], 3);
    EXPECT_EQ(types[262], 1);
    const auto& merges = p.kv.at("tokenizer.ggml.merges").strs;
    ASSERT_EQ(merges.size(), 50000u);
    EXPECT_EQ(merges[0], "\xC4\xA0 t");  // "Ġ t", the first line of vocab.bpe
    EXPECT_EQ(u("tokenizer.ggml.bos_token_id"), 50256u);
    EXPECT_EQ(u("tokenizer.ggml.eos_token_id"), 50256u);
    // 2 + 9 per layer + output (untied).
    EXPECT_EQ(p.tensor_order.size(), 2u + 9u * 2u + 1u);
    EXPECT_EQ(p.tensors.at("token_embd.weight").ne, (std::vector<uint64_t>{16, 50257}));  // padded rows dropped
    EXPECT_EQ(p.tensors.at("output.weight").ne, (std::vector<uint64_t>{16, 50257}));
    EXPECT_EQ(p.tensors.at("blk.1.attn_q.weight").ne, (std::vector<uint64_t>{16, 16}));
    EXPECT_EQ(p.tensors.at("blk.1.attn_k.weight").ne, (std::vector<uint64_t>{16, 8}));
    EXPECT_EQ(p.tensors.at("blk.0.ffn_down.weight").ne, (std::vector<uint64_t>{24, 16}));
    EXPECT_EQ(p.tensors.at("blk.0.attn_norm.weight").type, 0u);  // norms stay f32
    EXPECT_EQ(p.tensors.at("blk.0.ffn_up.weight").type, dtype == GgmlType::F32 ? 0u : 1u);
    for (const auto& [name, t] : p.tensors) EXPECT_EQ((p.data_start + t.offset) % p.alignment, 0u) << name;
    // Data: k is the permuted rows of our k_proj, up is as stored, the embedding's first V rows.
    const float tol = dtype == GgmlType::F32 ? 0.0f : 1e-3f;
    const auto k = tensor_values(p, "blk.1.attn_k.weight");
    const LayerView& L = m.w.layers[1];
    const int64_t hd = 4;
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t j = 0; j < hd / 2; ++j)
        for (int64_t s = 0; s < 2; ++s)
          for (int64_t col = 0; col < 16; ++col)
            EXPECT_NEAR(k[((h * hd + 2 * j + s) * 16) + col], L.wk[(h * hd + s * hd / 2 + j) * 16 + col], tol);
    const auto up = tensor_values(p, "blk.1.ffn_up.weight");
    for (size_t i = 0; i < up.size(); ++i) EXPECT_NEAR(up[i], L.wu[i], tol);
    const auto emb = tensor_values(p, "token_embd.weight");
    for (size_t i = 0; i < emb.size(); i += 97) EXPECT_NEAR(emb[i], m.w.embed[i], tol);
  }
  // Tied embeddings: no output tensor (llama.cpp then uses token_embd).
  ModelConfig c = tiny_config();
  c.tie_word_embeddings = true;
  const Model m = make_model(c, 3, {.init = true, .grads = false});
  GgufWriter w;
  build_gguf(m, {}, w);
  Parsed p = parse(w.header_bytes());
  EXPECT_EQ(p.tensors.count("output.weight"), 0u);
  EXPECT_EQ(p.tensors.count("output_norm.weight"), 1u);
}

// The Qwen tokenizer (tokenizer.json) for a qwen3-architecture model with 3 embedding rows past the
// tokenizer's ids: its tokens in id order, added special tokens as control, the padding rows as
// "[PAD<id>]" of type unused, the merges, pre-tokenizer "qwen2", <|endoftext|> as bos and eos; and
// the q/k norm tensors with q / k rows as stored (NEOX RoPE).
TEST(Gguf, Qwen3ModelCarriesQwenTokenizerAndQkNorm) {
  const Tokenizer tok = Tokenizer::load("qwen3");
  ModelConfig c = tiny_config();
  c.vocab_size = static_cast<int64_t>(tok.vocab_size()) + 3;
  c.qk_norm = true;
  const Model m = make_model(c, 3, {.init = true, .grads = false});
  GgufWriter w;
  GgufExportOptions opt;
  opt.tokenizer = "qwen3";
  build_gguf(m, opt, w);
  Parsed p = parse(w.header_bytes());
  EXPECT_EQ(p.kv.at("general.architecture").s, "qwen3");
  EXPECT_EQ(p.kv.at("qwen3.vocab_size").u, static_cast<uint64_t>(c.vocab_size));
  EXPECT_EQ(p.kv.at("tokenizer.ggml.pre").s, "qwen2");
  const auto& toks = p.kv.at("tokenizer.ggml.tokens").strs;
  const auto& types = p.kv.at("tokenizer.ggml.token_type").ints;
  ASSERT_EQ(toks.size(), static_cast<size_t>(c.vocab_size));
  ASSERT_EQ(types.size(), toks.size());
  const int32_t eot = tok.eot_id(), im_end = tok.token_id("<|im_end|>");
  EXPECT_EQ(toks[eot], "<|endoftext|>");
  EXPECT_EQ(types[eot], 3);
  ASSERT_GE(im_end, 0);
  EXPECT_EQ(types[im_end], 3);
  EXPECT_EQ(toks[c.vocab_size - 1], "[PAD" + std::to_string(c.vocab_size - 1) + "]");
  EXPECT_EQ(types[c.vocab_size - 1], 5);
  EXPECT_EQ(types[100], 1);
  EXPECT_EQ(p.kv.at("tokenizer.ggml.bos_token_id").u, static_cast<uint64_t>(eot));
  EXPECT_GT(p.kv.at("tokenizer.ggml.merges").strs.size(), 100000u);
  EXPECT_NE(p.kv.at("tokenizer.ggml.merges").strs[0].find(' '), std::string::npos);
  EXPECT_EQ(p.tensors.at("blk.1.attn_q_norm.weight").ne, (std::vector<uint64_t>{4}));
  EXPECT_EQ(p.tensors.count("blk.1.attn_k_norm.weight"), 1u);
  EXPECT_EQ(p.tensors.at("token_embd.weight").ne, (std::vector<uint64_t>{16, static_cast<uint64_t>(c.vocab_size)}));
  // GPT-2 with 2 rows past its 50257 ids: padded the same way.
  ModelConfig g = tiny_config();
  g.vocab_size = 50259;
  const Model mg = make_model(g, 3, {.init = true, .grads = false});
  GgufWriter wg;
  build_gguf(mg, {}, wg);
  Parsed pg = parse(wg.header_bytes());
  ASSERT_EQ(pg.kv.at("tokenizer.ggml.tokens").strs.size(), 50259u);
  EXPECT_EQ(pg.kv.at("tokenizer.ggml.tokens").strs[50258], "[PAD50258]");
  EXPECT_EQ(pg.kv.at("tokenizer.ggml.token_type").ints[50257], 5);
}

TEST(Gguf, RefusesTokenIndexedTablesAndMoe) {
  for (int kind = 0; kind < 3; ++kind) {
    ModelConfig c = tiny_config();
    if (kind == 0) c.jtok = true;
    if (kind == 1) c.jtokm = true;
    if (kind == 2) c.model_type = "jtok_moe";
    const std::string why = gguf_unsupported_reason(c);
    EXPECT_NE(why.find("jtok serve"), std::string::npos) << why;
    EXPECT_NE(why.find(kind == 2 ? "MoE" : "token-indexed"), std::string::npos) << why;
  }
  EXPECT_EQ(gguf_unsupported_reason(tiny_config()), "");
  ModelConfig c = tiny_config();
  c.vocab_size = 1000;
  const Model m = make_model(c, 3, {.init = true, .grads = false});
  GgufWriter w;
  try {
    build_gguf(m, {}, w);
    FAIL() << "a vocab_size unlike the tokenizer's was exported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size 1000"), std::string::npos) << e.what();
  }
}

// A Qwen3-MoE-shaped jtok MoE (every layer MoE, no shared experts, q/k norms, renormalised top-k)
// as llama.cpp's qwen3moe: the expert hyper-parameters, the router as ffn_gate_inp (E, d), each
// projection of the E experts stacked into one 3-D tensor with its values expert by expert; and
// each MoE that qwen3moe cannot express refused naming why.
TEST(Gguf, Qwen3MoeStacksTheExperts) {
  ModelConfig c = tiny_config();
  c.model_type = "jtok_moe";
  c.qk_norm = true;
  c.n_shared_experts = 0;
  c.first_k_dense_replace = 0;
  c.n_routed_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 8;
  c.norm_topk_prob = true;
  ASSERT_EQ(gguf_unsupported_reason(c), "");
  const std::vector<std::pair<std::function<void(ModelConfig&)>, std::string>> refused = {
      {[](ModelConfig& x) { x.n_shared_experts = 1; }, "shared experts"},
      {[](ModelConfig& x) { x.norm_topk_prob = false; }, "norm_topk_prob is false"},
      {[](ModelConfig& x) { x.first_k_dense_replace = 1; }, "layer 0 keeps a dense MLP"},
      {[](ModelConfig& x) { x.mlp_only_layers = std::string(1, '1'); },
       "layer 1 keeps a dense MLP"},  // not = "1": GCC 12 -Wrestrict false positive
      {[](ModelConfig& x) { x.qk_norm = false; }, "no qk_norm"}};
  for (const auto& [edit, part] : refused) {
    ModelConfig x = c;
    edit(x);
    const std::string why = gguf_unsupported_reason(x);
    EXPECT_NE(why.find(part), std::string::npos) << why;
    EXPECT_NE(why.find("qwen3moe"), std::string::npos) << why;
  }
  const Model m = make_model(c, 3, {.init = true, .grads = false});
  GgufWriter w;
  build_gguf(m, {}, w);
  const std::string path = tmp_path("jtok_qwen3moe.gguf");
  w.write(path);
  Parsed p = parse(read_file(path));
  fs::remove(path);
  EXPECT_EQ(p.kv.at("general.architecture").s, "qwen3moe");
  EXPECT_EQ(p.kv.at("qwen3moe.expert_count").u, 4u);
  EXPECT_EQ(p.kv.at("qwen3moe.expert_used_count").u, 2u);
  EXPECT_EQ(p.kv.at("qwen3moe.expert_feed_forward_length").u, 8u);
  // 2 + 12 per layer (norms, q k v o, q/k norms, router, 3 expert stacks) + output (untied).
  EXPECT_EQ(p.tensor_order.size(), 2u + 12u * 2u + 1u);
  EXPECT_EQ(p.tensors.count("blk.0.ffn_gate.weight"), 0u);
  EXPECT_EQ(p.tensors.at("blk.1.ffn_gate_inp.weight").ne, (std::vector<uint64_t>{16, 4}));
  EXPECT_EQ(p.tensors.at("blk.1.ffn_gate_exps.weight").ne, (std::vector<uint64_t>{16, 8, 4}));
  EXPECT_EQ(p.tensors.at("blk.1.ffn_up_exps.weight").ne, (std::vector<uint64_t>{16, 8, 4}));
  EXPECT_EQ(p.tensors.at("blk.1.ffn_down_exps.weight").ne, (std::vector<uint64_t>{8, 16, 4}));
  const MoeDims md = moe_dims(c);
  const LayerView& L = m.w.layers[1];
  const auto router = tensor_values(p, "blk.1.ffn_gate_inp.weight");
  EXPECT_TRUE(std::equal(router.begin(), router.end(), L.moe.router));
  const std::vector<std::pair<std::string, float* (*)(const MoeWeights&, const MoeDims&, int64_t)>> stacks = {
      {"gate", expert_gate}, {"up", expert_up}, {"down", expert_down}};
  for (const auto& [name, at] : stacks) {
    const auto v = tensor_values(p, "blk.1.ffn_" + name + "_exps.weight");
    const size_t n = static_cast<size_t>(md.F * md.d);
    ASSERT_EQ(v.size(), 4 * n);
    for (int64_t e = 0; e < 4; ++e)
      EXPECT_TRUE(std::equal(v.begin() + static_cast<std::ptrdiff_t>(e * md.F * md.d),
                             v.begin() + static_cast<std::ptrdiff_t>((e + 1) * md.F * md.d), at(L.moe, md, e)))
          << name << " expert " << e;
  }
}

// Q8_0 (llama.cpp's 8-bit format): 34-byte blocks of an f16 scale d = max|x| / 127 and 32 int8;
// every value decodes to within d/2 (plus the scale's own f16 rounding), the block's largest
// magnitude to +-127, an all-zero block to d = 0; the writer sizes Q8_0 tensors by blocks and refuses
// rows that do not split into them.
TEST(Gguf, Q8_0BlocksDecodeWithinHalfAStep) {
  const int64_t n = 4 * kQ8Block;
  std::vector<float> x(n);
  std::mt19937_64 rng(3);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (auto& v : x) v = nd(rng);
  for (int64_t j = kQ8Block; j < 2 * kQ8Block; ++j) x[j] = 0.0f;  // block 1: all zero
  x[2 * kQ8Block + 5] = -3.0f;                                      // block 2: one large value
  std::vector<uint8_t> q(ggml_bytes(GgmlType::Q8_0, n));
  ASSERT_EQ(q.size(), 4u * 34u);
  quantize_q8_0(x.data(), n, q.data());
  for (int64_t b = 0; b < 4; ++b) {
    const uint8_t* blk = q.data() + b * 34;
    uint16_t h;
    std::memcpy(&h, blk, 2);
    const float d = f16_to_f32(h);
    int maxq = 0;
    for (int64_t j = 0; j < kQ8Block; ++j) {
      const int8_t qj = static_cast<int8_t>(blk[2 + j]);
      maxq = std::max(maxq, std::abs(static_cast<int>(qj)));
      EXPECT_NEAR(qj * d, x[b * kQ8Block + j], 0.5f * d + 127 * d * 1e-3f) << "block " << b << " value " << j;
    }
    EXPECT_EQ(maxq, b == 1 ? 0 : 127) << "block " << b;
    if (b == 1) {
      EXPECT_EQ(d, 0.0f);
    }
  }
  GgufWriter w;
  w.add_tensor("a.weight", {3, 64}, GgmlType::Q8_0, std::vector<float>(192, 0.5f));
  EXPECT_EQ(w.file_size(), w.header_bytes().size() + ((3 * 2 * 34 + kGgufAlignment - 1) / kGgufAlignment) * kGgufAlignment);
  EXPECT_THROW(w.add_tensor("b.weight", {2, 48}, GgmlType::Q8_0, std::vector<float>(96, 0.5f)), Error);
}
