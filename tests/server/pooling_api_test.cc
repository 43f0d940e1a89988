// The pooling API's parsers and replies (server/pooling_api), the task a checkpoint's files say
// (detect_serve_task) and the models' media limits (apply_pooling_media_limits). The endpoints
// end to end, against transformers, are tests/server/pooling_server_test.py.
#include "server/pooling_api.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "server/base64.h"
#include "test_util.h"
#include "vlm/pooling.h"
#include "vlm/server.h"

namespace vlm {
namespace {

using nlohmann::json;

TEST(PoolingApi, EmbeddingInputForms) {
  auto r = parse_embeddings(R"({"input": "a", "dimensions": 4, "encoding_format": "base64"})", 10);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.value().inputs.size(), 1u);
  EXPECT_EQ(r.value().inputs[0].text, "a");
  EXPECT_EQ(r.value().dimensions, 4);
  EXPECT_TRUE(r.value().base64);
  r = parse_embeddings(R"({"input": [1, 2, 3]})", 10);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.value().inputs.size(), 1u);
  EXPECT_EQ(r.value().inputs[0].ids, (std::vector<int32_t>{1, 2, 3}));
  r = parse_embeddings(R"({"input": [[1], "b", [2, 3]]})", 10);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.value().inputs.size(), 3u);
  EXPECT_EQ(r.value().inputs[1].kind, PoolingItem::Kind::kText);
  EXPECT_EQ(r.value().inputs[2].ids, (std::vector<int32_t>{2, 3}));
  r = parse_embeddings(R"({"messages": [{"role": "user", "content": "x"}], "max_pixels": 9})", 10);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r.value().inputs.empty());
  EXPECT_EQ(json::parse(r.value().chat_body)["max_pixels"], 9);
}

TEST(PoolingApi, EmbeddingErrorsNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"input": [1, 10]})", "input[1]"},
      {R"({"input": [1.5]})", "input[0]"},
      {R"({"input": []})", "input"},
      {R"({"input": [null]})", "input[0]"},
      {R"({"input": "a", "dimensions": -1})", "dimensions"},
      {R"({"input": "a", "dimensions": 2.5})", "dimensions"},
      {R"({"input": "a", "encoding_format": "binary"})", "encoding_format"},
      {R"({"input": "a", "normalize": 1})", "normalize"},
      {R"({"input": "a", "min_pixels": 5})", "min_pixels"},
      {R"({"messages": [], "instruction": "x"})", "instruction"},
      {R"({"input": "a", "dimension": 3})", "dimension"},
      {R"({"input": "a", "embed_dtype": "float16"})", "embed_dtype"},
      {R"({"input": "a", "model": 3})", "model"},
  };
  for (const auto& [body, param] : cases) {
    auto r = parse_embeddings(body, 10);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.error().http_status, 400) << body;
    EXPECT_EQ(r.error().param, param) << body;
  }
  EXPECT_FALSE(parse_embeddings("[1]", 10).ok());
  EXPECT_FALSE(parse_embeddings("{", 10).ok());
}

TEST(PoolingApi, ScoreSidesAndLengths) {
  auto r = parse_score(R"({"text_1": "q", "text_2": ["a", "b"]})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value().queries.size(), 1u);
  EXPECT_EQ(r.value().documents.size(), 2u);
  // {"content": [...]} on a side: each part an input of its own.
  r = parse_score(
      R"({"queries": "q", "documents": {"content": [{"type": "text", "text": "a"},
          {"type": "image_url", "image_url": {"url": "data:x"}}]}})");
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.value().documents.size(), 2u);
  EXPECT_EQ(r.value().documents[1].kind, PoolingItem::Kind::kParts);
  EXPECT_EQ(json::parse(r.value().documents[1].parts_json).size(), 1u);
  EXPECT_EQ(r.value().documents[1].param, "documents.content[1]");
  // In a list, one {"content": [...]} is one input of all its parts.
  r = parse_score(R"({"data_1": ["q", "r"], "data_2": ["a", {"content": [{"type": "text",
      "text": "b"}, {"type": "text", "text": "c"}]}]})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(json::parse(r.value().documents[1].parts_json).size(), 2u);
  EXPECT_EQ(r.value().documents[1].param, "data_2[1].content");
  auto bad = parse_score(R"({"queries": ["a", "b"], "documents": ["x", "y", "z"]})");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().param, "documents");
  EXPECT_NE(bad.error().message.find("1:1, 1:N or N:N"), std::string::npos);
  EXPECT_FALSE(parse_score(R"({"queries": "a", "documents": "b", "text_1": "c"})").ok());
  EXPECT_FALSE(parse_score(R"({"queries": "a", "documents": 3})").ok());
  EXPECT_FALSE(parse_score(R"({"queries": "a", "documents": [{"content": []}]})").ok());
  EXPECT_FALSE(parse_score(R"({"text_1": "a"})").ok());
}

