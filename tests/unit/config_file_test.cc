// vlm serve --config FILE.yaml (tools/cli/config_file.cc), on a command built here with the
// kinds of options vlm serve has: a number, a list, a plain flag, a negated flag (!--no-x), an
// option with a validator. The command line wins; bad files are refused naming what is wrong.
#include "config_file.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

struct Opts {
  int port = 8080;
  std::vector<std::string> names;
  bool webui_off = false;
  bool autotune = true;
  int group = 32;
  std::string config;
};

// Parses `argv` (after "serve") with `yaml` as the --config file, then applies it.
vlm::Status run(Opts* o, const std::string& yaml, std::vector<std::string> argv) {
  vlm::test_util::TempDir tmp;
  const std::string path = tmp.file("serve.yaml");
  std::ofstream(path) << yaml;
  CLI::App app{"test"};
  CLI::App* serve = app.add_subcommand("serve");
  serve->add_option("--port", o->port);
  serve->add_option("--served-model-name", o->names);
  serve->add_flag("--no-webui", o->webui_off);
  serve->add_flag("!--no-autotune", o->autotune);
  serve->add_option("--int4-group", o->group)->check(CLI::IsMember({32, 64, 128}));
  vlm_cli::add_config_option(serve, &o->config);
  argv.insert(argv.begin(), {"vlm", "serve", "--config", path});
  std::vector<const char*> args;
  for (const std::string& a : argv) args.push_back(a.c_str());
  app.parse(static_cast<int>(args.size()), args.data());
  return vlm_cli::apply_config(serve, o->config);
}

TEST(ConfigFile, AppliesEveryKindOfOption) {
  Opts o;
  auto st = run(&o,
                "port: 9000\nserved_model_name: [a, b]\nno-webui: true\nno-autotune: true\n"
                "int4-group: 64\n",
                {});
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(o.port, 9000);
  EXPECT_EQ(o.names, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(o.webui_off);
  EXPECT_FALSE(o.autotune);  // the negated flag, set by true
  EXPECT_EQ(o.group, 64);
  Opts f;
  st = run(&f, "no-webui: false\nno-autotune: false\n", {});
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_FALSE(f.webui_off);
  EXPECT_TRUE(f.autotune);
}

TEST(ConfigFile, TheCommandLineWins) {
  Opts o;
  auto st = run(&o, "port: 9000\nserved-model-name: [a]\nint4-group: 64\n",
                {"--port", "7000", "--served-model-name", "cli"});
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(o.port, 7000);
  EXPECT_EQ(o.names, std::vector<std::string>{"cli"});
  EXPECT_EQ(o.group, 64);  // not on the command line: the file's
}

TEST(ConfigFile, BadFilesAreRefusedNamingWhat) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"prot: 1\n", "unknown key 'prot'"},
      {"port: 1\nport_: 2\n", "unknown key 'port_'"},
      {"served_model_name: a\nserved-model-name: b\n", "served-model-name is given twice"},
      {"port:\n  a: 1\n", "port"},
      {"port:\n", "not empty"},
      {"- 1\n", "not a mapping"},
      {"port: [1\n", "not YAML"},
      {"int4-group: 48\n", "int4-group"},
      {"no-webui: [true, false]\n", "a flag takes true or false"},
      {"config: other.yaml\n", "unknown key 'config'"},
  };
  for (const auto& [yaml, needle] : cases) {
    Opts o;
    const vlm::Status st = run(&o, yaml, {});
    EXPECT_FALSE(st.ok()) << yaml;
    EXPECT_NE(st.message().find(needle), std::string::npos) << yaml << " → " << st.message();
  }
}

}  // namespace
