// Bad configs give one clear error naming the field or file; good ones load with overrides.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "core/error.h"
#include "temp_dir.h"
#include "train/config.h"

using namespace jtok;

// ctest runs each test in its own process, two at a time: each process writes in a directory of its
// own (named by its pid, removed at exit), the file named by the test.
static std::string write_tmp(const std::string& text) {
  static const std::string dir = [] {
    const std::string d = jtok::testing::fresh_temp_dir("jtok_cfg");
    std::filesystem::create_directories(d);
    return d;
  }();
  static int k = 0;
  std::string p = dir + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" + std::to_string(k++) + ".json";
  std::ofstream(p) << text;
  return p;
}

// The error message of loading `text`, or "" if it loads.
static std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    load_config(write_tmp(text), overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, DefaultsAndOverridesLoad) {
  Config c = load_config(write_tmp(R"({"hidden_size": 128, "num_attention_heads": 8, "num_key_value_heads": 2})"),
                         {"intermediate_size=512", "learning_rate=3e-4", "tie_word_embeddings=true"});
  EXPECT_EQ(c.model.hidden_size, 128);
  EXPECT_EQ(c.model.hd(), 16);
  EXPECT_EQ(c.model.kv_dim(), 32);
  EXPECT_EQ(c.model.intermediate_size, 512);
  EXPECT_DOUBLE_EQ(c.train.learning_rate, 3e-4);
  EXPECT_TRUE(c.model.tie_word_embeddings);
  EXPECT_EQ(c.model.padded_vocab(), 50304);  // 50257 padded to a multiple of 64
}

// Integer fields take an integral float (1e3) and the whole range of their type: the seed is
// unsigned, so 2^64 - 1 is a seed (and -1 is not, above).
TEST(Config, IntegerFieldsTakeIntegralFloatsAndTheirWholeRange) {
  Config c = load_config(write_tmp(R"({"hidden_size": 128.0, "max_steps": 1e3, "seed": 18446744073709551615})"));
  EXPECT_EQ(c.model.hidden_size, 128);
  EXPECT_EQ(c.train.max_steps, 1000);
  EXPECT_EQ(c.train.seed, UINT64_MAX);
  EXPECT_EQ(load_config(write_tmp(to_json(c).dump())).train.seed, UINT64_MAX);  // and it round-trips
}