TEST(PoolingApi, RerankRequest) {
  auto r = parse_rerank(
      R"({"query": "q", "documents": ["a", {"content": [{"type": "text", "text": "b"}]}],
          "top_n": 1, "return_documents": false, "instruction": "I"})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value().top_n, 1);
  EXPECT_FALSE(r.value().return_documents);
  EXPECT_EQ(r.value().instruction, "I");
  ASSERT_EQ(r.value().document_json.size(), 2u);
  EXPECT_EQ(json::parse(r.value().document_json[0]), json({{"text", "a"}}));
  EXPECT_EQ(json::parse(r.value().document_json[1])["multi_modal"][0]["text"], "b");
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({"query": ["q"], "documents": ["a"]})", "query"},
           {R"({"query": "q", "documents": ["a"], "top_n": -2})", "top_n"},
           {R"({"documents": ["a"]})", "query"},
           {R"({"query": "q", "documents": ["a"], "softmax": true, "use_activation": false})",
            "softmax"},
           {R"({"query": "q", "documents": ["a"], "max_chunks_per_doc": 3})",
            "max_chunks_per_doc"}}) {
    auto bad = parse_rerank(body);
    ASSERT_FALSE(bad.ok()) << body;
    EXPECT_EQ(bad.error().param, param) << body;
  }
  auto alias = parse_rerank(R"({"query": "q", "documents": ["a"], "activation": false})");
  ASSERT_TRUE(alias.ok());
  EXPECT_FALSE(alias.value().use_activation);
}

TEST(PoolingApi, RerankReplyIsSortedAndCut) {
  auto req = parse_rerank(R"({"query": "q", "documents": ["a", "b", "c", "d"], "top_n": 3})");
  ASSERT_TRUE(req.ok());
  PoolingReplyInfo info{"rerank-1", "m", 5, 12};
  const json j = json::parse(rerank_json(info, req.value(), {0.2, 0.9, 0.2, 0.5}));
  ASSERT_EQ(j["results"].size(), 3u);
  EXPECT_EQ(j["results"][0]["index"], 1);
  EXPECT_EQ(j["results"][1]["index"], 3);
  EXPECT_EQ(j["results"][2]["index"], 0);  // a tie keeps the documents' order
  EXPECT_EQ(j["results"][0]["document"]["text"], "b");
  EXPECT_EQ(j["usage"], json({{"prompt_tokens", 12}, {"total_tokens", 12}}));
  EXPECT_EQ(j["id"], "rerank-1");
}

TEST(PoolingApi, EmbeddingReplyFloatAndBase64) {
  PoolingReplyInfo info{"embd-1", "m", 5, 7};
  const std::vector<std::vector<float>> e = {{0.5f, -0.25f}, {1.0f / 3, 2.0f}};
  json j = json::parse(embeddings_json(info, e, false));
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][1]["index"], 1);
  EXPECT_EQ(j["data"][1]["object"], "embedding");
  EXPECT_EQ(j["data"][1]["embedding"][0].get<float>(), 1.0f / 3);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 7);
  EXPECT_EQ(j["usage"]["completion_tokens"], 0);
  j = json::parse(embeddings_json(info, e, true));
  auto bytes = base64_decode(j["data"][1]["embedding"].get<std::string>());
  ASSERT_TRUE(bytes.ok());
  ASSERT_EQ(bytes->size(), 8u);
  float back[2];
  std::memcpy(back, bytes->data(), 8);  // little-endian float32, as numpy's frombuffer("<f4")
  EXPECT_EQ(back[0], 1.0f / 3);
  EXPECT_EQ(back[1], 2.0f);
  j = json::parse(score_json(info, {0.25}));
  EXPECT_EQ(j["data"][0], json({{"index", 0}, {"object", "score"}, {"score", 0.25}}));
}

