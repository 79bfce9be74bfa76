#include "spanformer/viz/report.h"

#include <nlohmann/json.hpp>

#include <filesystem>

#include <fmt/format.h>

#include "report_assets.h"
#include "spanformer/util/build_info.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/util/jsonl.h"
#include "spanformer/util/run_paths.h"

namespace spanformer::viz {
namespace {

void replace_once(std::string& page, const std::string& placeholder, const std::string& value) {
  const size_t at = page.find(placeholder);
  if (at == std::string::npos) fail("report template: placeholder {} missing", placeholder);
  page.replace(at, placeholder.size(), value);
}

}  // namespace

std::string render_report(const std::string& run_dir, const ReportOptions& options) {
  if (!std::filesystem::is_directory(run_dir)) fail("{} is not a run directory", run_dir);
  const RunPaths run(run_dir);
  const std::string config_path = run.config(), log_path = run.log();
  if (!file_exists(config_path)) fail("{} not found: is '{}' a run directory?", config_path, run_dir);
  nlohmann::json config;
  try {
    config = parse_json(read_file(config_path), config_path);
  } catch (const nlohmann::json::exception&) {
    fail("{} is not JSON", config_path);
  }
  if (options.refresh_seconds < 0) fail("--live must be a positive number of seconds");
  nlohmann::json log = file_exists(log_path) ? read_jsonl(log_path, /*allow_cut_tail=*/true) : nlohmann::json::array();
  const std::string sessions_path = run.sessions();
  nlohmann::json sessions = file_exists(sessions_path) ? read_jsonl(sessions_path, true) : nlohmann::json::array();
  int64_t span_limit = 0;
  if (config.contains("model") && config["model"].contains("attn_span") && config["model"]["attn_span"].is_number())
    span_limit = config["model"]["attn_span"].get<int64_t>();

  nlohmann::json data = {{"run_dir", run_dir},   {"config", config},         {"log", log},
                         {"sessions", sessions}, {"span_limit", span_limit}, {"refresh", options.refresh_seconds},
                         {"written", utc_timestamp()}};
  // Inside <script>, "</" would end the element early: JSON allows the escaped form. Bytes that are not
  // UTF-8 (a run directory named in Latin-1) become U+FFFD rather than failing the page.
  std::string json = data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  for (size_t at = json.find("</"); at != std::string::npos; at = json.find("</", at + 3)) json.replace(at, 2, "<\\/");

  std::string page = report_assets::page;
  replace_once(page, "/*UPLOT_CSS*/", report_assets::uplot_css);
  replace_once(page, "/*UPLOT_JS*/", report_assets::uplot_js);
  replace_once(page, "/*SPANFORMER_DATA*/", json);
  replace_once(page, "<!--SPANFORMER_REFRESH-->",
               options.refresh_seconds > 0 ? fmt::format("<meta http-equiv=\"refresh\" content=\"{}\">", options.refresh_seconds)
                                           : std::string());
  return page;
}

void write_report(const std::string& run_dir, const std::string& out, const ReportOptions& options) {
  write_file_atomic(out, render_report(run_dir, options));
}

}  // namespace spanformer::viz
