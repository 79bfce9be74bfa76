// spanformer eval: full evaluation of any family's checkpoint by the family's protocol.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "command.h"
#include "spanformer/dist/group.h"
#include "spanformer/train/family.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/util/runtime.h"

namespace spanformer::cli {
namespace {

// A checkpoint inside a run directory: the result joins the run's records (RUN/eval.jsonl).
void record_in_run(const std::string& checkpoint, const nlohmann::json& record) {
  const std::string dir = std::filesystem::path(checkpoint).parent_path().string();
  const std::string run_dir = dir.empty() ? "." : dir;
  if (!file_exists(run_dir + "/log.jsonl")) return;
  std::ofstream out(run_dir + "/eval.jsonl", std::ios::app);
  out << record.dump() << "\n";
  if (!out) fmt::print(stderr, "spanformer: warning: cannot record the result in {}/eval.jsonl\n", run_dir);
}

}  // namespace

void add_eval(CLI::App& app, const std::shared_ptr<Globals>& g, Run& run) {
  struct Options {
    std::string checkpoint, data, split = "test", unit, ids, vocab, dump;
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
  cmd->add_option("--unit", o->unit, "bpc or ppl (default: bpc for byte vocabularies, ppl for word ones)");
  cmd->add_option("--ids", o->ids, "evaluate a headerless file of one-byte token ids of the checkpoint's vocabulary "
                                   "(e.g. the reference's valid.ids.u8) instead of a data split");
  cmd->add_option("--vocab", o->vocab, "vocab.txt the ids were made with; must be the checkpoint's vocabulary");
  cmd->add_option("--dump-logprobs", o->dump, "write the log-probability of every scored token to this file "
                                              "(one per line, in text order)");
  cmd->add_flag("--json", o->json, "print one JSON record instead of the text line (run directories also keep it "
                                   "in eval.jsonl either way)");
  cmd->add_option("--nproc-per-node", o->nproc, "split the streams over N local processes (or use torchrun/SLURM variables)");
  cmd->allow_extras();  // evaluation-protocol overrides, e.g. --eval_mem_len=1600 (Transformer-XL/PAR), --beam=5 (seq2seq)
  cmd->callback([cmd, o, g, &run] {
    auto overrides = cmd->remaining();
    run = [o, g, overrides] {
      if (o->batch == 0 || o->batch < -1) fail("--batch must be positive (got {})", o->batch);
      if (!o->unit.empty() && o->unit != "bpc" && o->unit != "ppl") fail("--unit must be bpc or ppl (got '{}')", o->unit);
      if (launch_workers(o->nproc, g->argv)) return;
      auto group = dist::Group::from_env(dist::GroupOptions{});
      set_threads(g->threads);
      train::Checkpoint ck(o->checkpoint);
      auto all = execution_overrides(*g);
      all.insert(all.end(), overrides.begin(), overrides.end());
      auto family = train::family_from_checkpoint(ck, all);
      family->module().to(train::parse_device(g->device.empty() ? "cpu" : g->device));
      if (!o->vocab.empty()) {
        auto v = ck.vocab().word_level ? data::read_word_vocab(o->vocab) : data::read_vocab(o->vocab);
        if (data::vocab_to_text(v) != data::vocab_to_text(ck.vocab()))
          fail("{} is not the vocabulary of {}: the ids would mean other tokens", o->vocab, o->checkpoint);
      }
      if (family->data_restart() == train::DataRestart::kExamples) {  // labelled examples: accuracy
        if (!o->ids.empty() || !o->vocab.empty() || !o->dump.empty() || !o->unit.empty())
          fail("--ids, --vocab, --dump-logprobs and --unit are for language models, not the {} family", family->name());
        const std::string dir = o->data.empty() ? family->train().data : o->data;
        if (o->batch > 0) family->train().eval_batch_size = o->batch;
        const double start = now_seconds();
        auto data = family->open_examples(dir);
        if (data::vocab_to_text(data.vocab) != data::vocab_to_text(ck.vocab()))
          fail("{}: its classes differ from the checkpoint's: the model was trained on other data", dir);
        auto score = family->score_examples(o->split, group ? group->rank() : 0, group ? group->world() : 1, /*full=*/true);
        if (group) {
          score.nll_sum = group->all_reduce_sum(score.nll_sum);
          score.correct = group->all_reduce_sum(score.correct);
          score.count = group->all_reduce_sum(score.count);
          for (auto& v : score.sums) v = group->all_reduce_sum(v);
        }
        if (group && !group->is_main()) return;
        const double accuracy = score.correct / score.count, nll = score.nll_sum / score.count;
        const double seconds = now_seconds() - start;
        nlohmann::json record{{"checkpoint", ck.path()}, {"split", o->split}, {"data", dir},
                              {"unit", "accuracy"}, {"accuracy", accuracy}, {"nll", nll},
                              {data.scored, static_cast<int64_t>(score.count)}, {"seconds", seconds},
                              {"step", ck.has("state.step") ? ck.integer("state.step") : -1}};
        std::string extra;
        family->report_score(score, "", record, extra);
        if (o->json)
          fmt::print("{}\n", record.dump());
        else
          fmt::print("{} accuracy {:.4f} (error {:.2f}%, nll {:.6f} nats; {} {}; {:.1f} s){}\n", o->split, accuracy,
                     100 * (1 - accuracy), nll, static_cast<int64_t>(score.count), data.scored, seconds, extra);
        record_in_run(ck.path(), record);
        return;
      }
      std::unique_ptr<data::TokenFile> raw;
      data::Corpus corpus;
      if (!o->ids.empty()) {
        raw = std::make_unique<data::TokenFile>(o->ids, data::TokenFile::RawBytes{}, ck.vocab().size());
      } else {
        const std::string dir = o->data.empty() ? family->train().data : o->data;
        corpus = data::load_corpus(dir, o->split);
        if (data::vocab_to_text(corpus.vocab) != data::vocab_to_text(ck.vocab()))
          fail("{}: its vocabulary differs from the checkpoint's: the model was trained on other data", dir);
      }
      const data::TokenFile& tokens = raw ? *raw : corpus.split(o->split);
      const bool tty = isatty(STDERR_FILENO);
      train::EvalRequest request;
      request.batch = o->batch;
      request.group = group.get();
      request.dump_logprobs = o->dump;
      request.progress = [tty](int64_t done, int64_t total) {
        if (tty && done % 10 == 0) fmt::print(stderr, "\r  eval block {}/{}", done, total);
      };
      const double start = now_seconds();
      auto report = family->evaluate(tokens, request);
      if (group && !group->is_main()) return;
      if (tty) fmt::print(stderr, "\r{:40}\r", "");
      const std::string unit = !o->unit.empty() ? o->unit : ck.vocab().word_level ? "ppl" : "bpc";
      const double value = unit == "ppl" ? std::exp(report.nll) : report.nll / std::log(2.0);
      const double seconds = now_seconds() - start;
      const nlohmann::json record{{"checkpoint", ck.path()}, {"split", raw ? o->ids : o->split},
                                  {"data", raw ? o->ids : (o->data.empty() ? family->train().data : o->data)},
                                  {"unit", unit}, {unit, value}, {"nll", report.nll}, {"tokens", report.tokens},
                                  {"blocks", report.blocks}, {"protocol", report.details}, {"seconds", seconds},
                                  {"step", ck.has("state.step") ? ck.integer("state.step") : -1}};
      if (o->json)
        fmt::print("{}\n", record.dump());
      else
        fmt::print("{} {} {:.7f} (nll {:.6f} nats/token; {}; {:.1f} s)\n", raw ? o->ids : o->split, unit, value,
                   report.nll, report.details, seconds);
      if (!o->dump.empty() && !o->json) fmt::print("log-probabilities: {} ({} tokens)\n", o->dump, report.tokens);
      record_in_run(ck.path(), record);
    };
  });
}

}  // namespace spanformer::cli
