// spanformer report: a run directory as one self-contained HTML page (viz/report.h), once or live.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <thread>

#include "command.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/util/jsonl.h"
#include "spanformer/viz/report.h"
#include "spanformer/util/run_paths.h"

namespace spanformer::cli {
namespace {

// The run is finished when its log reached train.nb_steps.
bool run_finished(const std::string& run_dir) {
  const RunPaths run(run_dir);
  const std::string log = run.log();
  if (!file_exists(log)) return false;
  const auto config = parse_json_or_discarded(read_file(run.config()), run.config());
  if (config.is_discarded() || !config.contains("train") || !config["train"].contains("nb_steps")) return false;
  const auto records = read_jsonl(log, /*allow_cut_tail=*/true);
  return !records.empty() && records.back().contains("step") && records.back()["step"] >= config["train"]["nb_steps"];
}

// What changes when the runner appends to the log: its size and time.
std::string log_stamp(const std::string& run_dir) {
  std::error_code ec;
  const std::filesystem::path path = RunPaths(run_dir).log();
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return "";
  return fmt::format("{}:{}", size, std::filesystem::last_write_time(path, ec).time_since_epoch().count());
}

}  // namespace

void add_report(CLI::App& app, const std::shared_ptr<Globals>&, Run& run) {
  struct Options {
    std::string run_dir, out;
    int live = 0;
  };
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("report", "a run as one self-contained HTML page (curves, spans, PAR, config)");
  cmd->add_option("run", o->run_dir, "run directory")->required();
  cmd->add_option("--out,-o", o->out, "page to write (default RUN/report.html)");
  cmd->add_option("--live", o->live,
                  "keep the page current: it reloads every N seconds, and is rewritten whenever the log grows, "
                  "until the run reaches train.nb_steps (or Ctrl-C)")
      ->check(CLI::Range(1, 3600));
  cmd->callback([o, &run] {
    run = [o] {
      const std::string out = o->out.empty() ? o->run_dir + "/report.html" : o->out;
      if (o->live == 0) {
        viz::write_report(o->run_dir, out);
        fmt::print("report: {}\n", out);
        return;
      }
      std::string stamp = "none";
      while (true) {
        const bool done = run_finished(o->run_dir);
        const std::string now = log_stamp(o->run_dir);
        if (now != stamp || done) {
          viz::ReportOptions options;
          options.refresh_seconds = done ? 0 : o->live;
          viz::write_report(o->run_dir, out, options);
          if (stamp == "none") fmt::print("report: {} (live, every {} s)\n", out, o->live);
          std::fflush(stdout);
          stamp = now;
        }
        if (done) {
          fmt::print("report: the run reached its last step; {} is final\n", out);
          return;
        }
        std::this_thread::sleep_for(std::chrono::seconds(o->live));
      }
    };
  });
}

}  // namespace spanformer::cli
