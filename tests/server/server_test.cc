// `vlm serve` over HTTP on 127.0.0.1: chat completions (plain and streamed), concurrency, errors
// with their statuses, metrics. The model is the full-vocabulary tiny fixture with the real
// tokenizer beside it.
#include "vlm/server.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "server/http_transport.h"
#include "server/test_http_client.h"
#include "test_util.h"
#include "vlm/chat.h"
#include "vlm/engine.h"
#include "vlm/tokenizer.h"

namespace vlm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class ServerTest : public ::testing::Test {
 protected:
  // The model is the tiny fixture with the real tokenizer, linked into tmp_;
  // VLM_SERVER_TEST_MODEL_DIR names another directory instead (a CTest case gives an empty one:
  // every test must then fail with the load error, and none may touch a server that is not there).
  static void SetUpTestSuite() {
    tmp_ = new test_util::TempDir();
    const char* dir = std::getenv("VLM_SERVER_TEST_MODEL_DIR");
    if (dir != nullptr && *dir != 0) {
      model_dir_ = dir;
    } else {
      model_dir_ = tmp_->str();
      const std::string src = std::string(VLM_FIXTURES_DIR) + "/tiny-fullvocab-bf16";
      for (const char* f : {"config.json", "generation_config.json", "model.safetensors"}) {
        fs::create_symlink(fs::absolute(src + "/" + f), tmp_->path() / f);
      }
      fs::create_symlink(fs::absolute(std::string(VLM_TESTDATA_DIR) + "/tokenizer/tokenizer.json"),
                         tmp_->path() / "tokenizer.json");
    }
    ServeOptions o = tiny_options();
    o.engine.batching.max_num_seqs =
        4;  // 16 concurrent requests: most of them queue and join later
    o.engine.batching.max_batched_tokens = 64;
    o.engine.batching.block_size = 8;
    auto s = Server::create(o);
    if (!s.ok()) {
      setup_error_ = "the server did not start: " + s.status().message();
      return;
    }
    if (Status loaded = (*s)->wait_until_loaded(); !loaded.ok()) {
      setup_error_ = "the model did not load: " + loaded.message();
      return;
    }
    server_ = std::move(s).value().release();
    thread_ = new std::thread([] { server_->run(); });
  }
  void SetUp() override {
    if (!setup_error_.empty()) GTEST_FAIL() << setup_error_;
  }
  // A server on any free port for the tiny model in model_dir_, served as "tiny".
  static ServeOptions tiny_options() {
    ServeOptions o;
    o.engine.model_dir = model_dir_;
    o.engine.n_threads = 2;
    o.engine.max_context = 512;
    o.port = 0;
    o.model_names = {"tiny"};
    return o;
  }
  // tiny_options() with small steps (4 sequences, 64 tokens, blocks of 8): several chats share
  // each step and fill blocks within a few turns.
  static ServeOptions small_step_options() {
    ServeOptions o = tiny_options();
    o.engine.batching.max_num_seqs = 4;
    o.engine.batching.max_batched_tokens = 64;
    o.engine.batching.block_size = 8;
    return o;
  }
  static void TearDownTestSuite() {
    if (server_ != nullptr) {
      server_->stop();
      thread_->join();
    }
    delete thread_;
    delete server_;
    delete tmp_;
  }

  test_http::Client client() { return test_http::Client(server_->port()); }

  static json chat_body(const std::string& text, int max_tokens, bool stream = false) {
    return json{{"model", "tiny"},
                {"messages", json::array({json{{"role", "user"}, {"content", text}}})},
                {"max_tokens", max_tokens},
                {"temperature", 0},
                {"stream", stream}};
  }

  // What the same request gives through the engine directly (greedy, same template).
  static std::string reference_reply(const std::string& text, int max_tokens) {
    static std::unique_ptr<Engine> engine = [] {
      EngineOptions o;
      o.model_dir = model_dir_;
      o.max_context = 512;
      return std::move(Engine::load(o)).value();
    }();
    ChatMessage m;
    m.role = "user";
    m.text = text;
    GenerateRequest r;
    r.prompt_ids = engine->tokenizer()->encode(render_chat({m}, {}));
    r.max_new_tokens = max_tokens;
    r.sampling.temperature = 0;
    return engine->generate(r)->text;
  }