TEST(PoolingApi, TaskFromTheCheckpointsFiles) {
  test_util::TempDir tmp;
  const auto dir = tmp.path();
  auto write = [&](const std::filesystem::path& p, const std::string& text) {
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
  };
  auto task = [&] {
    auto t = detect_serve_task(dir.string());
    EXPECT_TRUE(t.ok()) << t.status().message();
    return t.ok() ? *t : ServeTask::kAuto;
  };
  write(dir / "config.json", R"({"architectures": ["Qwen3VLForConditionalGeneration"]})");
  EXPECT_EQ(task(), ServeTask::kGenerate);
  write(dir / "config.json",
        R"({"architectures": ["Qwen3VLForSequenceClassification"],
            "classifier_from_token": ["no", "yes"]})");
  EXPECT_EQ(task(), ServeTask::kRerank);
  write(dir / "modules.json",
        R"([{"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}])");
  write(dir / "1_Pooling/config.json", R"({"pooling_mode_lasttoken": true})");
  EXPECT_EQ(task(), ServeTask::kEmbed);
  // Values of the wrong type are no pooling mode, never a throw.
  write(dir / "1_Pooling/config.json", R"({"pooling_mode_lasttoken": null})");
  EXPECT_FALSE(detect_serve_task(dir.string()).ok());
  write(dir / "modules.json", R"([{"type": null}, {"path": 3, "type": "x.models.Pooling"}])");
  EXPECT_FALSE(detect_serve_task(dir.string()).ok());  // its config is then dir/config.json's
  write(dir / "modules.json",
        R"([{"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}])");
  write(dir / "1_Pooling/config.json", R"({"pooling_mode_lasttoken": true})");
  EXPECT_EQ(task(), ServeTask::kEmbed);
  write(dir / "1_Pooling/config.json",
        R"({"pooling_mode_lasttoken": false, "pooling_mode_mean_tokens": true})");
  auto mean = detect_serve_task(dir.string());
  ASSERT_FALSE(mean.ok());
  EXPECT_NE(mean.status().message().find("pooling_mode_mean_tokens"), std::string::npos);
  write(dir / "modules.json", "[");
  EXPECT_FALSE(detect_serve_task(dir.string()).ok());
  auto gguf = detect_serve_task((dir / "model.gguf").string());
  ASSERT_TRUE(gguf.ok());
  EXPECT_EQ(*gguf, ServeTask::kGenerate);
  auto parsed = parse_serve_task("rerank");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, ServeTask::kRerank);
  EXPECT_FALSE(parse_serve_task("classify").ok());
}

TEST(PoolingApi, MediaLimitsOfTheModelsCode) {
  PoolingInput in;
  in.images.resize(2);
  in.images[1].max_pixels = 1000;  // the request's own wins
  VideoInput file;
  VideoInput frames;
  frames.frames.resize(100);
  for (size_t i = 0; i < frames.frames.size(); ++i) frames.frames[i].path = std::to_string(i);
  VideoInput few;
  few.frames.resize(3);
  few.frames[2].path = "last";
  in.videos = {file, frames, few};
  apply_pooling_media_limits(&in);
  EXPECT_EQ(in.images[0].min_pixels, 4 * 32 * 32);
  EXPECT_EQ(in.images[0].max_pixels, 1800 * 32 * 32);
  EXPECT_EQ(in.images[1].max_pixels, 1000);
  EXPECT_EQ(in.videos[0].fps, 1.0);
  EXPECT_EQ(in.videos[0].max_frames, 64);
  // numpy.linspace(0, 99, 64, dtype=int), printed by numpy 2.4.6.
  const std::vector<int> want = {0,  1,  3,  4,  6,  7,  9,  11, 12, 14, 15, 17, 18, 20, 22, 23,
                                 25, 26, 28, 29, 31, 33, 34, 36, 37, 39, 40, 42, 44, 45, 47, 48,
                                 50, 51, 53, 55, 56, 58, 59, 61, 62, 64, 66, 67, 69, 70, 72, 73,
                                 75, 77, 78, 80, 81, 83, 84, 86, 88, 89, 91, 92, 94, 95, 97, 99};
  ASSERT_EQ(in.videos[1].frames.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(in.videos[1].frames[i].path, std::to_string(want[i])) << i;
  }
  // qwen-vl-utils per frame: 64 frames, 128·32² .. max(min(768·32², 2·7864320/64), 137625).
  EXPECT_EQ(in.videos[1].min_pixels, 131072 * 64);
  EXPECT_EQ(in.videos[1].max_pixels, 245760 * 64);
  // 3 frames become 4 (qwen-vl-utils pads to even with the last): 768·32² a frame at most.
  ASSERT_EQ(in.videos[2].frames.size(), 4u);
  EXPECT_EQ(in.videos[2].frames[3].path, in.videos[2].frames[2].path);
  EXPECT_EQ(in.videos[2].min_pixels, 131072 * 4);
  EXPECT_EQ(in.videos[2].max_pixels, 786432 * 4);
}

}  // namespace
}  // namespace vlm
