#include "spanformer/train/eval_checkpoint.h"

#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <memory>

#include <fmt/format.h>
#include <torch/utils.h>

#include "spanformer/data/byte_bpe.h"
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

// A text file as the checkpoint's tokens: GPT-2's BPE as transformers' tokenizer encodes it, or a byte
// vocabulary's bytes (one that lacks a byte of the text is refused: the score would skip it). Written to a
// temporary token file, removed once read (TokenFile maps it; the mapping outlives the name).
std::unique_ptr<data::TokenFile> text_tokens(const Checkpoint& ck, const std::string& path, int64_t& bytes) {
  const data::Vocab& vocab = ck.vocab();
  if (vocab.word_level || vocab.subwords)
    fail("--text reads byte and GPT-2 BPE vocabularies; {} has a {} vocabulary: prepare the text with `spanformer "
         "data prepare` and its vocabulary instead", ck.path(), data::vocab_level(vocab));
  const std::string text = read_file(path);
  bytes = static_cast<int64_t>(text.size());
  std::vector<int64_t> ids;
  if (vocab.bpe) {
    ids = vocab.bpe->encode(text);
  } else {
    const auto byte_to_id = vocab.byte_to_id();
    for (size_t i = 0; i < text.size(); ++i) {
      const int64_t id = byte_to_id[static_cast<unsigned char>(text[i])];
      if (id < 0) fail("{}: byte {} (0x{:02x}) is not in the checkpoint's vocabulary", path, i, static_cast<unsigned char>(text[i]));
      ids.push_back(id);
    }
  }
  if (ids.size() < 2) fail("{}: {} token(s); scoring needs at least 2", path, ids.size());
  std::string tmp = (std::filesystem::temp_directory_path() / "spanformer-eval-XXXXXX").string();
  const int fd = mkstemp(tmp.data());
  if (fd < 0) fail("cannot create a temporary file in {}", std::filesystem::temp_directory_path().string());
  close(fd);
  try {
    data::write_tokens(tmp, ids, vocab.size());
    auto file = std::make_unique<data::TokenFile>(tmp);
    std::filesystem::remove(tmp);
    return file;
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw;
  }
}

CheckpointEvalResult evaluate_examples(const Checkpoint& ck, Family& family, ExampleSets& sets, const CheckpointEval& r) {
  if (!r.ids.empty() || !r.text.empty() || !r.vocab.empty() || !r.dump_logprobs.empty() || r.unit)
    fail("--ids, --text, --vocab, --dump-logprobs and --unit are for language models, not the {} family", family.name());
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
  if (!r.ids.empty() && !r.text.empty()) fail("--ids and --text both name what to score: give one");
  int64_t text_bytes = 0;
  if (!r.ids.empty()) {
    raw = std::make_unique<data::TokenFile>(r.ids, data::TokenFile::RawBytes{}, ck.vocab().size());
  } else if (!r.text.empty()) {
    raw = text_tokens(ck, r.text, text_bytes);
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
  const std::string split = !r.ids.empty() ? r.ids : !r.text.empty() ? r.text : r.split;
  refuse_non_finite(ck, split, report.nll);
  // Perplexity per token for word and BPE vocabularies (as transformers' users compute it), bits per
  // character for byte ones.
  const bool per_token = ck.vocab().word_level || ck.vocab().bpe;
  const auto unit_kind = r.unit ? *r.unit : per_token ? metrics::Unit::kPpl : metrics::Unit::kBpc;
  const std::string unit = metrics::unit_name(unit_kind);
  const double value = metrics::in_unit(report.nll, unit_kind);
  const double seconds = now_seconds() - start;
  out.record = nlohmann::json{{"checkpoint", ck.path()}, {"split", split}, {"data", raw ? split : dir},
                              {"unit", unit}, {unit, value}, {"nll", report.nll}, {"tokens", report.tokens},
                              {"blocks", report.blocks}, {"protocol", report.details}, {"seconds", seconds},
                              {"step", ck.has("state.step") ? ck.integer("state.step") : -1}};
  out.text = fmt::format("{} {} {:.7f} (nll {:.6f} nats/token; {}; {:.1f} s)", split, unit, value, report.nll,
                         report.details, seconds);
  if (text_bytes > 0) {  // a text's score in bits per byte of it too: comparable across tokenizers
    const double bpb = report.nll * static_cast<double>(report.tokens) / (static_cast<double>(text_bytes) * std::log(2.0));
    out.record["bytes"] = text_bytes;
    out.record["bits_per_byte"] = bpb;
    out.text += fmt::format("; {:.6f} bits per byte of the text's {} bytes", bpb, text_bytes);
  }
  return out;
}

}  // namespace spanformer::train
