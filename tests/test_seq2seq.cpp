// The seq2seq family: sentence-pair preparation (normalisation, tokenisation, the seeded
// split, the target-first vocabulary, errors), every model kind against a plain double-precision
// composition written from the equations in models/seq2seq.h (GRU cells by their formula, each
// sentence alone at its own length so that padding and masks are tested too, attention by its
// formula): the two sum the same terms in other orders, so 1e-10 on logits of O(1) is safe; teacher
// forcing against step-by-step decoding; beam search against exhaustive search; a stopped and resumed
// run ends bit for bit where an uninterrupted one does.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>

#include "spanformer/config/seq2seq_config.h"
#include "spanformer/data/pairs.h"
#include "spanformer/data/subwords.h"
#include "spanformer/train/checkpoint.h"
#include "spanformer/models/seq2seq.h"
#include "util.h"

using namespace spanformer;
using models::Seq2SeqModel;

namespace {

// ---- data -------------------------------------------------------------------------------------------

TEST(Pairs, NormalisesAndTokenises) {
  EXPECT_EQ(data::normalize_sentence("  Va\xC2\xA0!  ", true), "va !");
  EXPECT_EQ(data::normalize_sentence("\xC3\x89tais-tu l\xC3\xA0 ?", true), "\xC3\xA9tais-tu l\xC3\xA0 ?");  // É -> é
  EXPECT_EQ(data::normalize_sentence("It\xE2\x80\x99s \xC2\xAB" "ok\xC2\xBB", false), "It's \"ok\"");
  EXPECT_EQ(data::normalize_sentence("Wait\xE2\x80\xA6", true), "wait...");
  using V = std::vector<std::string>;
  EXPECT_EQ(data::tokenize_sentence("l'homme est-il parti ?"), (V{"l'", "homme", "est-il", "parti", "?"}));
  EXPECT_EQ(data::tokenize_sentence("i don't know, tom."), (V{"i", "don'", "t", "know", ",", "tom", "."}));
  EXPECT_EQ(data::tokenize_sentence("(yes)"), (V{"(", "yes", ")"}));
  EXPECT_EQ(data::tokenize_sentence(""), V{});
  // English output text comes back as written.
  for (std::string s : {"i don't know, tom.", "is it (really) yours?", "wait...", "go!"})
    EXPECT_EQ(data::detokenize(data::tokenize_sentence(s)), s);
}

std::string pairs_text(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<std::string> en = {"i", "you", "see", "the", "cat", "dog", "run", "a", "big", "red"};
  const std::vector<std::string> fr = {"je", "tu", "vois", "le", "chat", "chien", "cours", "un", "grand", "rouge"};
  std::string out;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = 1 + static_cast<int64_t>(rng() % 5);
    std::string e, f;
    for (int64_t k = 0; k < len; ++k) {
      const size_t w = rng() % en.size();
      e += (k ? " " : "") + en[w];
      f += (k ? " " : "") + fr[w];
    }
    out += e + " .\t" + f + " .\n";
  }
  return out;
}