  static std::string stream_text(const std::string& sse, bool* saw_done, std::string* finish) {
    std::string text;
    size_t pos = 0;
    while ((pos = sse.find("data: ", pos)) != std::string::npos) {
      const size_t end = sse.find("\n\n", pos);
      const std::string payload = sse.substr(pos + 6, end - pos - 6);
      pos = end;
      if (payload == "[DONE]") {
        *saw_done = true;
        continue;
      }
      json j = json::parse(payload);
      if (j["choices"].empty()) continue;  // the usage chunk
      const json& d = j["choices"][0]["delta"];
      if (d.contains("content")) text += d["content"].get<std::string>();
      if (!j["choices"][0]["finish_reason"].is_null()) *finish = j["choices"][0]["finish_reason"];
    }
    return text;
  }

  static test_util::TempDir* tmp_;
  static std::string model_dir_;
  static std::string setup_error_;
  static Server* server_;
  static std::thread* thread_;
};

test_util::TempDir* ServerTest::tmp_ = nullptr;
std::string ServerTest::model_dir_;
std::string ServerTest::setup_error_;
Server* ServerTest::server_ = nullptr;
std::thread* ServerTest::thread_ = nullptr;

TEST_F(ServerTest, HealthAndModels) {
  auto c = client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(json::parse(m->body)["data"][0]["id"], "tiny");
}

TEST_F(ServerTest, PlainAndStreamedRepliesEqualTheEngine) {
  const std::string want = reference_reply("Describe a cat.", 12);
  auto c = client();
  auto r =
      c.Post("/v1/chat/completions", chat_body("Describe a cat.", 12).dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["content"], want);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);

  json body = chat_body("Describe a cat.", 12, true);
  body["stream_options"] = {{"include_usage", true}};
  auto s = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(s);
  ASSERT_EQ(s->status, 200);
  bool done = false;
  std::string finish;
  EXPECT_EQ(stream_text(s->body, &done, &finish), want);
  EXPECT_TRUE(done);
  EXPECT_EQ(finish, "length");
  EXPECT_NE(s->body.find("\"usage\""), std::string::npos);
}

TEST_F(ServerTest, ConcurrentStreamsEqualSequentialReplies) {
  const int kN = 16;
  std::vector<std::string> want(kN), got(kN);
  for (int i = 0; i < kN; ++i)
    want[i] = reference_reply("Question number " + std::to_string(i), 6 + i % 3);
  std::vector<std::thread> threads;
  for (int i = 0; i < kN; ++i) {
    threads.emplace_back([&, i] {
      auto c = client();
      auto s = c.Post("/v1/chat/completions",
                      chat_body("Question number " + std::to_string(i), 6 + i % 3, true).dump(),
                      "application/json");
      if (!s || s->status != 200) return;
      bool done = false;
      std::string finish;
      got[i] = stream_text(s->body, &done, &finish);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(got, want);
}

TEST_F(ServerTest, BadRequestsGetTheirStatusAndTheServerStaysUp) {
  auto c = client();
  struct Case {
    std::string body;
    int status;
    std::string needle;
  } cases[] = {
      {"{bad json", 400, "malformed JSON"},
      {R"({"messages": "hi"})", 400, "messages"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})", 400,
       "temperature"},
      {R"({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]})", 404, "gpt-9"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}]}]})",
       400, "base64"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, {"type": "text", "text": "x"}]}]})",
       400, "image"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 9})", 400, "n"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", 400, "logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 100000})", 400, "context"},
  };
  Case completion_cases[] = {
      {R"({"max_tokens": 3})", 400, "prompt"},
      {R"({"prompt": [1, -2]})", 400, "token ids"},
      {R"({"prompt": [151936]})", 400, "vocabulary"},
      {R"({"prompt": "x", "suffix": "y"})", 400, "suffix"},
      {R"({"prompt": "x", "echo": true, "logprobs": 1})", 400, "echo"},
      {R"({"prompt": ["a", "b", "c"], "n": 3})", 400, "n"},
      {R"({"prompt": "x", "max_tokens": 100000})", 400, "context"},
  };
  auto check = [&](const char* path, const Case& k) {
    auto r = c.Post(path, k.body, "application/json");
    ASSERT_TRUE(r) << k.body;
    EXPECT_EQ(r->status, k.status) << k.body << " → " << r->body;
    EXPECT_NE(r->body.find(k.needle), std::string::npos) << k.body << " → " << r->body;
    EXPECT_TRUE(json::parse(r->body).contains("error")) << r->body;
  };
  for (const auto& k : cases) check("/v1/chat/completions", k);
  for (const auto& k : completion_cases) check("/v1/completions", k);
  auto ok = c.Post("/v1/chat/completions", chat_body("still there?", 3).dump(), "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

std::string base64_encode(const std::string& in) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < in.size(); i += 3) {
    uint32_t v = static_cast<uint8_t>(in[i]) << 16;
    if (i + 1 < in.size()) v |= static_cast<uint8_t>(in[i + 1]) << 8;
    if (i + 2 < in.size()) v |= static_cast<uint8_t>(in[i + 2]);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < in.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < in.size() ? kAlphabet[v & 63] : '=';
  }
  return out;
}

