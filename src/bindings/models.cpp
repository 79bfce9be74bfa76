// Any family's checkpoint from Python: `torch.classes.spanformer.Model`, which python/spanformer wraps
// as `spanformer.load(RUN)`. A TorchScript custom class in the same module as the operator (loaded with
// torch.ops.load_library), so it needs no binding library beyond LibTorch's own: Python's torch
// converts the arguments and results (str, int, float, list, dict, Tensor).
//
//   Model(path, overrides)        a checkpoint file or run directory; overrides as on the command line
//                                 ("--eval_mem_len=1600", "--beam=5": how the model runs, never what it is)
//   family() config() vocab()     the family tag, the config as JSON text, the vocabulary's tokens
//   evaluate(split, data, batch)  `spanformer eval --json`'s record as JSON text (train/eval_checkpoint.h)
//   generate(prompt, tokens, temperature, top_k, top_p, seed, bfloat16)  the sampled continuation's bytes
//   translate(sentences, beam, length_penalty)                       seq2seq
//   spans()                       (L, K) float64 learned spans in tokens (adaptive span)
//   logits(ids)                   (N, V) next-token logits of ids at positions 0 .. N - 1 (gpt)
//   attention(texts, indices, split)  the weights `spanformer attention` draws, as tensors
//                                 (train/family.h: AttentionRequest::weights)
//   state_dict()                  the model's parameters by name (float32, CPU)
// and two functions: corpus_bleu(hyps, refs, tokenize), tokenize_13a(line) (metrics/bleu.h).
//
// Everything runs on the CPU with the threads torch.set_num_threads() gives. Errors are the CLI's
// one-line messages, raised as RuntimeError.
#include <torch/custom_class.h>
#include <torch/library.h>

#include <memory>
#include <sstream>
#include <cmath>
#include <string>
#include <vector>

#include "spanformer/metrics/bleu.h"
#include "spanformer/models/gpt.h"
#include "spanformer/train/eval_checkpoint.h"
#include "spanformer/train/family.h"
#include "spanformer/ops/flash_attention.h"
#include "spanformer/util/error.h"
#include "spanformer/viz/report.h"
#include "spanformer/viz/span_plot.h"

namespace {

using namespace spanformer;

class Model : public torch::CustomClassHolder {
 public:
  Model(std::string path, std::vector<std::string> overrides)
      : checkpoint_(path), family_(train::family_from_checkpoint(checkpoint_, overrides)) {
    family_->module().eval();
  }

  std::string family() const { return checkpoint_.family(); }
  std::string config() const { return family_->config_json().dump(); }
  std::vector<std::string> vocab() const { return checkpoint_.vocab().tokens; }
  int64_t step() const { return checkpoint_.has("state.step") ? checkpoint_.integer("state.step") : -1; }

  std::string evaluate(std::string split, std::string data, int64_t batch) {
    auto guard = ready();
    train::CheckpointEval request;
    request.split = split;
    request.data = data;
    request.batch = batch;
    return train::evaluate_checkpoint(checkpoint_, *family_, request).record.dump();
  }

  // The bytes `spanformer generate` prints after the prompt, as a uint8 tensor (N): a byte-level model may
  // sample sequences that are not UTF-8, so the Python side decodes them by its `errors` policy.
  at::Tensor generate(std::string prompt, int64_t tokens, double temperature, int64_t top_k, double top_p, int64_t seed,
                      bool bfloat16) {
    auto guard = ready();
    if (bfloat16 && std::string(family_->name()) != "gpt")
      fail("generate: dtype bfloat16 is for the gpt family (this checkpoint is of the {} family)", family_->name());
    torch::manual_seed(static_cast<uint64_t>(seed));
    train::SampleRequest request;
    request.prompt = prompt;
    request.tokens = tokens;
    request.temperature = temperature;
    request.top_k = top_k;
    request.top_p = top_p;
    request.bfloat16 = bfloat16;
    std::ostringstream text;
    request.on_text = [&text](const std::string& piece) { text << piece; };
    family_->need<train::Sampling>().sample(checkpoint_.vocab(), request);
    const std::string bytes = text.str();
    auto out = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);  // (N)
    std::copy(bytes.begin(), bytes.end(), reinterpret_cast<char*>(out.data_ptr<uint8_t>()));
    return out;
  }

