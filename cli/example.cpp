// spanformer example: the textbook's runnable examples.
//   pooling  attention pooling (nn/attention_pooling.h) fitting y = 2 sin(x) + x^0.8 + noise: the test
//            error of average, Nadaraya-Watson and parametric (leave-one-out-trained) pooling, a picture
//            of the fits and one of each pooling's attention weights (test queries x training keys),
//            and the figures as JSON.
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "command.h"
#include "spanformer/nn/attention_pooling.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/viz/heatmap.h"

namespace spanformer::cli {
namespace {

std::vector<double> to_vector(const torch::Tensor& t) {
  auto c = t.to(torch::kDouble).contiguous();
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

std::vector<std::vector<double>> to_rows(const torch::Tensor& t) {
  std::vector<std::vector<double>> rows;
  for (int64_t i = 0; i < t.size(0); ++i) rows.push_back(to_vector(t[i]));
  return rows;
}

struct PoolingOptions {
  std::string out = "runs/pooling";
  int64_t n = 50, epochs = 5;
  double noise = 0.5, lr = 0.5, sigma = 1.0;
  uint64_t seed = 0;
  bool overwrite = false;
};

void run_pooling(const PoolingOptions& o) {
  if (o.n < 2) fail("--n must be at least 2 (got {})", o.n);
  if (!(o.noise >= 0)) fail("--noise must be >= 0 (got {})", o.noise);
  if (!(o.sigma > 0)) fail("--sigma must be positive (got {})", o.sigma);
  if (o.epochs < 0 || !(o.lr > 0)) fail("--epochs must be >= 0 and --lr positive");
  make_dirs(o.out);
  if (!o.overwrite && file_exists(o.out + "/pooling.json"))
    fail("{} already holds a pooling example: pass --overwrite to replace it", o.out);
  torch::manual_seed(o.seed);
  auto f = [](const torch::Tensor& x) { return 2 * torch::sin(x) + x.pow(0.8); };
  auto x_train = std::get<0>(torch::sort(torch::rand({o.n}, torch::kDouble) * 5));    // (n)
  auto y_train = f(x_train) + o.noise * torch::randn({o.n}, torch::kDouble);            // (n)
  auto x_test = torch::arange(0, 5, 0.1, torch::kDouble);                              // (Q)
  auto truth = f(x_test);                                                              // (Q)

  nn::ParametricPooling parametric(1.0);
  auto losses = nn::fit_parametric_pooling(*parametric, x_train, y_train, o.epochs, o.lr);
  const double w = parametric->w.item<double>();
  nlohmann::json report = {{"n", o.n}, {"noise", o.noise}, {"seed", o.seed}, {"sigma", o.sigma},
                           {"parametric_w", w}, {"leave_one_out_loss", losses}};
  viz::LinePlot fits{{}, "attention pooling of y = 2 sin(x) + x^0.8 + noise", "x", "y"};
  fits.series.push_back({"truth", to_vector(x_test), to_vector(truth), false});
  std::vector<viz::Heatmap> panels;
  std::vector<std::string> query_ticks, key_ticks;
  for (int64_t i = 0; i < x_test.size(0); ++i) query_ticks.push_back(fmt::format("{:.1f}", x_test[i].item<double>()));
  for (int64_t i = 0; i < o.n; ++i) key_ticks.push_back(fmt::format("{:.2f}", x_train[i].item<double>()));
  fmt::print("{:<11} {:>10}  {}\n", "pooling", "test MSE", "kernel");
  for (auto kind : {nn::Pooling::kAverage, nn::Pooling::kNadaraya, nn::Pooling::kParametric}) {
    const double width = kind == nn::Pooling::kParametric ? w : 1.0 / o.sigma;
    auto a = nn::pooling_weights(kind, x_test, x_train, torch::full({1}, width, torch::kDouble)).detach();  // (Q, n)
    auto y_hat = torch::mv(a, y_train);                                                                     // (Q)
    const double mse = (y_hat - truth).pow(2).mean().item<double>();
    const std::string name = nn::pooling_name(kind);
    report[name + "_mse"] = mse;
    fmt::print("{:<11} {:>10.4f}  {}\n", name, mse,
               kind == nn::Pooling::kAverage ? "none" : fmt::format("Gaussian, w = 1 / sigma = {:.3f}", width));
    fits.series.push_back({name, to_vector(x_test), to_vector(y_hat), false});
    panels.push_back({to_rows(a), query_ticks, key_ticks, name + " pooling weights", "test query x", "training key x_i"});
  }
  fits.series.push_back({"training data", to_vector(x_train), to_vector(y_train), true});
  viz::write_line_plot(o.out + "/fits.png", fits);
  viz::write_heatmaps(o.out + "/weights.png", panels);
  write_file_atomic(o.out + "/pooling.json", report.dump(2) + "\n");
  fmt::print("parametric w after {} leave-one-out epochs: {:.4f}\npictures: {}/fits.png, {}/weights.png; figures: {}/pooling.json\n",
             o.epochs, w, o.out, o.out, o.out);
}

}  // namespace

void add_example(CLI::App& app, const std::shared_ptr<Globals>&, Run& run) {
  auto* cmd = app.add_subcommand("example", "the attention textbook's runnable examples");
  cmd->require_subcommand(1);
  auto o = std::make_shared<PoolingOptions>();
  auto* pooling = cmd->add_subcommand("pooling", "attention pooling (Nadaraya-Watson) on y = 2 sin(x) + x^0.8 + noise");
  pooling->add_option("--out,-o", o->out, "directory for fits.png, weights.png and pooling.json")->capture_default_str();
  pooling->add_option("--n", o->n, "training pairs")->capture_default_str();
  pooling->add_option("--noise", o->noise, "standard deviation of the noise on y")->capture_default_str();
  pooling->add_option("--sigma", o->sigma, "Nadaraya-Watson kernel width")->capture_default_str();
  pooling->add_option("--epochs", o->epochs, "full-batch gradient steps on the parametric w")->capture_default_str();
  pooling->add_option("--lr", o->lr, "their rate")->capture_default_str();
  pooling->add_option("--seed", o->seed, "data seed")->capture_default_str();
  pooling->add_flag("--overwrite", o->overwrite, "replace an earlier example in --out");
  pooling->callback([o, &run] { run = [o] { run_pooling(*o); }; });
}

}  // namespace spanformer::cli