// --allow-remote-media: http(s) image URLs are fetched (here from a local HTTP server) and give
// what the same bytes give as a data: URL; fetch failures are 400s naming the URL.
TEST_F(ServerTest, RemoteImagesAreFetchedOnlyWhenAllowed) {
  const std::string png =
      test_util::read_file(std::string(VLM_FIXTURES_DIR) + "/vision-f32/synthetic_tiny.png");
  // The media server is vlm's own HTTP transport.
  http::HttpServer media(http::TransportOptions{});
  auto serve = [](std::string body) {
    return [body](std::shared_ptr<http::HttpExchange> ex) {
      http::HttpResponse r;
      r.content_type = "image/png";
      r.body = body;
      ex->respond(std::move(r));
    };
  };
  media.route("GET", "/cat.png", http::RunOn::kIoThread, serve(png));
  media.route("GET", "/big.png", http::RunOn::kIoThread,
              serve(std::string((size_t{20} << 20) + 1, 'x')));
  media.route("GET", "/moved.png", http::RunOn::kIoThread,
              [](std::shared_ptr<http::HttpExchange> ex) {
                http::HttpResponse r;
                r.status = 302;
                r.headers.push_back({"Location", "/cat.png"});
                ex->respond(std::move(r));
              });
  ASSERT_TRUE(media.listen("127.0.0.1", 0).ok());
  const int media_port = media.port();
  std::thread media_thread([&] { media.run(); });

  ServeOptions o = tiny_options();
  o.allow_remote_media = true;
  auto remote = Server::create(o);
  ASSERT_TRUE(remote.ok()) << remote.status().message();
  ASSERT_TRUE((*remote)->wait_until_loaded().ok());
  std::thread remote_thread([&] { (*remote)->run(); });

  auto ask = [](int port, const std::string& url) {
    json body = chat_body("What is this?", 2);
    body["messages"][0]["content"] =
        json::array({json{{"type", "image_url"}, {"image_url", {{"url", url}}}},
                     json{{"type", "text"}, {"text", "What is this?"}}});
    return test_http::Client(port).Post("/v1/chat/completions", body.dump(), "application/json");
  };
  const std::string base = "http://127.0.0.1:" + std::to_string(media_port);
  auto fetched = ask((*remote)->port(), base + "/cat.png");
  auto inline_png = ask((*remote)->port(), "data:image/png;base64," + base64_encode(png));
  ASSERT_TRUE(fetched && inline_png);
  ASSERT_EQ(fetched->status, 200) << fetched->body;
  ASSERT_EQ(inline_png->status, 200) << inline_png->body;
  const json fetched_usage = json::parse(fetched->body)["usage"];
  const json inline_usage = json::parse(inline_png->body)["usage"];
  EXPECT_EQ(fetched_usage["prompt_tokens"], inline_usage["prompt_tokens"]);
  EXPECT_EQ(fetched_usage["completion_tokens"], inline_usage["completion_tokens"]);
  // The same bytes are the same image, however they came: the second prompt is served from the
  // prefix cache up to its last whole block before the final token.
  EXPECT_EQ(fetched_usage["prompt_tokens_details"]["cached_tokens"], 0);
  const int64_t prompt = inline_usage["prompt_tokens"];
  EXPECT_EQ(inline_usage["prompt_tokens_details"]["cached_tokens"], (prompt - 1) / 16 * 16);
  EXPECT_EQ(json::parse(fetched->body)["choices"][0]["message"]["content"],
            json::parse(inline_png->body)["choices"][0]["message"]["content"]);
  auto redirected = ask((*remote)->port(), base + "/moved.png");
  ASSERT_TRUE(redirected);
  ASSERT_EQ(redirected->status, 200) << redirected->body;
  EXPECT_EQ(json::parse(redirected->body)["choices"][0]["message"]["content"],
            json::parse(fetched->body)["choices"][0]["message"]["content"]);
  auto missing = ask((*remote)->port(), base + "/nope.png");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 400);
  EXPECT_NE(missing->body.find("HTTP status 404"), std::string::npos) << missing->body;
  auto big = ask((*remote)->port(), base + "/big.png");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413) << big->body;
  // The default server refuses the same URL without fetching it.
  auto refused = ask(server_->port(), base + "/cat.png");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400);
  EXPECT_NE(refused->body.find("not enabled"), std::string::npos) << refused->body;

  (*remote)->stop();
  remote_thread.join();
  media.stop();
  media_thread.join();
}

