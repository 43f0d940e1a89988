// config.json / generation_config.json parsing: both rope spellings, defaults, bad values.
#include <gtest/gtest.h>

#include "model/qwen3vl_config.h"

namespace vlm {
namespace {

std::string text_config(const std::string& extra) {
  return R"({"text_config": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 1, "vocab_size": 1024)" +
         extra + "}}";
}

TEST(Config, V4RopeScalingSpelling) {
  auto c = parse_qwen3vl_config(text_config(R"(, "head_dim": 128, "rope_theta": 5000000.0,
      "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": true})"),
                                "config.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->text_config.head_dim, 128);
  EXPECT_DOUBLE_EQ(c->text_config.rope_theta, 5e6);
  EXPECT_EQ(c->text_config.mrope_section, (std::vector<int64_t>{24, 20, 20}));
  EXPECT_FALSE(c->tie_word_embeddings);  // Qwen3VLConfig's default
}

TEST(Config, V5RopeParametersSpelling) {
  auto c = parse_qwen3vl_config(text_config(R"(, "head_dim": 128,
      "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [24, 20, 20]}},
      "tie_word_embeddings": true, "dummy": {)"),
                                "config.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_DOUBLE_EQ(c->text_config.rope_theta, 1e6);
  EXPECT_EQ(c->text_config.mrope_section, (std::vector<int64_t>{24, 20, 20}));
  EXPECT_TRUE(c->tie_word_embeddings);
}

TEST(Config, HeadDimDefaultsTo128InQwen3VLTextConfig) {
  auto c = parse_qwen3vl_config(text_config(""), "config.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->text_config.head_dim, 128);
  EXPECT_EQ(c->text_config.mrope_section, (std::vector<int64_t>{64, 0, 0}));
}

TEST(Config, TextConfigTieWinsOverTopLevel) {
  auto c = parse_qwen3vl_config(
      R"({"tie_word_embeddings": true, "text_config": {"hidden_size": 64, "intermediate_size": 64,
      "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 10, "head_dim": 32,
      "tie_word_embeddings": false}})",
      "c.json");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->tie_word_embeddings);
}

TEST(Config, ErrorsNameTheFileAndField) {
  auto bad_json = parse_qwen3vl_config("{", "/x/config.json");
  ASSERT_FALSE(bad_json.ok());
  EXPECT_NE(bad_json.status().message().find("/x/config.json"), std::string::npos);

  auto missing = parse_qwen3vl_config(R"({"text_config": {"hidden_size": 8}})", "/x/config.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("intermediate_size"), std::string::npos);

  auto wrong_type = parse_qwen3vl_config(text_config(R"(, "head_dim": "128")"), "/x/config.json");
  ASSERT_FALSE(wrong_type.ok());
  EXPECT_NE(wrong_type.status().message().find("head_dim"), std::string::npos);

  auto bad_section = parse_qwen3vl_config(
      text_config(R"(, "head_dim": 128, "rope_scaling": {"mrope_section": [24, 20, 21]})"),
      "c.json");
  ASSERT_FALSE(bad_section.ok());
  EXPECT_NE(bad_section.status().message().find("mrope_section"), std::string::npos);

  auto bad_gqa = parse_qwen3vl_config(
      R"({"text_config": {"hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 1,
      "num_attention_heads": 3, "num_key_value_heads": 2, "vocab_size": 10}})",
      "c.json");
  EXPECT_FALSE(bad_gqa.ok());

  auto yarn = parse_qwen3vl_config(
      text_config(R"(, "rope_scaling": {"rope_type": "yarn", "mrope_section": [24, 20, 20]})"),
      "c.json");
  ASSERT_FALSE(yarn.ok());
  EXPECT_EQ(yarn.status().code(), StatusCode::kUnimplemented);
}