TEST(Config, ErrorsNameTheFieldOrFile) {
  struct Case { std::string text; std::vector<std::string> ov; std::string must_contain; };
  std::vector<Case> cases = {
      {R"({"hiden_size": 128})", {}, "unknown field 'hiden_size'"},
      {R"({"hidden_size": "big"})", {}, "field hidden_size: expected integer"},
      {R"({"hidden_size": 1.5})", {}, "field hidden_size: expected integer"},
      {R"({"hidden_size": 1e300})", {}, "field hidden_size: expected integer, got 1e+300"},
      {R"({"hidden_size": 18446744073709551615})", {}, "field hidden_size: expected integer, got 18446744073709551615"},
      {R"({"seed": -1})", {}, "field seed: expected integer, got -1"},  // unsigned: not wrapped to 2^64 - 1
      {R"({"tie_word_embeddings": 1})", {}, "field tie_word_embeddings: expected boolean"},
      {R"({"hidden_size": 100, "num_attention_heads": 3})", {}, "num_attention_heads (3) must divide hidden_size"},
      {R"({"num_attention_heads": 4, "num_key_value_heads": 3})", {}, "num_key_value_heads (3) must divide"},
      {R"({"hidden_size": 0})", {}, "hidden_size must be positive"},
      {R"({"num_hidden_layers": -2})", {}, "num_hidden_layers must be positive"},
      {R"({"intermediate_size": 0})", {}, "intermediate_size must be positive"},
      {R"({"vocab_size": 0})", {}, "vocab_size must be positive"},
      {R"({"lr_scheduler_type": "linear"})", {}, "lr_scheduler_type"},
      {R"({"seq_len": 4096})", {}, "seq_len (4096) exceeds max_position_embeddings"},
      {R"({"hidden_size": 128)", {}, "not valid JSON"},
      {R"([1, 2])", {}, "expected a JSON object"},
      {R"({})", {"hidden_size=abc"}, "command line --hidden_size: expected integer"},
      {R"({})", {"no_such_field=1"}, "unknown config field 'no_such_field'"},
      {R"({})", {"hidden_size"}, "name=value"},
      {R"({"model_type": "jtok_mixtral"})", {}, "unknown model type 'jtok_mixtral' (known: jtok_dense, jtok_moe)"},
      {R"({"model_type": "jtok_moe", "n_routed_experts": 4, "num_experts_per_tok": 5})", {},
       "num_experts_per_tok (5) exceeds n_routed_experts (4)"},
      {R"({"model_type": "jtok_moe", "n_shared_experts": -1})", {}, "n_shared_experts must be >= 0"},
      {R"({"model_type": "jtok_moe", "n_routed_experts": 0})", {}, "n_routed_experts must be positive"},
      {R"({"model_type": "jtok_moe", "num_experts_per_tok": 0})", {}, "num_experts_per_tok must be positive"},
      {R"({"model_type": "jtok_moe", "moe_intermediate_size": 0})", {}, "moe_intermediate_size must be positive"},
      {R"({"model_type": "jtok_moe", "num_hidden_layers": 4, "first_k_dense_replace": 5})", {},
       "first_k_dense_replace (5) exceeds num_hidden_layers (4)"},
      {R"({"model_type": "jtok_moe", "first_k_dense_replace": -1})", {}, "first_k_dense_replace must be >= 0"},
      {R"({"model_type": "jtok_moe", "router_aux_loss_coef": -0.1})", {}, "router_aux_loss_coef must be >= 0"},
      {R"({"model_type": "jtok_moe", "norm_topk_prob": "yes"})", {}, "field norm_topk_prob: expected boolean"},
      {R"({"jtokm": true, "jtokm_n_e": 3, "jtokm_top_k": 4})", {}, "field jtokm_top_k (4) exceeds jtokm_n_e (3)"},
      {R"({"jtokm": true, "jtokm_n_e": 0})", {}, "field jtokm_n_e must be positive"},
      {R"({"jtokm": true, "jtokm_top_k": 0})", {}, "field jtokm_top_k must be positive"},
      {R"({"jtokm": true, "jtokm_n_e": 65, "jtokm_top_k": 2})", {}, "jtokm_n_e (65) exceeds 64"},
      {R"({"jtokm": true, "jtokm_aux_loss_coef": -1})", {}, "jtokm_aux_loss_coef must be >= 0"},
      {R"({"jtokm": true, "jtokm_eps": 0})", {}, "jtokm_eps must be positive"},
      {R"({"jtokm": true, "jtokm_layers": "0-9"})", {}, "field jtokm_layers"},
      {R"({"jtokm": "yes"})", {}, "field jtokm: expected boolean"},
      {R"({"table_optimizer": "lazy"})", {}, "field table_optimizer: unknown value 'lazy' (known: dense, sparse, dense-eager)"},
      {R"({"rope_scaling_type": "yarn"})", {}, "field rope_scaling_type: unknown value 'yarn' (known: none, llama3)"},
      {R"({"rope_scaling_type": "llama3", "rope_scaling_factor": 0.5})", {}, "rope_scaling_factor must be >= 1"},
      {R"({"rope_scaling_type": "llama3", "rope_scaling_high_freq_factor": 1})", {}, "must satisfy 0 < low < high"},
      {R"({"qk_norm": 1})", {}, "field qk_norm: expected boolean"},
      {R"({"model_type": "jtok_moe", "decoder_sparse_step": 0})", {}, "decoder_sparse_step must be positive"},
      {R"({"num_hidden_layers": 2, "mlp_only_layers": "0,5"})", {}, "field mlp_only_layers"},
  };
  for (auto& c : cases) {
    std::string e = error_of(c.text, c.ov);
    EXPECT_NE(e.find(c.must_contain), std::string::npos) << "config " << c.text << " gave: '" << e << "'";
  }
  try {
    load_config("/nonexistent/dir/x.json");
    FAIL() << "no error for a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/x.json"), std::string::npos);
  }
}

TEST(Config, MoeLayers) {
  Config c = load_config(write_tmp(R"({"model_type": "jtok_moe", "num_hidden_layers": 4, "first_k_dense_replace": 1,
                                      "n_shared_experts": 2, "moe_intermediate_size": 48})"));
  EXPECT_TRUE(c.model.is_moe());
  EXPECT_FALSE(c.model.moe_on_layer(0));
  EXPECT_TRUE(c.model.moe_on_layer(1));
  EXPECT_EQ(c.model.moe_num_layers(), 3);
  EXPECT_EQ(c.model.shared_intermediate(), 96);
  // Dense models ignore the MoE fields (their defaults need not be consistent with the layers).
  Config d = load_config(write_tmp(R"({"num_hidden_layers": 1, "first_k_dense_replace": 3})"));
  EXPECT_FALSE(d.model.moe_on_layer(0));
  EXPECT_EQ(d.model.moe_num_layers(), 0);
}