// While the model loads, /health and the API answer 503; a model that fails to load makes run()
// return that error.
TEST_F(ServerTest, AnEmptyServedModelNameIsRefused) {
  ServeOptions o = tiny_options();
  o.model_names = {"tiny", ""};
  auto s = Server::create(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--served-model-name"), std::string::npos)
      << s.status().message();
}

TEST_F(ServerTest, Answers503WhileLoadingAndRunReportsLoadFailure) {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  ServeOptions o = tiny_options();
  o.before_load = [&] {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return release; });
  };
  auto s = Server::create(o);
  ASSERT_TRUE(s.ok()) << s.status().message();
  std::thread t([&] { (*s)->run(); });
  test_http::Client c((*s)->port());
  auto h = c.Get("/health");
  for (int i = 0; i < 200 && !h; ++i) {  // until the listener is up
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    h = c.Get("/health");
  }
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 503);
  auto r = c.Post("/v1/chat/completions", chat_body("hi", 2).dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_TRUE(json::parse(r->body).contains("error"));
  EXPECT_EQ(c.Get("/v1/models")->status, 503);
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  ASSERT_TRUE((*s)->wait_until_loaded().ok());
  EXPECT_EQ(c.Get("/health")->status, 200);
  auto ok = c.Post("/v1/chat/completions", chat_body("hi", 2).dump(), "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  (*s)->stop();
  t.join();

  ServeOptions bad = o;
  bad.before_load = nullptr;
  bad.engine.model_dir = tmp_->str() + "/no-such-model";
  auto b = Server::create(bad);
  ASSERT_TRUE(b.ok());
  Status st = (*b)->run();  // returns by itself: the load fails
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("no-such-model"), std::string::npos) << st.message();
}

TEST_F(ServerTest, MetricsReportRequestsAndKvBlocks) {
  auto c = client();
  auto r = c.Post("/v1/chat/completions", chat_body("count me", 2).dump(), "application/json");
  ASSERT_TRUE(r);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  for (const char* s :
       {"vlm_requests_total{outcome=\"ok\"}", "vlm_time_to_first_token_seconds_bucket",
        "vlm_kv_cache_blocks_capacity", "vlm_kv_cache_blocks_used 0", "vlm_generation_tokens_total",
        "vlm_kv_cache_tokens_capacity", "vlm_kv_cache_memory_bytes"}) {
    EXPECT_NE(m->body.find(s), std::string::npos) << s << "\n" << m->body;
  }
}

