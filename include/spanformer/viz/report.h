// `spanformer report RUN_DIR`: a run as one self-contained HTML page that opens offline.
//
// Inlined: uPlot 1.6.32 (MIT, third_party/uplot, vendored from npm) and the run's own files:
//   log.jsonl       one record per evaluation interval -> train/valid curves per unit (loss, bpc, ppl,
//                   accuracy, BLEU), tokens/s, step time, learning rate, Gumbel temperature, spans per
//                   head over training (one chart per layer) and the final layers x heads span grid, PAR
//                   block probabilities over training (one chart per block);
//   config.json     the resolved configuration;
//   sessions.jsonl  each session's command line, version, commit, LibTorch, CUDA, host and start time.
// Live mode: the page reloads itself every `refresh_seconds` (meta refresh works on file:// pages) and
// `spanformer report --live N` rewrites it whenever log.jsonl changes. Writes are atomic: a browser
// never reads a half-written page.
#pragma once
#include <string>

namespace spanformer::viz {

struct ReportOptions {
  int refresh_seconds = 0;  // 0: a static page
};

// The page's HTML. Throws Error naming the file when the run directory or its log/config is missing or
// not valid JSON.
std::string render_report(const std::string& run_dir, const ReportOptions& options = {});

// render_report written atomically to out.
void write_report(const std::string& run_dir, const std::string& out, const ReportOptions& options = {});

}  // namespace spanformer::viz
