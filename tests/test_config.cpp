// Configs: the shipped experiment files load and carry the reference's values; bad values are refused
// with a message naming the key.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "spanformer/config/adaptive_span_config.h"
#include "spanformer/train/family.h"
#include "spanformer/train/registry.h"
#include "spanformer/util/error.h"
#include "spanformer/util/names.h"
#include "spanformer/util/build_info.h"
#include "spanformer/util/runtime.h"
#include "spanformer/util/switches.h"
#include "util.h"

using namespace spanformer;
using tu::error_of;

namespace {
AdaptiveSpanConfig valid_config() {
  AdaptiveSpanConfig c;
  c.model.vocab_size = 10;
  return c;
}
}  // namespace

TEST(Config, OverridesParseTypesAndRejectUnknownKeys) {
  AdaptiveSpanConfig c = valid_config();
  apply_overrides(c, {"--dropout=0.3", "--nb_layers=12", "--adapt-span-cache=false", "--optim=adam", "--train.lr=0.5"});
  EXPECT_DOUBLE_EQ(c.model.dropout, 0.3);
  EXPECT_EQ(c.model.nb_layers, 12);
  EXPECT_FALSE(c.model.adapt_span_cache);
  EXPECT_EQ(c.train.optim, OptimKind::kAdam);
  EXPECT_DOUBLE_EQ(c.train.lr, 0.5);
  EXPECT_NE(error_of([&] { apply_overrides(c, {"--nb_layer=3"}); }).find("unknown config key 'nb_layer'"), std::string::npos);
  EXPECT_NE(error_of([&] { apply_overrides(c, {"--nb_layers=abc"}); }).find("nb_layers"), std::string::npos);
  EXPECT_NE(error_of([&] { apply_overrides(c, {"--nb_layers"}); }).find("--key=value"), std::string::npos);
}

TEST(Config, ValidationNamesTheBadValue) {
  struct Bad {
    std::function<void(AdaptiveSpanConfig&)> edit;
    std::string message;
  };
  std::vector<Bad> cases = {
      {[](AdaptiveSpanConfig& c) { c.model.hidden_size = 0; }, "hidden_size must be positive"},
      {[](AdaptiveSpanConfig& c) { c.model.nb_layers = -1; }, "nb_layers must be positive"},
      {[](AdaptiveSpanConfig& c) { c.model.hidden_size = 30; c.model.nb_heads = 4; }, "divisible by nb_heads"},
      {[](AdaptiveSpanConfig& c) { c.model.attn_span = 0; }, "attn_span must be at least 1"},
      {[](AdaptiveSpanConfig& c) { c.model.dropout = 1.5; }, "dropout"},
      {[](AdaptiveSpanConfig& c) { c.model.adapt_span_init = 2; }, "adapt_span_init"},
      {[](AdaptiveSpanConfig& c) { c.train.batch_size = 6; c.train.batch_split = 4; }, "divisible by batch_split"},
      {[](AdaptiveSpanConfig& c) { c.train.lr_min = 1; }, "lr_min"},
      {[](AdaptiveSpanConfig& c) { c.train.eval_blocks = 0; }, "eval_blocks must be positive"},
      {[](AdaptiveSpanConfig& c) { c.train.lr = -1; }, "lr must be positive"},
  };
  for (const auto& bad : cases) {
    AdaptiveSpanConfig c = valid_config();
    bad.edit(c);
    auto message = error_of([&] { validate(c); });
    EXPECT_NE(message.find(bad.message), std::string::npos) << "got: " << message;
  }
  EXPECT_EQ(error_of([] { validate(valid_config()); }), "");
  // Closed choices are refused where they are parsed, naming the key and the choices.
  AdaptiveSpanConfig c = valid_config();
  EXPECT_NE(error_of([&] { apply_overrides(c, {"--optim=rmsprop"}); }).find("'optim': optim must be adagrad, sgd, adam or adamw"),
            std::string::npos);
  EXPECT_NE(error_of([&] { apply_overrides(c, {"--scheduler=step"}); }).find("scheduler must be"), std::string::npos);
}