// --chat-template replaces the checkpoint's template; chat_template_kwargs reach it; a
// conversation it refuses (raise_exception) is a 400 naming the reason.
TEST_F(ServerTest, ChatTemplateFileAndKwargs) {
  test_util::TempDir dir;
  const std::string path = (dir.path() / "t.jinja").string();
  std::ofstream(path) << "{% if messages | length > 1 %}{{ raise_exception('one message only') "
                         "}}{% endif %}<|im_start|>user\n{% if shout %}LOUD {% endif %}{{ "
                         "messages[0].content }}<|im_end|>\n<|im_start|>assistant\n";
  ServeOptions o = tiny_options();
  o.engine.chat_template = path;
  auto s = Server::create(o);
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_TRUE((*s)->wait_until_loaded().ok());
  std::thread th([&] { (*s)->run(); });
  auto post = [&](const json& body) {
    return test_http::Client((*s)->port())
        .Post("/v1/chat/completions", body.dump(), "application/json");
  };
  json plain = chat_body("Hi", 1);
  json loud = plain;
  loud["chat_template_kwargs"] = {{"shout", true}};
  auto a = post(plain), b = post(loud);
  ASSERT_TRUE(a && b);
  ASSERT_EQ(a->status, 200) << a->body;
  ASSERT_EQ(b->status, 200) << b->body;
  // "LOUD " adds tokens to the prompt.
  EXPECT_GT(json::parse(b->body)["usage"]["prompt_tokens"].get<int>(),
            json::parse(a->body)["usage"]["prompt_tokens"].get<int>());
  json two = plain;
  two["messages"].push_back({{"role", "assistant"}, {"content", "x"}});
  auto c = post(two);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 400);
  EXPECT_NE(c->body.find("one message only"), std::string::npos) << c->body;
  EXPECT_EQ(json::parse(c->body)["error"]["param"], "messages") << c->body;
  json bad = plain;
  bad["chat_template_kwargs"] = {{"messages", 1}};
  auto d = post(bad);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->status, 400) << d->body;
  (*s)->stop();
  th.join();
  // A template that does not parse fails the load, naming the place.
  std::ofstream(path) << "{% if %}";
  auto broken = Server::create(o);
  ASSERT_TRUE(broken.ok());
  const Status loaded = (*broken)->wait_until_loaded();
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.message().find("t.jinja"), std::string::npos) << loaded.message();
}

// 16 clients hold 3-turn chats about an image at once, against this server (prefix caching on)
// and one with it off: every reply is the same, later turns are served mostly from the cache,
// and no block stays in use.
// Chats of `turns` requests from `clients` threads at once: an image (one of two fixtures) and a
// question, then follow-ups carrying the whole chat so far; each turn's greedy reply and the
// prompt tokens the server found cached.
struct MultiTurnChat {
  std::vector<std::string> replies;
  std::vector<int64_t> cached;
};

std::vector<MultiTurnChat> multi_turn_chats(int port, const std::string& model, int clients,
                                            int turns) {
  std::vector<std::string> images;
  for (const char* f : {"synthetic_tiny.png", "synthetic_tall.png"}) {
    images.push_back(
        "data:image/png;base64," +
        base64_encode(test_util::read_file(std::string(VLM_FIXTURES_DIR) + "/vision-f32/" + f)));
  }
  auto talk = [&](int i) {
    MultiTurnChat chat;
    json messages = json::array(
        {json{{"role", "user"},
              {"content",
               json::array({json{{"type", "image_url"}, {"image_url", {{"url", images[i % 2]}}}},
                            json{{"type", "text"},
                                 {"text", "What is in picture " + std::to_string(i) + "?"}}})}}});
    for (int t = 0; t < turns; ++t) {
      const json body = {{"model", model},
                         {"messages", messages},
                         {"max_tokens", 6 + (i + t) % 3},
                         {"temperature", 0}};
      auto r =
          test_http::Client(port).Post("/v1/chat/completions", body.dump(), "application/json");
      if (!r || r->status != 200) {
        ADD_FAILURE() << "client " << i << " turn " << t << ": " << (r ? r->body : "no reply");
        return chat;
      }
      const json reply = json::parse(r->body);
      const std::string text = reply["choices"][0]["message"]["content"];
      chat.replies.push_back(text);
      chat.cached.push_back(reply["usage"]["prompt_tokens_details"]["cached_tokens"]);
      messages.push_back(json{{"role", "assistant"}, {"content", text}});
      messages.push_back(
          json{{"role", "user"}, {"content", "And then? (" + std::to_string(t) + ")"}});
    }
    return chat;
  };
  std::vector<MultiTurnChat> chats(static_cast<size_t>(clients));
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) threads.emplace_back([&, i] { chats[i] = talk(i); });
  for (auto& th : threads) th.join();
  return chats;
}