TEST(Pairs, SplitVocabularyAndErrors) {
  tu::TempDir dir;
  const std::string path = dir.path() + "/pairs.txt";
  tu::write_text(path, pairs_text(300, 1) + "Too long a sentence with far too many words in it .\tTrop long .\n");
  data::PairsOptions o;
  o.max_length = 8;
  o.valid_pairs = 20;
  o.test_pairs = 30;
  auto set = data::load_pairs(path, o);
  EXPECT_EQ(set.read_lines, 301);
  EXPECT_EQ(set.kept_pairs, 300);  // the long pair is dropped
  EXPECT_EQ(set.test.size(), 30u);
  EXPECT_EQ(set.valid.size(), 20u);
  EXPECT_EQ(set.train.size(), 250u);
  // Target words first (after the four specials), then source-only words; French is the source.
  EXPECT_EQ(set.vocab.tokens[0], "<pad>");
  EXPECT_EQ(set.vocab.tokens[3], "<eos>");
  EXPECT_EQ(set.target_vocab, 4 + 11);  // ten English words and "."
  EXPECT_EQ(set.vocab.size(), 4 + 11 + 10);
  EXPECT_EQ(set.vocab.tokens[4], ".");  // the most frequent word
  for (const auto& p : set.train) {
    for (int64_t id : p.tgt) EXPECT_TRUE(id >= 4 && id < set.target_vocab);
    for (int64_t id : p.src) EXPECT_TRUE(id >= 4 && (id >= set.target_vocab || set.vocab.tokens[id] == "."));
  }
  // The same seed gives the same split; another seed another one; the test split never trains.
  auto again = data::load_pairs(path, o);
  EXPECT_EQ(again.test[7].source, set.test[7].source);
  EXPECT_EQ(again.fingerprint, set.fingerprint);
  o.split_seed = 2;
  auto other = data::load_pairs(path, o);
  EXPECT_NE(other.fingerprint, set.fingerprint);
  int same = 0;
  for (size_t i = 0; i < 30; ++i) same += other.test[i].source == set.test[i].source;
  EXPECT_LT(same, 10);
  // min_freq: a word seen once in training becomes <unk>.
  tu::write_text(path, pairs_text(300, 1) + "zebra .\tz\xC3\xA8" "bre .\n");
  o.split_seed = 1;
  auto rare = data::load_pairs(path, o);
  EXPECT_EQ(std::count(rare.vocab.tokens.begin(), rare.vocab.tokens.end(), "zebra"), 0);
  o.min_freq = 1;
  // Errors: one line each, naming the file.
  tu::write_text(path, "");
  EXPECT_NE(tu::error_of([&] { data::load_pairs(path, o); }).find("is empty"), std::string::npos);
  tu::write_text(path, "no tab here\n");
  EXPECT_NE(tu::error_of([&] { data::load_pairs(path, o); }).find(":1: 1 tab-separated field"), std::string::npos);
  tu::write_text(path, pairs_text(40, 1));
  EXPECT_NE(tu::error_of([&] { data::load_pairs(path, o); }).find("too few"), std::string::npos);
  EXPECT_NE(tu::error_of([&] { data::load_pairs(dir.path() + "/missing.txt", o); }).find("missing.txt"), std::string::npos);
}

// SentencePiece subwords on real pairs (the first 4000 lines of fra.txt): learned on the training split
// only, deterministic, the same three splits as the word tokenizer, text back exactly from ids, and
// stored in (and read back from) a checkpoint, so that a model translates without its data.
TEST(Pairs, SentencePieceSubwordsRoundTripAndTravelInCheckpoints) {
  if (!data::subwords_available()) GTEST_SKIP() << "built without SentencePiece";
  std::ifstream in(tu::shared_dir() + "/data/fra-eng/fra.txt");
  if (!in) GTEST_SKIP() << "../shared/data/fra-eng missing";
  tu::TempDir dir;
  const std::string path = dir.path() + "/fra.txt";
  {
    std::ofstream out(path);
    std::string line;
    for (int i = 0; i < 4000 && std::getline(in, line); ++i) out << line << "\n";
  }
  data::PairsOptions o;
  o.valid_pairs = 200;
  o.test_pairs = 300;
  auto words = data::load_pairs(path, o);
  o.tokenizer = data::Tokenizer::kSentencePiece;
  o.subword_vocab = 600;
  auto set = data::load_pairs(path, o);
  ASSERT_TRUE(set.vocab.subwords);
  EXPECT_NE(set.fingerprint, words.fingerprint);
  EXPECT_EQ(set.vocab.size(), 600);
  EXPECT_EQ(set.target_vocab, set.vocab.size());
  EXPECT_EQ(std::vector<std::string>(set.vocab.tokens.begin(), set.vocab.tokens.begin() + 4),
            (std::vector<std::string>{"<pad>", "<unk>", "<bos>", "<eos>"}));
  // The same split as the word tokenizer (step 3 counts words under both).
  for (const char* name : {"train", "valid", "test"}) {
    const auto &a = set.split(name), &b = words.split(name);
    ASSERT_EQ(a.size(), b.size()) << name;
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i].source + "|" + a[i].target, b[i].source + "|" + b[i].target) << name;
  }
  // Every training character is covered: no <unk>, ids of real pieces, text back exactly.
  size_t longer = 0;
  for (const auto& p : set.train) {
    for (const auto* ids : {&p.src, &p.tgt})
      for (int64_t id : *ids) ASSERT_TRUE(id >= 4 && id < set.vocab.size()) << p.source;
    ASSERT_EQ(data::decode_sentence(p.src, set.vocab), p.source);
    ASSERT_EQ(data::decode_sentence(p.tgt, set.vocab), p.target);
    ASSERT_EQ(data::encode_sentence(p.source, set.vocab), p.src);
    longer += p.src.size() > data::tokenize_sentence(p.source).size();
  }
  EXPECT_GT(longer, set.train.size() / 10);  // subwords: many sentences take more pieces than words
  // Deterministic: the same file and options give the same model bytes.
  auto again = data::load_pairs(path, o);
  EXPECT_EQ(again.vocab.subwords->proto(), set.vocab.subwords->proto());
  EXPECT_TRUE(data::same_vocabulary(again.vocab, set.vocab));
  EXPECT_FALSE(data::same_vocabulary(words.vocab, set.vocab));
  o.subword_vocab = 500;
  EXPECT_FALSE(data::same_vocabulary(data::load_pairs(path, o).vocab, set.vocab));
  // Through a checkpoint: the vocabulary comes back with a model that encodes the same ids.
  train::CheckpointWriter w("seq2seq", nlohmann::json::object(), set.vocab);
  w.put_int("x", 1);
  w.save(dir.path() + "/ck.pt");
  train::Checkpoint ck(dir.path() + "/ck.pt");
  ASSERT_TRUE(ck.vocab().subwords);
  EXPECT_TRUE(data::same_vocabulary(ck.vocab(), set.vocab));
  EXPECT_EQ(data::encode_sentence(set.test[5].source, ck.vocab()), set.test[5].src);
  // Stored parts that disagree are refused, naming the origin.
  auto tokens = data::vocab_to_text(set.vocab);
  EXPECT_NE(tu::error_of([&] { data::vocab_from_parts(tokens, "sentencepiece", "not a model", "X"); }).find("X (subword model): not a SentencePiece model"),
            std::string::npos);
  EXPECT_NO_THROW(data::vocab_from_parts(tokens, "sentencepiece", set.vocab.subwords->proto(), "X"));
  auto fewer = data::load_pairs(path, o);  // 500 pieces
  EXPECT_NE(tu::error_of([&] { data::vocab_from_parts(tokens, "sentencepiece", fewer.vocab.subwords->proto(), "X"); })
                .find("is not the pieces of its subword model"),
            std::string::npos);
}

