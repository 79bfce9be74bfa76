// A run's log.jsonl as `report` and `par plot` read it: the records, then the report page of a run
// directory holding that log and a tiny adaptive-span config (without a config the report refused every
// input, the seeds too, and never reached its pages).
#include <filesystem>
#include <fstream>

#include "fuzz.h"
#include "spanformer/util/jsonl.h"
#include "spanformer/viz/report.h"

SPANFORMER_FUZZ_TARGET(jsonl) {
  const std::string run = spanformer::fuzz::scratch_dir() + "/run";
  if (std::filesystem::create_directories(run))
    std::ofstream(run + "/config.json") << R"({"model": {"nb_layers": 1, "hidden_size": 8, "inner_hidden_size": 16, )"
                                            R"("nb_heads": 2, "attn_span": 16, "block_size": 8}})";
  const std::string log = spanformer::fuzz::as_file(data, size, ".jsonl");
  std::filesystem::copy_file(log, run + "/log.jsonl", std::filesystem::copy_options::overwrite_existing);
  return spanformer::fuzz::expect_refusal([&] {
    try {
      (void)spanformer::read_jsonl(log, /*allow_cut_tail=*/true);
    } catch (const spanformer::Error&) {
    }
    spanformer::viz::write_report(run, spanformer::fuzz::scratch_dir() + "/report.html");
  });
}