// The one name table every closed choice uses (util/names.h): each name reads back as its value, the
// first entry wins for a value listed twice, an unknown value is a table's "?" and an unknown name the
// one error line listing every choice in order.
TEST(Config, NameTablesReadBothWaysAndListTheChoices) {
  enum class Colour { kRed, kGreen, kBlue, kNone };
  constexpr auto names =
      name_table("colour", std::pair{Colour::kRed, "red"}, std::pair{Colour::kGreen, "green"}, std::pair{Colour::kBlue, "blue"});
  for (auto c : {Colour::kRed, Colour::kGreen, Colour::kBlue}) EXPECT_EQ(names.parse(names.name(c)), c);
  EXPECT_STREQ(names.name(Colour::kGreen), "green");
  EXPECT_STREQ(names.name(Colour::kNone), "?");
  EXPECT_EQ(names.choices(), "red, green or blue");
  EXPECT_EQ(error_of([&] { names.parse("Red"); }), "colour must be red, green or blue (got 'Red')");
  for (auto kind : {OptimKind::kAdagrad, OptimKind::kSgd, OptimKind::kAdam, OptimKind::kAdamW})
    EXPECT_EQ(parse_optim(optim_name(kind)), kind);
  for (auto s : {Schedule::kConstant, Schedule::kCosine, Schedule::kInverseSqrt}) EXPECT_EQ(parse_schedule(schedule_name(s)), s);
  EXPECT_EQ(error_of([] { parse_amp("fp16"); }), "amp must be off or bf16 (got 'fp16')");
}

TEST(Config, FilesReportMissingCorruptAndUnknownKeys) {
  tu::TempDir tmp;
  EXPECT_NE(error_of([&] { load_config(tmp.file("none.json")); }).find("file not found"), std::string::npos);
  tu::write_text(tmp.file("bad.json"), "{ \"model\": ");
  EXPECT_NE(error_of([&] { load_config(tmp.file("bad.json")); }).find("not valid JSON"), std::string::npos);
  tu::write_text(tmp.file("typo.json"), R"({"model": {"nb_layer": 3}})");
  EXPECT_NE(error_of([&] { load_config(tmp.file("typo.json")); }).find("unknown config key 'model.nb_layer'"),
            std::string::npos);
}

// train.cuda_graphs left for the lab: a checkpoint of an earlier version, whose config carries it false,
// still loads; true is one line saying where the graphs wait.
TEST(Config, RetiredGraphKeyReadsFalseAndRefusesTrue) {
  tu::TempDir tmp;
  tu::write_text(tmp.file("old.json"), R"({"train": {"cuda_graphs": false, "batch_size": 3}})");
  EXPECT_EQ(load_config(tmp.file("old.json")).train.batch_size, 3);
  tu::write_text(tmp.file("on.json"), R"({"train": {"cuda_graphs": true}})");
  EXPECT_NE(error_of([&] { load_config(tmp.file("on.json")); }).find("train.cuda_graphs waits in the lab"), std::string::npos);
}

TEST(Config, ShippedConfigsCarryTheReferenceValues) {
  const std::string dir = std::string(SPANFORMER_SOURCE_DIR) + "/configs/";
  struct Expect {
    const char* file;
    int64_t layers, hidden, inner, heads, span, block;
    double dropout;
    int64_t warmup;
    double span_loss;
    int64_t steps, pers, split;
  };
  for (const auto& e : std::vector<Expect>{
           {"enwik8_small", 8, 256, 1024, 4, 1024, 256, 0.0, 8000, 2e-6, 150000, 0, 1},
           {"enwik8", 12, 512, 2048, 8, 8192, 512, 0.3, 32000, 5e-7, 600000, 0, 1},
           {"enwik8_large", 24, 768, 4096, 8, 8192, 512, 0.4, 32000, 5e-7, 150000, 0, 2},
           {"text8", 12, 512, 2048, 8, 8192, 512, 0.3, 32000, 5e-7, 900000, 0, 1},
           {"text8_large", 24, 768, 4096, 8, 8192, 512, 0.4, 32000, 5e-7, 250000, 0, 2},
       }) {
    AdaptiveSpanConfig c = load_config(dir + e.file + ".json");
    EXPECT_EQ(c.model.nb_layers, e.layers) << e.file;
    EXPECT_EQ(c.model.hidden_size, e.hidden) << e.file;
    EXPECT_EQ(c.model.inner_hidden_size, e.inner) << e.file;
    EXPECT_EQ(c.model.nb_heads, e.heads) << e.file;
    EXPECT_EQ(c.model.attn_span, e.span) << e.file;
    EXPECT_EQ(c.model.block_size, e.block) << e.file;
    EXPECT_DOUBLE_EQ(c.model.dropout, e.dropout) << e.file;
    EXPECT_EQ(c.train.lr_warmup, e.warmup) << e.file;
    EXPECT_DOUBLE_EQ(c.model.adapt_span_loss, e.span_loss) << e.file;
    EXPECT_EQ(c.train.nb_steps, e.steps) << e.file;
    EXPECT_EQ(c.train.batch_split, e.split) << e.file;
    // Shared by every paper config.
    EXPECT_EQ(c.train.optim, OptimKind::kAdagrad);
    EXPECT_DOUBLE_EQ(c.train.lr, 0.07);
    EXPECT_DOUBLE_EQ(c.train.grad_clip, 0.03);
    EXPECT_EQ(c.train.batch_size, 64);
    EXPECT_EQ(c.model.adapt_span_ramp, 32);
    EXPECT_DOUBLE_EQ(c.model.adapt_span_init, 0.0);
    EXPECT_TRUE(c.model.adapt_span_cache);
  }
}

