// spanformer eval: full evaluation of any family's checkpoint by the family's protocol.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "command.h"
#include "spanformer/dist/group.h"
#include "spanformer/train/eval_checkpoint.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/util/runtime.h"
#include "spanformer/util/run_paths.h"

namespace spanformer::cli {
namespace {

// A checkpoint inside a run directory: the result joins the run's records (RUN/eval.jsonl).
void record_in_run(const std::string& checkpoint, const nlohmann::json& record) {
  const std::string dir = std::filesystem::path(checkpoint).parent_path().string();
  const RunPaths run(dir.empty() ? "." : dir);
  if (!file_exists(run.log())) return;
  std::ofstream out(run.evals(), std::ios::app);
  out << record.dump() << "\n";
  if (!out) fmt::print(stderr, "spanformer: warning: cannot record the result in {}\n", run.evals());
}

}  // namespace

void add_eval(CLI::App& app, const std::shared_ptr<Globals>& g, Run& run) {
  struct Options {
    std::string checkpoint, data, split = "test", unit, ids, text, vocab, dump, outputs;
    int64_t batch = -1;
    int nproc = 1;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("eval", "full evaluation of a checkpoint (the family's reference protocol)");
  cmd->add_option("checkpoint", o->checkpoint, "checkpoint file or run directory")->required();
  cmd->add_option("--data", o->data, "prepared data directory or image set (default: the one the model was trained on)");
  cmd->add_option("--split", o->split, "train | valid | test")->capture_default_str();
  cmd->add_option("--batch", o->batch, "evaluation streams, or images per forward (default: the config's eval_batch_size)");
  cmd->add_option("--unit", o->unit, "bpc or ppl (default: bpc for byte vocabularies, ppl for word and BPE ones)");
  cmd->add_option("--ids", o->ids, "evaluate a headerless file of one-byte token ids of the checkpoint's vocabulary "
                                   "(e.g. the reference's valid.ids.u8) instead of a data split");
  cmd->add_option("--text", o->text, "score a text file, tokenized with the checkpoint's vocabulary (byte or GPT-2 "
                                     "BPE), instead of a data split; also prints bits per byte of the text");
  cmd->add_option("--vocab", o->vocab, "vocab.txt the ids were made with; must be the checkpoint's vocabulary");
  cmd->add_option("--dump-logprobs", o->dump, "write the log-probability of every scored token to this file "
                                              "(one per line, in text order)");
  cmd->add_option("--dump-outputs", o->outputs, "seq2seq, vit: write one line per example, in split order: the "
                                                 "reference and the translation (or the label and the prediction), tab-separated");
  cmd->add_flag("--json", o->json, "print one JSON record instead of the text line (run directories also keep it "
                                   "in eval.jsonl either way)");
  cmd->add_option("--nproc-per-node", o->nproc, "split the streams over N local processes (or use torchrun/SLURM variables)");
  cmd->allow_extras();  // evaluation-protocol overrides, e.g. --eval_mem_len=1600 (Transformer-XL/PAR), --beam=5 (seq2seq)
  cmd->callback([cmd, o, g, &run] {
    auto overrides = config_overrides(*cmd);
    run = [o, g, overrides] {
      if (launch_workers(o->nproc, g->argv)) return;
      dist::GroupOptions group_options;
      group_options.cuda = g->device.rfind("cuda", 0) == 0;
      auto group = dist::Group::from_env(group_options);
      const std::string device = dist::process_device(g->device.empty() ? "cpu" : g->device, group.get());
      set_threads(g->threads);
      train::Checkpoint ck(o->checkpoint);
      auto all = execution_overrides(*g);
      all.insert(all.end(), overrides.begin(), overrides.end());
      auto family = train::family_from_checkpoint(ck, all);
      family->module().to(train::parse_device(device));
      const bool tty = isatty(STDERR_FILENO);
      train::CheckpointEval request;
      request.data = o->data;
      request.split = o->split;
      request.batch = o->batch;
      if (!o->unit.empty()) {
        if (o->unit != "bpc" && o->unit != "ppl") fail("--unit must be bpc or ppl (got '{}')", o->unit);
        request.unit = metrics::parse_unit(o->unit);
      }
      request.ids = o->ids;
      request.text = o->text;
      request.vocab = o->vocab;
      request.dump_logprobs = o->dump;
      request.dump_outputs = o->outputs;
      request.group = group.get();
      request.progress = [tty](int64_t done, int64_t total) {
        if (tty && done % 10 == 0) fmt::print(stderr, "\r  eval block {}/{}", done, total);
      };
      auto result = train::evaluate_checkpoint(ck, *family, request);
      if (!result.main) return;
      if (tty && family->as<train::TokenStreams>()) fmt::print(stderr, "\r{:40}\r", "");
      fmt::print("{}\n", o->json ? result.record.dump() : result.text);
      if (!o->dump.empty() && !o->json) fmt::print("log-probabilities: {} ({} tokens)\n", o->dump, result.record["tokens"].get<int64_t>());
      if (!o->outputs.empty() && !o->json) fmt::print("outputs: {}\n", o->outputs);
      record_in_run(ck.path(), result.record);
    };
  });
}

}  // namespace spanformer::cli
