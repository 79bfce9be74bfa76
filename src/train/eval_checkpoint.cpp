#include "spanformer/train/eval_checkpoint.h"

#include <cmath>
#include <memory>

#include <fmt/format.h>
#include <torch/utils.h>

#include "spanformer/dist/group.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"
#include "spanformer/util/runtime.h"

namespace spanformer::train {
namespace {

// A NaN or infinite loss is not a result: the weights overflow (an imported model with a huge weight) or
// hold NaN, and a figure printed from it would be read as a score.
void refuse_non_finite(const Checkpoint& ck, const std::string& split, double nll) {
  if (!std::isfinite(nll))
    fail("{}: the {} NLL is {} (not finite): the model's weights overflow in the forward pass; no result reported",
         ck.path(), split, nll);
}

CheckpointEvalResult evaluate_examples(const Checkpoint& ck, Family& family, ExampleSets& sets, const CheckpointEval& r) {
  if (!r.ids.empty() || !r.vocab.empty() || !r.dump_logprobs.empty() || r.unit)
    fail("--ids, --vocab, --dump-logprobs and --unit are for language models, not the {} family", family.name());
  const std::string dir = r.data.empty() ? family.train().data : r.data;
  if (!r.dump_outputs.empty() && r.group && r.group->world() > 1) fail("--dump-outputs runs in one process");
  if (!r.dump_outputs.empty()) check_regular_or_absent(r.dump_outputs, "--dump-outputs");
  if (r.batch > 0) family.train().eval_batch_size = r.batch;
  const double start = now_seconds();
  auto data = sets.open_examples(dir);
  if (data::vocab_to_text(data.vocab) != data::vocab_to_text(ck.vocab()))
    fail("{}: its classes differ from the checkpoint's: the model was trained on other data", dir);
  auto* group = r.group;
  auto score = sets.score_examples(r.split, group ? group->rank() : 0, group ? group->world() : 1, /*full=*/true);
  score.all_reduce(group);
  CheckpointEvalResult out;
  if (group && !group->is_main()) {
    out.main = false;
    return out;
  }
  if (!r.dump_outputs.empty()) {
    std::string text;
    for (const auto& line : score.outputs) text += line + "\n";
    write_file_atomic(r.dump_outputs, text);
  }
  const double accuracy = score.correct / score.count, nll = score.nll_sum / score.count;
  refuse_non_finite(ck, r.split, nll);
  const double seconds = now_seconds() - start;
  out.record = nlohmann::json{{"checkpoint", ck.path()}, {"split", r.split}, {"data", dir}, {"unit", "accuracy"},
                              {"accuracy", accuracy}, {"nll", nll}, {data.scored, static_cast<int64_t>(score.count)},
                              {"seconds", seconds}, {"step", ck.has("state.step") ? ck.integer("state.step") : -1}};
  std::string extra;
  sets.report_score(score, "", out.record, extra);
  out.text = fmt::format("{} accuracy {:.4f} (error {:.2f}%, nll {:.6f} nats; {} {}; {:.1f} s){}", r.split, accuracy,
                         100 * (1 - accuracy), nll, static_cast<int64_t>(score.count), data.scored, seconds, extra);
  return out;
}

}  // namespace

CheckpointEvalResult evaluate_checkpoint(const Checkpoint& ck, Family& family, const CheckpointEval& r) {
  if (r.batch == 0 || r.batch < -1) fail("--batch must be positive (got {})", r.batch);
  if (!r.dump_outputs.empty() && !family.as<ExampleSets>())
    fail("--dump-outputs is for the example families (seq2seq, vit); language models have --dump-logprobs");
  if (r.unit == metrics::Unit::kNats) fail("--unit must be bpc or ppl (got 'nats': a language model reports bits or perplexity)");
  // The same numbers from the same command: what a forward draws (LSH attention's rotations) comes from
  // the run's seed, not from LibTorch's default generator, which starts from a nondeterministic seed.
  torch::manual_seed(static_cast<uint64_t>(family.train().seed));
  if (!r.vocab.empty()) {
    auto v = ck.vocab().word_level ? data::read_word_vocab(r.vocab) : data::read_vocab(r.vocab);
    if (data::vocab_to_text(v) != data::vocab_to_text(ck.vocab()))
      fail("{} is not the vocabulary of {}: the ids would mean other tokens", r.vocab, ck.path());
  }
  if (auto* sets = family.as<ExampleSets>()) return evaluate_examples(ck, family, *sets, r);

  std::unique_ptr<data::TokenFile> raw;
  data::Corpus corpus;
  const std::string dir = r.data.empty() ? family.train().data : r.data;
  if (!r.ids.empty()) {
    raw = std::make_unique<data::TokenFile>(r.ids, data::TokenFile::RawBytes{}, ck.vocab().size());
  } else {
    corpus = data::load_corpus(dir, r.split);
    if (data::vocab_to_text(corpus.vocab) != data::vocab_to_text(ck.vocab()))
      fail("{}: its vocabulary differs from the checkpoint's: the model was trained on other data", dir);
  }
  const data::TokenFile& tokens = raw ? *raw : corpus.split(r.split);
  EvalRequest request;
  request.batch = r.batch;
  request.group = r.group;
  request.dump_logprobs = r.dump_logprobs;
  request.progress = r.progress;
  const double start = now_seconds();
  auto report = family.need<TokenStreams>().evaluate(tokens, request);
  CheckpointEvalResult out;
  if (r.group && !r.group->is_main()) {
    out.main = false;
    return out;
  }
  refuse_non_finite(ck, raw ? r.ids : r.split, report.nll);
  const auto unit_kind = r.unit ? *r.unit : ck.vocab().word_level ? metrics::Unit::kPpl : metrics::Unit::kBpc;
  const std::string unit = metrics::unit_name(unit_kind);
  const double value = metrics::in_unit(report.nll, unit_kind);
  const double seconds = now_seconds() - start;
  const std::string split = raw ? r.ids : r.split;
  out.record = nlohmann::json{{"checkpoint", ck.path()}, {"split", split}, {"data", raw ? r.ids : dir},
                              {"unit", unit}, {unit, value}, {"nll", report.nll}, {"tokens", report.tokens},
                              {"blocks", report.blocks}, {"protocol", report.details}, {"seconds", seconds},
                              {"step", ck.has("state.step") ? ck.integer("state.step") : -1}};
  out.text = fmt::format("{} {} {:.7f} (nll {:.6f} nats/token; {}; {:.1f} s)", split, unit, value, report.nll,
                         report.details, seconds);
  return out;
}

}  // namespace spanformer::train