// ---- models against the equations -------------------------------------------------------------------

Seq2SeqModelConfig tiny(Seq2SeqKind kind) {
  Seq2SeqModelConfig c;
  c.kind = kind;
  c.vocab_size = 23;
  c.target_vocab = 13;
  c.d_model = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_inner = 12;
  c.dropout = 0.3;  // off in eval mode: the references have none
  c.max_positions = 32;
  return c;
}

torch::Tensor linear(const torch::Tensor& x, const spanformer::nn::Linear& l) {
  auto y = torch::matmul(x, l->weight.t());
  return l->bias.defined() ? y + l->bias : y;
}

// One GRU layer's cell (PyTorch's gate order r, z, n): x (in), h (H) -> h'. `reverse`: the layer's
// backward direction of a bidirectional GRU.
torch::Tensor gru_cell(const torch::nn::GRUImpl& gru, int64_t layer, const torch::Tensor& x, const torch::Tensor& h,
                       bool reverse = false) {
  const int64_t H = h.size(0);
  auto p = gru.named_parameters();
  const char* suffix = reverse ? "_reverse" : "";
  auto wi = p[fmt::format("weight_ih_l{}{}", layer, suffix)], wh = p[fmt::format("weight_hh_l{}{}", layer, suffix)];
  auto bi = p[fmt::format("bias_ih_l{}{}", layer, suffix)], bh = p[fmt::format("bias_hh_l{}{}", layer, suffix)];
  auto gi = torch::mv(wi, x) + bi, gh = torch::mv(wh, h) + bh;  // (3H)
  auto r = torch::sigmoid(gi.narrow(0, 0, H) + gh.narrow(0, 0, H));
  auto z = torch::sigmoid(gi.narrow(0, H, H) + gh.narrow(0, H, H));
  auto n = torch::tanh(gi.narrow(0, 2 * H, H) + r * gh.narrow(0, 2 * H, H));
  return (1 - z) * n + z * h;
}

// Stacked GRU step: x (in), s (L, H) -> new s; returns the top layer's output.
torch::Tensor gru_step(const torch::nn::GRUImpl& gru, const torch::Tensor& x, torch::Tensor& s) {
  auto input = x;
  auto next = s.clone();
  for (int64_t l = 0; l < s.size(0); ++l) {
    next[l] = gru_cell(gru, l, input, s[l]);
    input = next[l];
  }
  s = next;
  return input;
}