// Every family's config has a model section (what the weights mean) and a run section (how they run),
// read from one key table: a checkpoint fits a config when their model sections agree, whatever the run
// keys say; files that kept run keys in `model` (every file before the split) still load the same.
TEST(ConfigSections, RunKeysNeverMakeAnotherModelAndOldFilesStillLoad) {
  for (const auto& info : train::families()) {
    SCOPED_TRACE(info.name);
    const nlohmann::json base = {{"arch", info.name}};
    const auto defaults = info.make(base, "test", {})->config_json();
    ASSERT_TRUE(defaults.contains("model") && defaults.contains("run"));
    int run_keys = 0;
    std::string model_int_key;
    for (const auto& k : info.config_keys()) {
      if (k.section == "model" && k.type == "int" && model_int_key.empty() && k.name != "vocab_size") model_int_key = k.name;
      if (k.section != "run") continue;
      ++run_keys;
      const auto& d = defaults["run"][k.name];
      const auto other_choice = [&] {  // the first name the key lists that is not its default
        for (const auto& c : k.choices)
          if (c != d) return nlohmann::json(c);
        return d;
      };
      nlohmann::json changed = k.type == "bool" ? nlohmann::json(!d.get<bool>())
                               : k.type == "int" ? nlohmann::json(d.get<int64_t>() + 1)
                               : k.type == "float" ? nlohmann::json(d.get<double>() + 0.05)
                               : k.type == "choice" ? other_choice() : d;
      ASSERT_NE(changed, d) << k.name << ": no other value to try";
      auto family = info.make(base, "test", {"--run." + k.name + "=" + (changed.is_string() ? changed.get<std::string>() : changed.dump())});
      const auto j = family->config_json();
      EXPECT_EQ(j["run"][k.name], changed) << k.name;
      EXPECT_FALSE(j["model"].contains(k.name)) << k.name;
      EXPECT_EQ(family->model_difference(defaults), "") << "run key " << k.name;
      // The old spelling: the key inside `model`, in a file and in an override.
      nlohmann::json old = base;
      old["model"][k.name] = changed;
      EXPECT_EQ(info.make(old, "test", {})->config_json(), j) << k.name;
      EXPECT_EQ(info.make(base, "test", {"--model." + k.name + "=" + (changed.is_string() ? changed.get<std::string>() : changed.dump())})->config_json(), j)
          << k.name;
    }
    EXPECT_GE(run_keys, 3);
    // A model key changes the model, and has no place in `run`.
    ASSERT_FALSE(model_int_key.empty());
    auto bigger = info.make(base, "test", {"--model." + model_int_key + "=" + std::to_string(defaults["model"][model_int_key].get<int64_t>() + 1)});
    EXPECT_EQ(bigger->model_difference(defaults).rfind(model_int_key + " ", 0), 0u) << bigger->model_difference(defaults);
    nlohmann::json misplaced = base;
    misplaced["run"][model_int_key] = 3;
    EXPECT_NE(error_of([&] { info.make(misplaced, "test.json", {}); }).find("'run." + model_int_key + "' is part of what the model is"),
              std::string::npos);
    EXPECT_NE(error_of([&] { info.make(base, "test", {"--run." + model_int_key + "=3"}); }).find("unknown config key"),
              std::string::npos);
  }
}