// The replies of chats with prefix caching equal those without, and every later turn finds more
// of its prompt cached than the one before (`strict`), or no less and the last more than the
// first (a hybrid model's hits end at snapshot points, and a first turn may resume from another
// chat's snapshot at the same point as its second turn from its own). Returns the later turns'
// cached tokens.
int64_t expect_same_replies_and_growing_hits(const std::vector<MultiTurnChat>& with,
                                             const std::vector<MultiTurnChat>& without,
                                             bool strict) {
  int64_t later_turns_cached = 0;
  for (size_t i = 0; i < with.size(); ++i) {
    EXPECT_EQ(with[i].replies, without[i].replies) << "client " << i;
    for (int64_t c : without[i].cached) EXPECT_EQ(c, 0);
    const std::vector<int64_t>& c = with[i].cached;
    for (size_t t = 1; t < c.size(); ++t) {
      if (strict) {
        EXPECT_GT(c[t], c[t - 1]) << "client " << i << " turn " << t;
      } else {
        EXPECT_GE(c[t], c[t - 1]) << "client " << i << " turn " << t;
      }
      later_turns_cached += c[t];
    }
    if (c.size() > 1) EXPECT_GT(c.back(), c.front()) << "client " << i;
  }
  return later_turns_cached;
}

// Servers run on threads of their own for one test; every one is stopped and joined when the
// test ends, an ASSERT's early return included.
class ServerThreads {
 public:
  ~ServerThreads() {
    for (auto& s : servers_) s->stop();
    for (auto& t : threads_) t.join();
  }
  // Creates and loads a server for `o` and runs it; null (and a failure recorded) if it fails.
  Server* start(const ServeOptions& o) {
    auto s = Server::create(o);
    if (!s.ok()) {
      ADD_FAILURE() << s.status().message();
      return nullptr;
    }
    if (Status loaded = (*s)->wait_until_loaded(); !loaded.ok()) {
      ADD_FAILURE() << loaded.message();
      return nullptr;
    }
    servers_.push_back(std::move(s).value());
    Server* srv = servers_.back().get();
    threads_.emplace_back([srv] { srv->run(); });
    return srv;
  }

 private:
  std::vector<std::unique_ptr<Server>> servers_;
  std::vector<std::thread> threads_;
};

TEST_F(ServerTest, MultiTurnChatsEqualWithAndWithoutPrefixCaching) {
  ServeOptions o = small_step_options();
  o.engine.batching.prefix_caching = false;
  ServerThreads run;
  Server* plain = run.start(o);
  ASSERT_NE(plain, nullptr);
  const auto without = multi_turn_chats(plain->port(), "tiny", 16, 3);
  const auto with = multi_turn_chats(server_->port(), "tiny", 16, 3);
  EXPECT_GT(expect_same_replies_and_growing_hits(with, without, /*strict=*/true), 0);
  auto m = client().Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("vlm_kv_cache_blocks_used 0"), std::string::npos) << m->body;
  EXPECT_EQ(m->body.find("vlm_prefix_cache_hits_total 0\n"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("vlm_prefix_cache_queries_total"), std::string::npos) << m->body;
}

// The value of the /metrics line that starts with `series` (a name and its labels, the closing
// brace left out where more labels follow); -1 and a failure when there is none.
double metric_value(const std::string& body, const std::string& series) {
  const size_t at = body.find(series);
  if (at == std::string::npos) {
    ADD_FAILURE() << series << " missing:\n" << body;
    return -1.0;
  }
  return std::stod(body.substr(body.find(' ', body.find('}', at)) + 1));
}