torch::Tensor softmax_plain(const torch::Tensor& s) {
  auto e = torch::exp(s - s.max());
  return e / e.sum();
}

// Logits (T, Vt) of one sentence src (n), target input (T), from the recurrent model's weights.
torch::Tensor reference_rnn(models::RnnSeq2SeqImpl& m, const std::vector<int64_t>& src, const std::vector<int64_t>& tgt_in) {
  const auto& c = m.config();
  const int64_t H = c.d_model, L = c.n_layer;
  auto E = m.src_embed->weight;
  auto Et = c.share_embeddings ? E.narrow(0, 0, c.target_vocab) : m.tgt_embed->weight;
  auto s = torch::zeros({L, H}, torch::kDouble);
  torch::Tensor memory;  // (n, H)
  if (!c.bidirectional) {
    std::vector<torch::Tensor> outs;
    for (int64_t id : src) outs.push_back(gru_step(*m.encoder, E[id], s));
    memory = torch::stack(outs, 0);
  } else {  // per layer: forward over x_1..x_n, backward over x_n..x_1, both of H/2, concatenated
    const auto n = static_cast<int64_t>(src.size());
    auto x = E.index_select(0, torch::tensor(src, torch::kLong));  // (n, H)
    for (int64_t l = 0; l < L; ++l) {
      auto fwd = torch::zeros({n, H / 2}, torch::kDouble), bwd = torch::zeros({n, H / 2}, torch::kDouble);
      auto h = torch::zeros({H / 2}, torch::kDouble);
      for (int64_t j = 0; j < n; ++j) fwd[j] = h = gru_cell(*m.encoder, l, x[j], h);
      h = torch::zeros({H / 2}, torch::kDouble);
      for (int64_t j = n - 1; j >= 0; --j) bwd[j] = h = gru_cell(*m.encoder, l, x[j], h, true);
      x = torch::cat({fwd, bwd}, 1);
      s[l] = torch::cat({fwd[n - 1], bwd[0]});
    }
    memory = x;
  }
  auto last = c.bidirectional ? s[L - 1].clone() : memory[-1];
  auto feed = torch::zeros({H}, torch::kDouble);
  std::vector<torch::Tensor> logits;
  for (int64_t y : tgt_in) {
    auto e = Et[y];
    torch::Tensor h;
    if (c.kind == Seq2SeqKind::kGru) {
      h = gru_step(*m.decoder, torch::cat({e, last}), s);
    } else if (c.kind == Seq2SeqKind::kBahdanau) {
      auto p = m.attn->named_parameters();
      auto q = torch::mv(p["w_q.weight"], s[L - 1]);                                             // (H)
      auto k = torch::matmul(memory, p["w_k.weight"].t());                                       // (n, H)
      auto a = softmax_plain(torch::mv(torch::tanh(k + q), p["w_v.weight"].reshape({-1})));      // (n)
      auto ctx = torch::mv(memory.t(), a);                                                       // (H)
      auto previous = s[L - 1].clone();                                                          // s_{t-1}
      h = gru_step(*m.decoder, torch::cat({e, ctx}), s);
      if (c.deep_output) {  // t~ = U s_{t-1} + V e + C c + b, then the larger of each pair (2j, 2j+1)
        auto t = torch::mv(m.deep->weight, torch::cat({previous, e, ctx})) + m.deep->bias;  // (2H)
        h = torch::zeros({H}, torch::kDouble);
        for (int64_t j = 0; j < H; ++j) h[j] = torch::max(t[2 * j], t[2 * j + 1]);
      }
    } else {
      h = gru_step(*m.decoder, c.input_feeding ? torch::cat({e, feed}) : e, s);
      auto scores = c.score == attention::ScoreKind::kDot ? torch::mv(memory, h)
                                                          : torch::mv(memory, torch::mv(m.attn->named_parameters()["w"].t(), h));
      auto ctx = torch::mv(memory.t(), softmax_plain(scores));  // (H)
      h = torch::tanh(torch::mv(m.combine->weight, torch::cat({ctx, h})));
      feed = h;
    }
    logits.push_back(c.share_embeddings ? torch::mv(Et, h) + m.out_bias : torch::mv(m.out->weight, h) + m.out->bias);
  }
  return torch::stack(logits, 0);  // (T, Vt)
}

