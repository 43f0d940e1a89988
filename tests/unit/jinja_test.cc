// The Jinja interpreter against Python's jinja2 as transformers runs it
// (tests/model/fixtures/chat_templates/cases.json, scripts/make_chat_template_cases.py): feature
// snippets, and the chat templates of several model families over a shared set of conversations
// (system, multi-turn, text parts, images, video, tools and tool results, reasoning, unicode),
// byte for byte; a conversation jinja2 refuses is refused here too.
#include "jinja/jinja.h"

#include <gtest/gtest.h>

#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "vlm/chat.h"

namespace vlm::jinja {
namespace {

const std::string kDir = std::string(VLM_FIXTURES_DIR) + "/chat_templates";

const nlohmann::ordered_json& cases() {
  static const nlohmann::ordered_json c =
      nlohmann::ordered_json::parse(test_util::read_file(kDir + "/cases.json"));
  return c;
}

int64_t fixed_now() {
  std::tm tm{};
  strptime(cases()["now"].get<std::string>().c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  return static_cast<int64_t>(timegm(&tm));
}

TEST(Jinja, SnippetsRenderAsJinja2Does) {
  int n = 0;
  for (const auto& s : cases()["snippets"]) {
    const std::string src = s["template"];
    auto t = Template::parse(src);
    if (!t.ok()) {
      ADD_FAILURE() << src << "\n" << t.status().message();
      continue;
    }
    const Value ctx = Value::from_json(s["context"]);
    auto out = t->render(ctx.object(), fixed_now());
    if (s.value("error", false)) {
      EXPECT_FALSE(out.ok()) << src << " rendered " << *out;
      continue;
    }
    if (!out.ok()) {
      ADD_FAILURE() << src << "\n" << out.status().message();
      continue;
    }
    EXPECT_EQ(*out, s["rendered"].get<std::string>()) << src;
    ++n;
  }
  EXPECT_GE(n, 20);
}

class ChatTemplates : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplates, RenderAsTransformersDoes) {
  const auto& entry = cases()["templates"][GetParam()];
  const std::string src = test_util::read_file(kDir + "/" + entry["file"].get<std::string>());
  auto t = Template::parse(src);
  ASSERT_TRUE(t.ok()) << t.status().message();
  int rendered = 0;
  for (const auto& run : entry["runs"]) {
    Object ctx;
    ctx.set("messages",
            Value::from_json(cases()["conversations"][run["conversation"].get<std::string>()]));
    ctx.set("tools", run["tools"].get<bool>() ? Value::from_json(cases()["tools"]) : Value::none());
    ctx.set("documents", Value::none());
    ctx.set("add_generation_prompt", Value(run["add_generation_prompt"].get<bool>()));
    ctx.set("bos_token", Value(cases()["bos_token"].get<std::string>()));
    ctx.set("eos_token", Value(cases()["eos_token"].get<std::string>()));
    for (auto it = run["kwargs"].begin(); it != run["kwargs"].end(); ++it)
      ctx.set(it.key(), Value::from_json(it.value()));
    auto out = t->render(ctx, fixed_now());
    const std::string name = run["name"];
    if (run.value("error", false)) {
      EXPECT_FALSE(out.ok()) << name << ": jinja2 refused it (" << run["message"]
                             << ") but it rendered:\n"
                             << *out;
      continue;
    }
    if (!out.ok()) {
      ADD_FAILURE() << name << ": " << out.status().message();
      continue;
    }
    EXPECT_EQ(*out, run["rendered"].get<std::string>()) << name;
    ++rendered;
  }
  EXPECT_GE(rendered, 10);
}

std::vector<std::string> template_names() {
  std::vector<std::string> out;
  for (auto it = cases()["templates"].begin(); it != cases()["templates"].end(); ++it)
    out.push_back(it.key());
  return out;
}

INSTANTIATE_TEST_SUITE_P(Families, ChatTemplates, ::testing::ValuesIn(template_names()),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

TEST(Jinja, ErrorsNameLineAndColumn) {
  auto t = Template::parse("line one\n{% if x %}\n{{ 1 + }}\n{% endif %}");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("line 3"), std::string::npos) << t.status().message();
  auto u = Template::parse("{% for x in xs %}{{ x }}");
  ASSERT_FALSE(u.ok());
  EXPECT_NE(u.status().message().find("endfor"), std::string::npos) << u.status().message();
  auto v = Template::parse("{{ x | no_such_filter }}");
  ASSERT_TRUE(v.ok());
  auto r = v->render(Object{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no_such_filter"), std::string::npos);
}

void write(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

// The checkpoint's template is found where transformers looks: chat_template.jinja, then
// chat_template.json, then tokenizer_config.json (whose bos/eos tokens it sees); the built-in
// one when there is none; a broken one is an error naming the file and the place.
TEST(ChatTemplateFiles, FoundInTransformersOrderAndCheckedAtLoad) {
  test_util::TempDir dir;
  const std::string d = dir.str();
  ChatMessage user;
  user.role = "user";
  user.text = "hi";
  auto render = [&](const std::string& dir_path) {
    auto t = ChatTemplate::from_model_dir(dir_path);
    EXPECT_TRUE(t.ok()) << t.status().message();
    if (!t.ok()) return std::string();
    auto r = t->render({user}, {});
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r + " @ " + t->origin() : std::string();
  };
  EXPECT_EQ(render(d), render_chat({user}, {}) + " @ built-in Qwen3-VL Instruct template");
  write(
      dir.path() / "tokenizer_config.json",
      R"({"bos_token": "<B>", "eos_token": {"content": "<E>"}, "chat_template": "A{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"})");
  EXPECT_EQ(render(d), "A<B>hi<E> @ " + d + "/tokenizer_config.json");
  write(dir.path() / "chat_template.json", R"({"chat_template": "B{{ messages[0].content }}"})");
  EXPECT_EQ(render(d), "B" + std::string("hi @ ") + d + "/chat_template.json");
  write(dir.path() / "chat_template.jinja", "C{{ messages[0].content }}{{ eos_token }}");
  EXPECT_EQ(render(d), "Chi<E> @ " + d + "/chat_template.jinja");
  // kwargs (a request's chat_template_kwargs) reach the template.
  write(dir.path() / "chat_template.jinja",
        "{% if enable_thinking is defined and not enable_thinking %}/no_think {% endif %}{{ "
        "messages[0].content }}");
  auto t = ChatTemplate::from_model_dir(d);
  ASSERT_TRUE(t.ok());
  ChatTemplateOptions o;
  o.kwargs_json = {{"enable_thinking", "false"}};
  EXPECT_EQ(*t->render({user}, o), "/no_think hi");
  EXPECT_EQ(*t->render({user}, {}), "hi");
  // Broken: refused at load with the file, line and column.
  write(dir.path() / "chat_template.jinja", "ok\n{% for m in messages %}{{ m.content }");
  auto bad = ChatTemplate::from_model_dir(d);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("chat_template.jinja"), std::string::npos);
  EXPECT_NE(bad.status().message().find("line 2"), std::string::npos) << bad.status().message();
  // A template that cannot render a plain conversation is refused at load too.
  write(dir.path() / "chat_template.jinja", "{{ raise_exception('nope') }}");
  auto refuses = ChatTemplate::from_model_dir(d);
  ASSERT_FALSE(refuses.ok());
  EXPECT_NE(refuses.status().message().find("nope"), std::string::npos);
}

}  // namespace
}  // namespace vlm::jinja