// Served with prompt lookup (--spec ngram): the same multi-turn image chats reply as without it
// (greedy), and /metrics counts the proposals under vLLM's spec_decode names: accepted tokens
// are the sum over positions and no more than those proposed.
TEST_F(ServerTest, PromptLookupRepliesEqualAndIsCountedOnMetrics) {
  ServeOptions o = small_step_options();
  o.engine.batching.spec.method = SpecMethod::kNgram;
  o.engine.batching.spec.ngram_min = 1;
  ServerThreads run;
  Server* spec = run.start(o);
  ASSERT_NE(spec, nullptr);
  const auto with = multi_turn_chats(spec->port(), "tiny", 8, 3);
  const auto without = multi_turn_chats(server_->port(), "tiny", 8, 3);
  for (size_t i = 0; i < with.size(); ++i) EXPECT_EQ(with[i].replies, without[i].replies) << i;
  // A grammar masks the verified rows as it masks plain ones: the same JSON object either way.
  json body = chat_body("Describe a cat as JSON.", 40);
  body["response_format"] = {{"type", "json_object"}};
  std::string replies[2];
  for (int i = 0; i < 2; ++i) {
    auto r = test_http::Client(i == 0 ? spec->port() : server_->port())
                 .Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no reply");
    replies[i] = json::parse(r->body)["choices"][0]["message"]["content"];
  }
  EXPECT_EQ(replies[0], replies[1]);
  EXPECT_EQ(replies[0].rfind("{", 0), 0u) << replies[0];
  auto m = test_http::Client(spec->port()).Get("/metrics");
  ASSERT_TRUE(m);
  auto value = [&](const std::string& series) { return metric_value(m->body, series); };
  const std::string labels = "{model_name=\"tiny\",engine=\"0\"";
  const double drafts = value("vllm:spec_decode_num_drafts_total" + labels);
  const double proposed = value("vllm:spec_decode_num_draft_tokens_total" + labels);
  const double accepted = value("vllm:spec_decode_num_accepted_tokens_total" + labels);
  double per_pos = 0;
  for (int p = 0; p < o.engine.batching.spec.num_tokens; ++p) {
    per_pos += value("vllm:spec_decode_num_accepted_tokens_per_pos_total" + labels +
                     ",position=\"" + std::to_string(p) + "\"");
  }
  EXPECT_GT(drafts, 0);
  EXPECT_GE(proposed, drafts);
  EXPECT_LE(accepted, proposed);
  EXPECT_EQ(per_pos, accepted);
}

// A draft model served (the tiny model drafting for itself): multi-turn chats reply as without
// it, and the metrics count its proposals, nearly all accepted.
TEST_F(ServerTest, ADraftModelRepliesEqualAndIsCountedOnMetrics) {
  ServeOptions o = small_step_options();
  o.engine.batching.spec.method = SpecMethod::kDraft;
  o.engine.batching.spec.draft_model = model_dir_;
  ServerThreads run;
  Server* spec = run.start(o);
  ASSERT_NE(spec, nullptr);
  const auto with = multi_turn_chats(spec->port(), "tiny", 4, 2);
  const auto without = multi_turn_chats(server_->port(), "tiny", 4, 2);
  for (size_t i = 0; i < with.size(); ++i) EXPECT_EQ(with[i].replies, without[i].replies) << i;
  auto m = test_http::Client(spec->port()).Get("/metrics");
  ASSERT_TRUE(m);
  const std::string labels = "{model_name=\"tiny\",engine=\"0\"}";
  const double proposed = metric_value(m->body, "vllm:spec_decode_num_draft_tokens_total" + labels);
  const double accepted =
      metric_value(m->body, "vllm:spec_decode_num_accepted_tokens_total" + labels);
  EXPECT_GT(proposed, 0);
  EXPECT_GE(accepted, 0.9 * proposed);
}

// A hybrid model (the Qwen3.5 fixture) served: multi-turn image chats resume from state
// snapshots (every 16 tokens here) and reply as without prefix caching; the load message's state
// is on /metrics (slots, snapshot capacity, bytes, snapshots held) beside the K/V blocks, all
// within --kv-cache-memory.
TEST_F(ServerTest, HybridModelServesChatsFromStateSnapshots) {
  ServeOptions o;
  o.engine.model_dir = std::string(VLM_FIXTURES_DIR) + "/qwen35-f32-a";
  o.engine.n_threads = 2;
  o.engine.max_context = 512;
  o.engine.batching.max_num_seqs = 4;
  o.engine.batching.max_batched_tokens = 64;
  o.engine.batching.block_size = 8;
  o.engine.batching.state_snapshot_interval = 16;
  o.engine.batching.state_snapshots = 64;  // every chat's snapshots stay (none replaced)
  o.engine.batching.kv_cache_memory = 8 << 20;
  o.port = 0;
  o.model_names = {"q35"};
  ServerThreads run;
  o.engine.batching.prefix_caching = false;
  Server* plain = run.start(o);
  ASSERT_NE(plain, nullptr);
  o.engine.batching.prefix_caching = true;
  Server* caching = run.start(o);
  ASSERT_NE(caching, nullptr);
  const auto without = multi_turn_chats(plain->port(), "q35", 8, 3);
  const auto with = multi_turn_chats(caching->port(), "q35", 8, 3);
  EXPECT_GT(expect_same_replies_and_growing_hits(with, without, /*strict=*/false), 0);
  auto m = test_http::Client(caching->port()).Get("/metrics");
  ASSERT_TRUE(m);
  auto value = [&](const std::string& name) {
    const size_t at = m->body.find("\n" + name + " ");
    EXPECT_NE(at, std::string::npos) << name << "\n" << m->body;
    return at == std::string::npos ? -1.0 : std::stod(m->body.substr(at + name.size() + 2));
  };
  EXPECT_EQ(value("vlm_state_slots"), 4);
  EXPECT_EQ(value("vlm_state_snapshots_capacity"), 64);
  EXPECT_GT(value("vlm_state_snapshots"), 0);
  EXPECT_EQ(value("vlm_state_snapshot_evictions_total"), 0);
  const double state = value("vlm_state_memory_bytes"), kv = value("vlm_kv_cache_memory_bytes");
  EXPECT_GT(state, 0);
  EXPECT_GT(kv, 0);
  EXPECT_LE(state + kv, 8 << 20);
  EXPECT_GT(value("vlm_kv_cache_tokens_capacity"), 0);
}