using tu::layer_norm;

// Multi-head attention of x (N, H) over m (C, H) by its formula; `causal` keeps keys j <= i.
torch::Tensor mha(attention::MultiHeadAttentionImpl& a, const torch::Tensor& x, const torch::Tensor& m, bool causal) {
  const int64_t H = x.size(1), K = a.options().heads, D = H / K, N = x.size(0), C = m.size(0);
  auto q = linear(x, a.w_q), k = linear(m, a.w_k), v = linear(m, a.w_v);
  auto out = torch::zeros({N, H}, torch::kDouble);
  for (int64_t h = 0; h < K; ++h)
    for (int64_t i = 0; i < N; ++i) {
      auto s = torch::mv(k.narrow(1, h * D, D), q[i].narrow(0, h * D, D)) / std::sqrt(static_cast<double>(D));  // (C)
      const int64_t keys = causal ? i + 1 : C;
      auto w = softmax_plain(s.narrow(0, 0, keys));
      out[i].narrow(0, h * D, D).copy_(torch::mv(v.narrow(0, 0, keys).narrow(1, h * D, D).t(), w));
    }
  return linear(out, a.w_o);
}

// Logits (T, Vt) of one sentence from the Transformer's weights.
torch::Tensor reference_transformer(models::TransformerSeq2SeqImpl& m, const std::vector<int64_t>& src,
                                    const std::vector<int64_t>& tgt_in) {
  const auto& c = m.config();
  const int64_t H = c.d_model;
  auto position = [&](int64_t n) {  // P[p, 2i] = sin(p / 10000^(2i/H)), P[p, 2i+1] = cos(...)
    auto P = torch::zeros({n, H}, torch::kDouble);
    for (int64_t p = 0; p < n; ++p)
      for (int64_t i = 0; i < H / 2; ++i) {
        const double angle = static_cast<double>(p) / std::pow(10000.0, 2.0 * static_cast<double>(i) / static_cast<double>(H));
        P[p][2 * i] = std::sin(angle);
        P[p][2 * i + 1] = std::cos(angle);
      }
    return P.to(torch::kFloat).to(torch::kDouble);  // the model's table is float32 (shared with GPT)
  };
  auto E = m.src_embed->weight;
  auto Et = c.share_embeddings ? E.narrow(0, 0, c.target_vocab) : m.tgt_embed->weight;
  auto ids = [](const std::vector<int64_t>& v) { return torch::tensor(v, torch::kLong); };
  auto sub = [&](const torch::Tensor& x, const torch::nn::LayerNorm& n, const std::function<torch::Tensor(const torch::Tensor&)>& f) {
    return c.pre_norm ? x + f(layer_norm(x, n)) : layer_norm(x + f(x), n);
  };
  auto ffn = [](models::TransformerLayerImpl& l) {
    return [&l](const torch::Tensor& y) { return linear(torch::relu(linear(y, l.fc1)), l.fc2); };
  };
  auto x = E.index_select(0, ids(src)) * std::sqrt(static_cast<double>(H)) + position(static_cast<int64_t>(src.size()));
  for (const auto& mod : *m.encoder) {
    auto& l = *mod->as<models::TransformerLayer>();
    x = sub(x, l.norm1, [&](const torch::Tensor& y) { return mha(*l.self_attn, y, y, false); });
    x = sub(x, l.norm2, ffn(l));
  }
  if (c.pre_norm) x = layer_norm(x, m.enc_norm);
  auto y = Et.index_select(0, ids(tgt_in)) * std::sqrt(static_cast<double>(H)) + position(static_cast<int64_t>(tgt_in.size()));
  for (const auto& mod : *m.decoder) {
    auto& l = *mod->as<models::TransformerLayer>();
    y = sub(y, l.norm1, [&](const torch::Tensor& u) { return mha(*l.self_attn, u, u, true); });
    y = sub(y, l.norm3, [&](const torch::Tensor& u) { return mha(*l.cross_attn, u, x, false); });
    y = sub(y, l.norm2, ffn(l));
  }
  if (c.pre_norm) y = layer_norm(y, m.dec_norm);
  return c.share_embeddings ? torch::matmul(y, Et.t()) + m.out_bias : linear(y, m.out);
}

