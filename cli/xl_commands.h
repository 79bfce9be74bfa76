// Commands of the Transformer-XL / PAR family (dispatched from the common ones by the config's
// "arch" or the checkpoint's format), plus `par derive|plot` and `data words|cutoffs`.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace spanformer::cli::xl {

bool is_xl_config(const std::string& path);
bool is_xl_checkpoint(const std::string& path);

struct TrainArgs {
  std::string config_path, data_dir, out_dir;
  std::vector<std::string> overrides;
  bool resume = false, quiet = false;
  int64_t stop_after = -1;
  int threads = 0;
};
void train(const TrainArgs& args);

struct EvalArgs {
  std::string checkpoint, data_dir, split = "test", unit;
  std::vector<std::string> overrides;  // train.eval_* keys
  int64_t batch = -1;
  int threads = 0;
  std::string device = "cpu";
};
void eval(const EvalArgs& args);

struct BenchArgs {
  std::string config_path, mode = "train";
  std::vector<std::string> overrides;
  int64_t steps = 5, warmup = 2, mem_len = -1, tgt_len = 0;
  int threads = 0;
  std::string device = "cpu";
};
void bench(const BenchArgs& args);

void add_par_commands(CLI::App& app, std::function<void()>& run);
void add_data_commands(CLI::App* data, std::function<void()>& run);

}  // namespace spanformer::cli::xl