// A closed choice's names are written once, in its name table: the names `config keys` lists for every
// enum key of every family (and so docs/config.md) are exactly, and in order, the ones its parser takes
// and names when it refuses another; the default is one of them, and the printed help starts with them.
TEST(ConfigSections, EveryChoiceKeyListsTheNamesItsTableTakes) {
  int choice_keys = 0;
  for (const auto& info : train::families()) {
    const nlohmann::json base = {{"arch", info.name}};
    for (const auto& k : info.config_keys()) {
      if (k.type != "choice") continue;
      SCOPED_TRACE(info.name + std::string(" ") + k.section + "." + k.name);
      ++choice_keys;
      ASSERT_GE(k.choices.size(), 2u);
      std::string listed;  // "a, b or c", as a name table's error says it
      for (size_t i = 0; i < k.choices.size(); ++i)
        listed += (i == 0 ? "" : i + 1 == k.choices.size() ? " or " : ", ") + k.choices[i];
      const auto error = error_of([&] { info.make(base, "test", {"--" + k.section + "." + k.name + "=bogus"}); });
      EXPECT_NE(error.find("must be " + listed + " (got 'bogus')"), std::string::npos) << error;
      EXPECT_NE(std::find(k.choices.begin(), k.choices.end(), nlohmann::json::parse(k.default_value).get<std::string>()),
                k.choices.end());
      EXPECT_EQ(k.described().rfind("[" + k.choices[0] + " | " + k.choices[1], 0), 0u) << k.described();
    }
  }
  EXPECT_GE(choice_keys, 15);  // optim, scheduler, amp, dist_backend per family, and the families' own
}

// train.threads / --threads 0: OMP_NUM_THREADS where it is a positive number (as PyTorch's default), else
// every core; a given count wins over the variable.
TEST(Runtime, ThreadsZeroFollowsOmpNumThreadsElseAllCores) {
  const int before = at::get_num_threads();
  const char* saved = std::getenv("OMP_NUM_THREADS");
  const std::optional<std::string> restore = saved ? std::optional<std::string>(saved) : std::nullopt;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  setenv("OMP_NUM_THREADS", "3", 1);
  EXPECT_EQ(set_threads(0), 3);
  EXPECT_EQ(at::get_num_threads(), 3);
  EXPECT_EQ(set_threads(1), 1);
  setenv("OMP_NUM_THREADS", "0", 1);
  EXPECT_EQ(set_threads(0), cores);
  setenv("OMP_NUM_THREADS", "two", 1);
  EXPECT_EQ(set_threads(0), cores);
  unsetenv("OMP_NUM_THREADS");
  EXPECT_EQ(set_threads(0), cores);
  if (restore) setenv("OMP_NUM_THREADS", restore->c_str(), 1);
  at::set_num_threads(before);
}

// The switches (util/switches.h): each reads its variable through the one table (unset and empty are the
// default, a listed value is itself), a value outside the table is one line of one form naming the values,
// and --version's switches line shows each variable's value, the bad one marked.
TEST(Switches, OneTableOneErrorFormAndVersionShowsThem) {
  const char* saved = std::getenv("SPANFORMER_STEP_KERNELS");
  const std::optional<std::string> restore = saved ? std::optional<std::string>(saved) : std::nullopt;
  unsetenv("SPANFORMER_STEP_KERNELS");
  EXPECT_EQ(switch_value("SPANFORMER_STEP_KERNELS"), "auto");
  setenv("SPANFORMER_STEP_KERNELS", "", 1);
  EXPECT_EQ(switch_value("SPANFORMER_STEP_KERNELS"), "auto");
  setenv("SPANFORMER_STEP_KERNELS", "composition", 1);
  EXPECT_EQ(switch_value("SPANFORMER_STEP_KERNELS"), "composition");
  EXPECT_NE(version_line().find("\nswitches: SPANFORMER_CPU_HALF_PRODUCTS="), std::string::npos) << version_line();
  EXPECT_NE(version_line().find("SPANFORMER_STEP_KERNELS=composition"), std::string::npos) << version_line();
  setenv("SPANFORMER_STEP_KERNELS", "fast", 1);
  EXPECT_EQ(tu::error_of([] { switch_value("SPANFORMER_STEP_KERNELS"); }),
            "SPANFORMER_STEP_KERNELS=fast is not one of: auto, kernels, composition");
  EXPECT_NE(switches_text().find("SPANFORMER_STEP_KERNELS=fast (not one of its values)"), std::string::npos);
  EXPECT_NE(tu::error_of([] { switch_value("SPANFORMER_NO_SUCH"); }).find("is not a switch"), std::string::npos);
  for (const char* variable : {"SPANFORMER_SPAN_KERNEL", "SPANFORMER_FLASH_KERNEL", "SPANFORMER_CPU_HALF_PRODUCTS"})
    EXPECT_NE(switches_text().find(std::string(variable) + "="), std::string::npos) << variable;
  if (restore) setenv("SPANFORMER_STEP_KERNELS", restore->c_str(), 1);
  else unsetenv("SPANFORMER_STEP_KERNELS");
}