  std::vector<std::string> translate(std::vector<std::string> sentences, int64_t beam, double length_penalty) {
    auto guard = ready();
    train::TranslateRequest request;
    request.beam = beam;
    request.length_penalty = length_penalty;
    return family_->need<train::Translation>().translate(sentences, request);
  }

  // The gpt family's next-token logits of token ids at positions 0 .. N - 1 (N <= context): (N, V) float32.
  at::Tensor logits(std::vector<int64_t> ids) {
    auto guard = ready();
    auto* gpt = dynamic_cast<models::GptModelImpl*>(&family_->module());
    if (!gpt) spanformer::fail("logits: the {} family has no logits from Python (the gpt family has)", family_->name());
    const auto V = checkpoint_.vocab().size();
    for (auto id : ids)
      if (id < 0 || id >= V) spanformer::fail("logits: token id {} is outside the vocabulary (0 .. {})", id, V - 1);
    if (ids.empty()) spanformer::fail("logits: no token ids");
    auto x = torch::tensor(ids, torch::kLong).unsqueeze(0);  // (1, N)
    return gpt->logits(gpt->forward(x)).squeeze(0);          // (N, V)
  }

  at::Tensor spans() const {
    const auto spans = family_->need<train::Spans>().spans();
    if (spans.empty()) spanformer::fail("{}: this {} model learns no spans", checkpoint_.path(), family_->name());
    auto out = torch::zeros({static_cast<int64_t>(spans.size()), static_cast<int64_t>(spans[0].size())}, torch::kDouble);
    for (size_t l = 0; l < spans.size(); ++l)
      for (size_t h = 0; h < spans[l].size(); ++h) out[static_cast<int64_t>(l)][static_cast<int64_t>(h)] = spans[l][h];
    return out;  // (L, K)
  }

  std::vector<at::Tensor> attention(std::vector<std::string> texts, std::vector<int64_t> indices, std::string split) {
    auto guard = ready();
    train::AttentionRequest request;
    request.texts = texts;
    request.indices = indices;
    request.split = split;
    request.vocab = &checkpoint_.vocab();
    request.out = "";  // nothing drawn
    std::vector<at::Tensor> weights;
    request.weights = &weights;
    family_->need<train::AttentionPictures>().draw_attention(request);
    return weights;
  }

  c10::Dict<std::string, at::Tensor> state_dict() const {
    c10::Dict<std::string, at::Tensor> out;
    for (const auto& item : family_->module().named_parameters()) out.insert(item.key(), item.value().detach().cpu().clone(at::MemoryFormat::Contiguous));
    for (const auto& item : family_->module().named_buffers())
      out.insert(item.key(), item.value().detach().cpu().clone(at::MemoryFormat::Contiguous));
    return out;
  }

 private:
  // Every call runs the model as the commands do: evaluation mode (a family may leave it in training
  // mode after scoring), no autograd graph.
  std::unique_ptr<torch::NoGradGuard> ready() {
    family_->module().eval();
    return std::make_unique<torch::NoGradGuard>();
  }

  train::Checkpoint checkpoint_;
  std::unique_ptr<train::Family> family_;
};

}  // namespace

namespace spanformer::bindings {
void link_operators();  // torch_ops.cpp
}  // namespace spanformer::bindings