struct Batch {
  std::vector<std::vector<int64_t>> src, tgt_in;
  torch::Tensor x, len, y;
};
Batch random_batch(const Seq2SeqModelConfig& c) {
  Batch b;
  const std::vector<int64_t> src_lens = {5, 2, 7}, tgt_lens = {4, 6, 3};
  torch::manual_seed(3);
  for (size_t i = 0; i < src_lens.size(); ++i) {
    auto s = torch::randint(4, c.vocab_size, {src_lens[i]}, torch::kLong);
    auto t = torch::randint(4, c.target_vocab, {tgt_lens[i]}, torch::kLong);
    b.src.emplace_back(s.data_ptr<int64_t>(), s.data_ptr<int64_t>() + s.numel());
    b.tgt_in.emplace_back(1, data::kBosId);
    b.tgt_in.back().insert(b.tgt_in.back().end(), t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  }
  auto pad = [](const std::vector<std::vector<int64_t>>& rows) {
    size_t w = 0;
    for (const auto& r : rows) w = std::max(w, r.size());
    auto out = torch::zeros({static_cast<int64_t>(rows.size()), static_cast<int64_t>(w)}, torch::kLong);
    for (size_t i = 0; i < rows.size(); ++i)
      for (size_t j = 0; j < rows[i].size(); ++j) out[static_cast<int64_t>(i)][static_cast<int64_t>(j)] = rows[i][j];
    return out;
  };
  b.x = pad(b.src);
  b.y = pad(b.tgt_in);
  b.len = torch::tensor(src_lens, torch::kLong);
  return b;
}

void expect_model_matches_reference(Seq2SeqModelConfig c) {
  SCOPED_TRACE(fmt::format("kind {} pre_norm {} shared {} score {} feeding {} bidirectional {}", seq2seq_kind_name(c.kind),
                           c.pre_norm, c.share_embeddings, attention::score_kind_name(c.score), c.input_feeding,
                           c.bidirectional));
  torch::manual_seed(1);
  auto net = models::make_seq2seq(c);
  net.module->to(torch::kDouble);
  net.module->eval();
  torch::NoGradGuard no_grad;
  auto b = random_batch(c);
  std::vector<torch::Tensor> attention;
  auto logits = net.model->translate_logits(b.x, b.len, b.y, &attention);  // (B, T, Vt)
  ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{3, 7, c.target_vocab}));
  for (size_t i = 0; i < b.src.size(); ++i) {
    auto ref = c.recurrent() ? reference_rnn(*std::dynamic_pointer_cast<models::RnnSeq2SeqImpl>(net.module), b.src[i], b.tgt_in[i])
                             : reference_transformer(*std::dynamic_pointer_cast<models::TransformerSeq2SeqImpl>(net.module),
                                                     b.src[i], b.tgt_in[i]);
    const auto T = static_cast<int64_t>(b.tgt_in[i].size());
    EXPECT_LT((logits[static_cast<int64_t>(i)].narrow(0, 0, T) - ref).abs().max().item<double>(), 1e-10) << "sentence " << i;
  }
  // Attention weights: each row sums to 1 over the sentence's own source, 0 beyond it.
  if (c.kind != Seq2SeqKind::kGru) {
    ASSERT_FALSE(attention.empty());
    auto a = attention[0];  // (B, T, S) or (B, K, T, S)
    if (a.dim() == 4) a = a.select(1, 0);
    for (int64_t i = 0; i < 3; ++i) {
      const int64_t n = b.len[i].item<int64_t>();
      EXPECT_LT((a[i].narrow(1, 0, n).sum(-1) - 1).abs().max().item<double>(), 1e-12);
      if (n < a.size(2)) EXPECT_EQ(a[i].narrow(1, n, a.size(2) - n).abs().max().item<double>(), 0.0);
    }
  }
  // Step by step with carried state = teacher forcing (log-probabilities).
  auto state = net.model->start(b.x, b.len);
  auto logp = torch::log_softmax(logits, -1);
  for (int64_t t = 0; t < b.y.size(1); ++t) {
    auto step = net.model->step(state, b.y.select(1, t));  // (B, Vt)
    EXPECT_LT((step - logp.select(1, t)).abs().max().item<double>(), 1e-10) << "step " << t;
  }
}