// Video parts: a data URL and a file:// URL with its own sampling reach the model as
// transformers reads them (the video-f32 fixture's greedy reply), the metrics count them, and a
// broken video is a 400 naming it.
TEST_F(ServerTest, VideoPartsAreServedAsTransformersReadsThem) {
  const std::string dir = std::string(VLM_FIXTURES_DIR) + "/video-f32";
  const std::string clips = std::string(VLM_REPO_DIR) + "/tests/unit/fixtures/videos";
  const json ref = json::parse(test_util::read_file(dir + "/reference.json"));
  const json& c = ref["cases"][0];
  ASSERT_EQ(c["name"], "video");
  ServeOptions o = tiny_options();
  o.engine.model_dir = dir;
  o.allowed_media_path = clips;
  auto server = Server::create(o);
  ASSERT_TRUE(server.ok()) << server.status().message();
  ASSERT_TRUE((*server)->wait_until_loaded().ok());
  std::thread thread([&] { (*server)->run(); });
  test_http::Client cl((*server)->port());
  auto ask = [&](const json& video_part, const std::string& text) {
    json body = chat_body(text, 20);
    body["ignore_eos"] = true;
    body["messages"][0]["content"] =
        json::array({video_part, json{{"type", "text"}, {"text", text}}});
    return cl.Post("/v1/chat/completions", body.dump(), "application/json");
  };
  const std::string mp4 = test_util::read_file(clips + "/mp4_h264_2997.mp4");
  auto r = ask(json{{"type", "video_url"},
                    {"video_url", {{"url", "data:video/mp4;base64," + base64_encode(mp4)}}}},
               "Which way does it move?");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json reply = json::parse(r->body);
  auto tok = Tokenizer::load(dir);
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ(reply["choices"][0]["message"]["content"],
            (*tok)->decode(c["greedy"].get<std::vector<int32_t>>(), true));
  EXPECT_EQ(reply["usage"]["prompt_tokens"], c["input_ids"].size());

  // file:// under --allowed-media-path, sampled at 4 fps and at most 6 frames (qwen-vl-utils'
  // part form, the settings on the part).
  r = ask(json{{"type", "video"},
               {"video", "file://" + clips + "/webm_vp9_7.webm"},
               {"fps", 4},
               {"max_frames", 6}},
          "Same colours?");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  auto m = cl.Get("/metrics");
  ASSERT_TRUE(m);
  for (const char* s : {"vlm_videos_total 2", "vlm_video_frames_total 10",
                        "vlm_video_decode_seconds_count 2", "vlm_images_total 0"}) {
    EXPECT_NE(m->body.find(s), std::string::npos) << s;
  }
  r = ask(json{{"type", "video_url"}, {"video_url", {{"url", "data:video/mp4;base64,AAAAAAAA"}}}},
          "x");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("video 1"), std::string::npos) << r->body;
  r = ask(json{{"type", "video_url"}, {"video_url", {{"url", "file:///etc/passwd"}}}}, "x");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("outside the allowed directory"), std::string::npos) << r->body;
  (*server)->stop();
  thread.join();
}

}  // namespace
}  // namespace vlm