// Qwen3-MoE's layer choice: mlp_only_layers keep the dense MLP, and decoder_sparse_step puts MoE
// on every step-th layer (l + 1 divisible by it).
TEST(Config, MoeLayersOfQwen3Moe) {
  Config c = load_config(write_tmp(R"({"model_type": "jtok_moe", "num_hidden_layers": 6, "first_k_dense_replace": 0,
                                      "mlp_only_layers": "3", "decoder_sparse_step": 2})"));
  std::vector<bool> on;
  for (int64_t l = 0; l < 6; ++l) on.push_back(c.model.moe_on_layer(l));
  EXPECT_EQ(on, (std::vector<bool>{false, true, false, false, false, true}));
  EXPECT_EQ(c.model.moe_num_layers(), 2);
}

// A plain model's config.json has no variant field (it reads as it did before they existed); a
// model with one has it, and reads back equal.
TEST(Config, VariantFieldsWrittenOnlyWhenSet) {
  Config plain;
  const nlohmann::json j = to_json(plain);
  for (const char* k : {"qk_norm", "attention_bias", "rope_scaling_type", "rope_scaling_factor", "mlp_only_layers",
                        "decoder_sparse_step"})
    EXPECT_FALSE(j.contains(k)) << k;
  Config v;
  v.model.qk_norm = true;
  v.model.rope_scaling_type = "llama3";
  v.model.rope_scaling_factor = 32;
  const nlohmann::json jv = to_json(v);
  EXPECT_TRUE(jv.at("qk_norm").get<bool>());
  EXPECT_EQ(jv.at("rope_scaling_factor").get<double>(), 32.0);
  EXPECT_FALSE(jv.contains("attention_bias"));
  const Config back = config_from_json(jv, "test");
  EXPECT_TRUE(back.model.qk_norm);
  EXPECT_EQ(back.model.rope_scaling_type, "llama3");
  EXPECT_EQ(back.model.rope_scaling_factor, 32.0);
}

// A boolean training field written to config.json only when not its default (a checkpoint's config
// is what it was): the default, and then absent; the other value set on the command line, written,
// and read back; a non-boolean refused naming the field, in a file and on the command line.
static void expect_variant_bool_field(const std::string& name, bool jtok::TrainConfig::*field, bool default_value) {
  const Config plain = load_config(write_tmp("{}"));
  EXPECT_EQ(plain.train.*field, default_value) << name;
  EXPECT_FALSE(to_json(plain).contains(name));
  const std::string other = default_value ? "false" : "true";
  const Config set = load_config(write_tmp("{}"), {name + "=" + other});
  EXPECT_EQ(set.train.*field, !default_value) << name;
  const nlohmann::json j = to_json(set);
  ASSERT_TRUE(j.contains(name));
  EXPECT_EQ(j.at(name).get<bool>(), !default_value) << name;
  EXPECT_EQ(load_config(write_tmp(j.dump())).train.*field, !default_value) << name;
  for (const char* bad : {"\"no\"", "1"})
    EXPECT_NE(error_of("{\"" + name + "\": " + bad + "}").find("field " + name + ": expected boolean"),
              std::string::npos)
        << name << " = " << bad;
  EXPECT_NE(error_of("{}", {name + "=maybe"}).find("--" + name + ": expected true or false"), std::string::npos);
}

// table_dedup (the token tables' rows deduplicated a micro-batch; false: the GPU's naive gather and
// scatter, a benchmark): true by default, false written.
TEST(Config, TableDedupDefaultsTrueAndIsWrittenOnlyWhenFalse) {
  expect_variant_bool_field("table_dedup", &jtok::TrainConfig::table_dedup, true);
}

// table_streams (--device cuda's table work on side streams): false by default, true written.
TEST(Config, TableStreamsDefaultsFalseAndIsWrittenOnlyWhenTrue) {
  expect_variant_bool_field("table_streams", &jtok::TrainConfig::table_streams, false);
}

TEST(Config, OverrideCanRepairAFileValue) {
  // Validation runs after overrides: a bad value in the file can be fixed on the command line.
  EXPECT_EQ(error_of(R"({"hidden_size": 100, "num_attention_heads": 3, "num_key_value_heads": 1})", {"hidden_size=96"}), "");
}

TEST(Config, ShippedConfigsLoad) {
  const char* root = std::getenv("JTOK_ROOT");
  ASSERT_NE(root, nullptr);
  for (const char* name : {"bench_a", "bench_b", "dense_S", "dense_M", "dense_L", "dense_XL", "cpu_tiny", "cpu_small",
                           "moe_1.5B-A250M", "moe_3.2B-A0.5B", "moe_17B-A2B", "cpu_moe", "qwen3_0.6b"}) {
    std::string p = std::string(root) + "/configs/" + name + ".json";
    EXPECT_NO_THROW(load_config(p)) << p;
  }
}