TEST(Seq2SeqModels, EveryKindMatchesItsEquations) {
  for (auto kind : {Seq2SeqKind::kGru, Seq2SeqKind::kBahdanau, Seq2SeqKind::kLuong, Seq2SeqKind::kTransformer})
    for (bool shared : {false, true}) {
      auto c = tiny(kind);
      c.share_embeddings = shared;
      expect_model_matches_reference(c);
    }
  auto c = tiny(Seq2SeqKind::kLuong);
  c.score = attention::ScoreKind::kDot;
  c.input_feeding = false;
  expect_model_matches_reference(c);
  c = tiny(Seq2SeqKind::kTransformer);
  c.pre_norm = true;
  expect_model_matches_reference(c);
  // Bidirectional encoders: the padded sentences (lengths 5, 2 of 7) must be read backwards from their
  // own last token, not from the padding.
  for (auto kind : {Seq2SeqKind::kGru, Seq2SeqKind::kBahdanau, Seq2SeqKind::kLuong}) {
    c = tiny(kind);
    c.bidirectional = true;
    expect_model_matches_reference(c);
  }
  // Bahdanau's deep output (maxout over s_{t-1}, y_{t-1} and c_t), with one and two tables.
  for (bool shared : {false, true}) {
    c = tiny(Seq2SeqKind::kBahdanau);
    c.deep_output = true;
    c.share_embeddings = shared;
    expect_model_matches_reference(c);
  }
}

// ---- decoding ---------------------------------------------------------------------------------------

TEST(Seq2SeqDecoding, BeamSearchFindsTheExhaustiveOptimum) {
  for (auto kind : {Seq2SeqKind::kLuong, Seq2SeqKind::kTransformer})
    for (double alpha : {0.0, 1.0}) {
      auto c = tiny(kind);
      c.target_vocab = 7;  // specials + 3 words
      torch::manual_seed(5);
      auto net = models::make_seq2seq(c);
      net.module->to(torch::kDouble);
      net.module->eval();
      torch::NoGradGuard no_grad;
      auto src = torch::tensor({{5, 9}}, torch::kLong), len = torch::tensor({2}, torch::kLong);
      models::DecodeOptions o;
      o.max_extra = 1;  // at most 3 tokens
      o.length_penalty = alpha;
      // Every output: tokens from {unk, w4, w5, w6}, ending in <eos> or cut at 3 tokens.
      double best = -1e300;
      std::vector<int64_t> best_tokens;
      std::function<void(std::vector<int64_t>)> visit = [&](std::vector<int64_t> prefix) {
        for (int64_t y : {int64_t{3}, int64_t{1}, int64_t{4}, int64_t{5}, int64_t{6}}) {
          auto seq = prefix;
          seq.push_back(y);
          const bool finished = y == data::kEosId || seq.size() == 3;
          if (!finished) {
            visit(seq);
            continue;
          }
          std::vector<int64_t> in{data::kBosId};
          in.insert(in.end(), seq.begin(), seq.end() - 1);
          auto logp = torch::log_softmax(net.model->translate_logits(src, len, torch::tensor(in, torch::kLong).unsqueeze(0)), -1)[0];
          double total = 0;
          for (size_t t = 0; t < seq.size(); ++t) total += logp[static_cast<int64_t>(t)][seq[t]].item<double>();
          std::vector<int64_t> tokens(seq.begin(), seq.end() - (y == data::kEosId ? 1 : 0));
          const double score = total / std::pow((5.0 + static_cast<double>(tokens.size()) + 1) / 6.0, alpha);
          if (score > best) best = score, best_tokens = tokens;
        }
      };
      visit({});
      o.beam = 64;
      auto h = models::decode(*net.model, src, len, o)[0];
      EXPECT_EQ(h.tokens, best_tokens) << seq2seq_kind_name(kind) << " alpha " << alpha;
      EXPECT_NEAR(h.score, best, 1e-10);
      EXPECT_EQ(h.attention.size(0), static_cast<int64_t>(h.tokens.size()) + (h.tokens.size() < 3 ? 1 : 0));
      // Greedy: each token the argmax, its log-probability the teacher-forced one.
      o.beam = 1;
      auto g = models::decode(*net.model, src, len, o)[0];
      std::vector<int64_t> in{data::kBosId};
      in.insert(in.end(), g.tokens.begin(), g.tokens.end());
      auto logp = torch::log_softmax(net.model->translate_logits(src, len, torch::tensor(in, torch::kLong).unsqueeze(0)), -1)[0];
      double total = 0;
      for (size_t t = 0; t < in.size(); ++t) {
        const int64_t y = t < g.tokens.size() ? g.tokens[t] : data::kEosId;
        if (t == g.tokens.size() && g.tokens.size() == 3) break;  // cut at the limit: no <eos>
        auto row = logp[static_cast<int64_t>(t)].clone();
        row[data::kPadId] = row[data::kBosId] = -INFINITY;
        EXPECT_EQ(row.argmax().item<int64_t>(), y);
        total += logp[static_cast<int64_t>(t)][y].item<double>();
      }
      EXPECT_NEAR(g.logprob, total, 1e-10);
      EXPECT_GE(h.score, g.score - 1e-12);
    }
}