TORCH_LIBRARY_FRAGMENT(spanformer, m) {
  spanformer::bindings::link_operators();
  m.class_<Model>("Model")
      .def(torch::init<std::string, std::vector<std::string>>())
      .def("family", &Model::family)
      .def("config", &Model::config)
      .def("vocab", &Model::vocab)
      .def("step", &Model::step)
      .def("evaluate", &Model::evaluate)
      .def("generate", &Model::generate)
      .def("translate", &Model::translate)
      .def("spans", &Model::spans)
      .def("logits", &Model::logits)
      .def("attention", &Model::attention)
      .def("state_dict", &Model::state_dict);
  // BLEU (metrics/bleu.h) from Python: refs holds the reference streams one after another (each as long
  // as hyps); returns [score, brevity penalty, sys_len, ref_len, correct 1..4, total 1..4].
  m.def("corpus_bleu(str[] hyps, str[] refs, bool tokenize=True) -> float[]",
        [](std::vector<std::string> hyps, std::vector<std::string> refs, bool tokenize) {
          const size_t n = hyps.size();
          if (n == 0 || refs.size() % n != 0 || refs.empty())
            spanformer::fail("corpus_bleu: {} references for {} hypotheses: give whole streams, each as long as hyps",
                             refs.size(), n);
          std::vector<std::vector<std::string>> streams;
          for (size_t i = 0; i < refs.size(); i += n) streams.emplace_back(refs.begin() + i, refs.begin() + i + n);
          const auto b = spanformer::metrics::corpus_bleu(hyps, streams, tokenize);
          std::vector<double> out = {b.score, b.brevity_penalty, static_cast<double>(b.stats.sys_len),
                                     static_cast<double>(b.stats.ref_len)};
          for (auto c : b.stats.correct) out.push_back(static_cast<double>(c));
          for (auto t : b.stats.total) out.push_back(static_cast<double>(t));
          return out;
        });
  // How the CPU attention kernels multiply bf16 / fp16 inputs (ops/cpu/tile_gemm.h): sets the mode when
  // given ("auto", "widened", "native"); returns what bf16 inputs get now ("native" or "widened").
  m.def("cpu_half_products(str mode=\"\") -> str", [](std::string mode) -> std::string {
    return spanformer::ops::cpu_half_products(mode);
  });
  // `spanformer spans --out`'s picture from Python: spans flattened layer by layer, `heads` per layer
  // (tokens); PNG, SVG or PDF by the extension of out, with the numbers in a JSON file beside it.
  m.def("plot_spans(float[] spans, int heads, str out, int attn_span, int ramp=32, str title=\"\", "
        "str layout=\"auto\") -> str",
        [](std::vector<double> flat, int64_t heads, std::string out, int64_t attn_span, int64_t ramp, std::string title,
           std::string layout) {
          if (heads < 1 || flat.empty() || flat.size() % static_cast<size_t>(heads) != 0)
            spanformer::fail("plot_spans: {} spans do not make whole layers of {} heads", flat.size(), heads);
          if (attn_span < 1 || ramp < 1) spanformer::fail("plot_spans: attn_span and ramp must be >= 1");
          for (size_t i = 0; i < flat.size(); ++i)
            if (!(std::isfinite(flat[i]) && flat[i] >= 0))
              spanformer::fail("plot_spans: a span is a number of tokens >= 0 (layer {} head {}: {})",
                               i / static_cast<size_t>(heads), i % static_cast<size_t>(heads), flat[i]);
          std::vector<std::vector<double>> spans;
          for (size_t i = 0; i < flat.size(); i += static_cast<size_t>(heads))
            spans.emplace_back(flat.begin() + static_cast<std::ptrdiff_t>(i),
                               flat.begin() + static_cast<std::ptrdiff_t>(i) + heads);
          viz::SpanPlotOptions o;
          o.attn_span = attn_span;
          o.ramp = ramp;
          o.title = title;
          o.layout = viz::parse_span_layout(layout);
          viz::write_span_plot(out, spans, o);
          return out;
        });
  m.def("tokenize_13a(str line) -> str", [](std::string line) { return spanformer::metrics::tokenize_13a(line); });
  // `spanformer report` from Python: the run's page written to out (atomic); returns out.
  m.def("report(str run_dir, str out, int refresh_seconds=0) -> str",
        [](std::string run_dir, std::string out, int64_t refresh_seconds) {
          viz::ReportOptions options;
          options.refresh_seconds = static_cast<int>(refresh_seconds);
          viz::write_report(run_dir, out, options);
          return out;
        });
}