TEST(Config, MixtureOfExpertsFieldsAndTheirDefaults) {
  // A dense config has no experts.
  auto dense = parse_qwen3vl_config(text_config(""), "config.json");
  ASSERT_TRUE(dense.ok());
  EXPECT_EQ(dense->text_config.num_experts, 0);
  EXPECT_FALSE(dense->text_config.sparse_layer(0));
  // qwen3_vl_moe without the fields: transformers' Qwen3VLMoeTextConfig defaults.
  auto d = parse_qwen3vl_config(
      R"({"model_type": "qwen3_vl_moe", "text_config": {"hidden_size": 256,
      "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
      "vocab_size": 1024}})",
      "config.json");
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->text_config.num_experts, 60);
  EXPECT_EQ(d->text_config.num_experts_per_tok, 4);
  EXPECT_EQ(d->text_config.moe_intermediate_size, 1408);
  EXPECT_TRUE(d->text_config.norm_topk_prob);
  for (int64_t l = 0; l < 4; ++l) EXPECT_TRUE(d->text_config.sparse_layer(l));
  // 30B-A3B's fields, a sparse step and dense layers.
  auto c =
      parse_qwen3vl_config(text_config(R"(, "model_type": "qwen3_vl_moe_text", "num_experts": 128,
      "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 2,
      "mlp_only_layers": [1], "norm_topk_prob": false)"),
                           "config.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  const Qwen3VLTextConfig& t = c->text_config;
  EXPECT_EQ(t.num_experts, 128);
  EXPECT_EQ(t.num_experts_per_tok, 8);
  EXPECT_EQ(t.moe_intermediate_size, 768);
  EXPECT_FALSE(t.norm_topk_prob);
  EXPECT_FALSE(t.sparse_layer(0));  // (0 + 1) % 2 != 0
  EXPECT_FALSE(t.sparse_layer(1));  // in mlp_only_layers
  // Bad values are named.
  for (const char* bad : {R"(, "num_experts": 8, "num_experts_per_tok": 9,
                             "moe_intermediate_size": 64)",
                          R"(, "num_experts": 8, "num_experts_per_tok": 2)",
                          R"(, "num_experts": 8, "num_experts_per_tok": 2,
                             "moe_intermediate_size": 64, "mlp_only_layers": [2])",
                          R"(, "num_experts": 8, "num_experts_per_tok": 2,
                             "moe_intermediate_size": 64, "decoder_sparse_step": 0)",
                          R"(, "num_experts": 8, "num_experts_per_tok": 2,
                             "moe_intermediate_size": 64, "norm_topk_prob": 1)"}) {
    auto r = parse_qwen3vl_config(text_config(bad), "/x/config.json");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("/x/config.json: text_config"), std::string::npos)
        << r.status().message();
  }
}

TEST(Config, VisionConfigIsReadAndChecked) {
  const std::string text = R"("text_config": {"hidden_size": 64, "intermediate_size": 64,
      "num_hidden_layers": 4, "num_attention_heads": 2, "vocab_size": 10, "head_dim": 32})";
  auto vision = [&](const std::string& v) {
    return parse_qwen3vl_config("{" + text + R"(, "vision_config": {"depth": 4, "hidden_size": 32,
        "num_heads": 2, "intermediate_size": 64, "patch_size": 16, "temporal_patch_size": 2,
        "spatial_merge_size": 2, "out_hidden_size": 64, "num_position_embeddings": 2304,
        "deepstack_visual_indexes": [0, 1, 3], "hidden_act": "gelu_pytorch_tanh")" +
                                    v + "}}",
                                "c.json");
  };
  auto ok = vision("");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_TRUE(ok->has_vision);
  EXPECT_EQ(ok->vision_config.deepstack_visual_indexes, (std::vector<int64_t>{0, 1, 3}));
  EXPECT_EQ(ok->vision_config.num_position_embeddings, 2304);
  EXPECT_FALSE(vision(R"(, "num_position_embeddings": 2000)").ok());     // not a square
  EXPECT_FALSE(vision(R"(, "deepstack_visual_indexes": [0, 9])").ok());  // past the depth
  EXPECT_FALSE(vision(R"(, "out_hidden_size": 32)").ok());  // must feed the text hidden size
  EXPECT_FALSE(vision(R"(, "num_heads": 3)").ok());
}

TEST(GenerationConfig, ReadsSamplingDefaultsAndEosList) {
  auto g = parse_generation_config(
      R"({"bos_token_id": 151643, "pad_token_id": 151643, "do_sample": true,
      "eos_token_id": [151645, 151643], "temperature": 0.7, "top_k": 20, "top_p": 0.8})",
      "g.json");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->eos_token_id, (std::vector<int64_t>{151645, 151643}));
  EXPECT_TRUE(g->do_sample);
  EXPECT_DOUBLE_EQ(g->temperature, 0.7);
  EXPECT_EQ(g->top_k, 20);
  EXPECT_DOUBLE_EQ(g->top_p, 0.8);
  auto single = parse_generation_config(R"({"eos_token_id": 2})", "g.json");
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->eos_token_id, (std::vector<int64_t>{2}));
  EXPECT_FALSE(parse_generation_config("[]", "g.json").ok());
}

}  // namespace
}  // namespace vlm