// ---- the family on the engine -------------------------------------------------------------------------

nlohmann::json tiny_run(const std::string& data) {
  Seq2SeqConfig c;
  c.model.kind = Seq2SeqKind::kTransformer;
  c.model.d_model = 16;
  c.model.n_layer = 1;
  c.model.n_head = 2;
  c.model.d_inner = 32;
  c.model.beam = 2;
  c.data.max_length = 8;
  c.data.valid_pairs = 20;
  c.data.test_pairs = 20;
  c.train.data = data;
  c.train.batch_size = 16;
  c.train.nb_steps = 12;
  c.train.eval_interval = 6;
  c.train.lr_warmup = 4;
  c.train.eval_batch_size = 8;
  c.train.threads = 1;
  return to_json(c);
}

// train.amp = bf16 (tests/util.h): the Transformer and a recurrent kind with attention.
TEST(Seq2SeqTraining, MixedPrecisionBf16TrainsAndResumesBitForBit) {
  for (auto kind : {Seq2SeqKind::kTransformer, Seq2SeqKind::kBahdanau}) {
    SCOPED_TRACE(seq2seq_kind_name(kind));
    tu::TempDir dir;
    const std::string data = dir.path() + "/pairs.txt";
    tu::write_text(data, pairs_text(400, 7));
    auto config = tiny_run(data);
    config["model"]["kind"] = seq2seq_kind_name(kind);
    tu::expect_bf16_run(config, dir.path(), 5, 0.03);
  }
}

// Under both tokenizers (the subword model is learned again by the resumed run: it must be the same).
TEST(Seq2SeqTraining, ResumedRunEndsWhereAnUninterruptedOneDoes) {
  for (auto tokenizer : {data::Tokenizer::kWords, data::Tokenizer::kSentencePiece}) {
    if (tokenizer == data::Tokenizer::kSentencePiece && !data::subwords_available()) continue;
    SCOPED_TRACE(data::tokenizer_name(tokenizer));
    tu::TempDir dir;
    const std::string data = dir.path() + "/pairs.txt";
    tu::write_text(data, pairs_text(400, 7));
    auto config = tiny_run(data);
    config["data"]["tokenizer"] = data::tokenizer_name(tokenizer);
    config["data"]["subword_vocab"] = 40;
    tu::run_family(config, dir.path() + "/full");
    tu::run_family(config, dir.path() + "/split", false, 5);  // stops inside an epoch (24 batches of 16)
    auto resumed = tu::run_family(config, dir.path() + "/split", true);
    EXPECT_EQ(resumed.steps, 12);
    tu::expect_same_checkpoint(dir.path() + "/full/checkpoint.pt", dir.path() + "/split/checkpoint.pt");
    EXPECT_EQ(data::vocab_level(train::Checkpoint(dir.path() + "/full/checkpoint.pt").vocab()),
              std::string(tokenizer == data::Tokenizer::kWords ? "word" : "sentencepiece"));
    // The same validation figures (BLEU included) at both interval ends.
    auto records = [&](const std::string& run) {
      std::vector<nlohmann::json> out;
      std::istringstream in(tu::read_file_or_empty(dir.path() + "/" + run + "/log.jsonl"));
      for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
      return out;
    };
    auto full = records("full"), split = records("split");
    ASSERT_EQ(full.size(), 2u);
    ASSERT_EQ(split.size(), 2u);
    for (size_t i = 0; i < 2; ++i)
      for (const char* key : {"valid_loss", "valid_acc", "valid_bleu"}) EXPECT_EQ(full[i][key], split[i][key]) << key;
    EXPECT_EQ(full[1]["train_loss"], split[1]["train_loss"]);  // the first interval's mean covers the session only
  }
}
}  // namespace
