// Data preparation, token files, streams, vocabularies and download helpers, on real text.
#include <gtest/gtest.h>
#include "spanformer/build_options.h"
#if SPANFORMER_WITH_LIBZIP
#include <zip.h>
#endif

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "spanformer/data/corpus.h"
#include "spanformer/data/download.h"
#include "spanformer/data/words.h"
#include "spanformer/util/error.h"
#include "spanformer/viz/span_plot.h"
#include "util.h"

using namespace spanformer;
using tu::error_of;

namespace {
std::vector<int64_t> read_all(const data::TokenFile& f) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < f.size(); ++i) v.push_back(f.at(i));
  return v;
}
}  // namespace

TEST(Data, DickensPreparationMatchesTheReferenceIds) {
  // ../shared/reference/adaptive-span-tiny holds the ids the Python reference produced.
  const std::string ref = tu::shared_dir() + "/reference/adaptive-span-tiny";
  tu::TempDir tmp;
  data::PrepareOptions options;
  options.crlf_to_lf = true;
  auto stats = data::prepare_bytes(tu::shared_dir() + "/data/dickens.txt", tmp.path(), options);
  EXPECT_EQ(stats.input_bytes, 10192446);
  EXPECT_EQ(read_file(tmp.file("vocab.txt")), read_file(ref + "/vocab.txt"));
  auto corpus = data::load_corpus(tmp.path());
  for (const char* split : {"valid", "test"}) {
    std::string want = read_file(ref + "/" + split + ".ids.u8");
    auto got = read_all(corpus.split(split));
    ASSERT_EQ(got.size(), want.size()) << split;
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], static_cast<uint8_t>(want[i])) << split << " " << i;
  }
  // 9,991,663 bytes after CRLF -> LF; v = 499,583; train = n - 2v bytes + the closing <eos>.
  EXPECT_EQ(corpus.train->size(), 9991663 - 2 * 499583 + 1);
}

TEST(Data, SplitsVocabularyOrderAndRoundTrip) {
  tu::TempDir tmp;
  std::string text;
  for (int i = 0; i < 50; ++i) text += "ab\ncd " + std::to_string(i % 7) + "\r\n";
  text += "ZZ";  // only in test: dropped
  tu::write_text(tmp.file("in.txt"), text);
  auto stats = data::prepare_bytes(tmp.file("in.txt"), tmp.path(), {});
  const int64_t n = static_cast<int64_t>(text.size()), v = n / 20;
  EXPECT_EQ(stats.train_tokens, n - 2 * v + 1);
  EXPECT_EQ(stats.valid_tokens, v + 1);
  EXPECT_EQ(stats.dropped, 2);
  auto corpus = data::load_corpus(tmp.path());
  // First appearance order: 'a' 'b' <eos> 'c' 'd' ' ' ...
  EXPECT_EQ(corpus.vocab.tokens[0], "97");
  EXPECT_EQ(corpus.vocab.tokens[2], "<eos>");
  // Decoding the train split gives back the text (with the closing <eos> as a newline).
  std::string decoded;
  for (auto id : read_all(*corpus.train)) decoded += corpus.vocab.decode(id);
  EXPECT_EQ(decoded, text.substr(0, static_cast<size_t>(n - 2 * v)) + "\n");
}

TEST(Data, CrlfConversionKeepsPairsTogether) {
  tu::TempDir tmp;
  std::string text;
  for (int i = 0; i < 40; ++i) text += "line " + std::to_string(i) + "\r\n";
  tu::write_text(tmp.file("in.txt"), text);
  data::PrepareOptions options;
  options.crlf_to_lf = true;
  data::prepare_bytes(tmp.file("in.txt"), tmp.path(), options);
  auto corpus = data::load_corpus(tmp.path());
  std::string all;
  for (const char* s : {"train", "valid", "test"}) {
    std::string part;
    for (auto id : read_all(corpus.split(s))) part += corpus.vocab.decode(id);
    all += part.substr(0, part.size() - 1);  // drop each split's closing <eos>
  }
  std::string lf;
  for (char c : text)
    if (c != '\r') lf += c;
  EXPECT_EQ(all, lf);
  EXPECT_EQ(corpus.vocab.byte_to_id()['\r'], -1);
}

TEST(Data, StreamsFollowTheReferenceBatchLayout) {
  tu::TempDir tmp;
  std::vector<int64_t> ids;
  for (int i = 0; i < 103; ++i) ids.push_back(i % 50);
  data::write_tokens(tmp.file("t.bin"), ids, 50);
  data::TokenFile file(tmp.file("t.bin"));
  data::Streams streams(file, 4);  // S = 25, the last 3 tokens dropped
  EXPECT_EQ(streams.length(), 25);
  std::vector<int64_t> x(4 * 5), y(4 * 5);
  streams.block(10, 5, x.data(), y.data());
  for (int b = 0; b < 4; ++b)
    for (int t = 0; t < 5; ++t) {
      EXPECT_EQ(x[b * 5 + t], ids[b * 25 + 10 + t]);
      EXPECT_EQ(y[b * 5 + t], ids[b * 25 + 11 + t]);
    }
}

TEST(Data, BadFilesGiveClearErrors) {
  tu::TempDir tmp;
  EXPECT_NE(error_of([&] { data::prepare_bytes(tmp.file("missing.txt"), tmp.path(), {}); }).find("file not found"), std::string::npos);
  tu::write_text(tmp.file("empty.txt"), "");
  EXPECT_NE(error_of([&] { data::prepare_bytes(tmp.file("empty.txt"), tmp.path(), {}); }).find("is empty"), std::string::npos);
  tu::write_text(tmp.file("empty.bin"), "");
  EXPECT_NE(error_of([&] { data::TokenFile f(tmp.file("empty.bin")); }).find("is empty"), std::string::npos);
  tu::write_text(tmp.file("foreign.bin"), "this is not a token file at all");
  EXPECT_NE(error_of([&] { data::TokenFile f(tmp.file("foreign.bin")); }).find("not a spanformer token file"), std::string::npos);
  data::write_tokens(tmp.file("ok.bin"), {1, 2, 3, 4}, 5);
  std::string bytes = read_file(tmp.file("ok.bin"));
  tu::write_text(tmp.file("truncated.bin"), bytes.substr(0, bytes.size() - 1));
  EXPECT_NE(error_of([&] { data::TokenFile f(tmp.file("truncated.bin")); }).find("truncated"), std::string::npos);
  bytes[bytes.size() - 1] = 9;  // id 9 >= vocab 5
  tu::write_text(tmp.file("badid.bin"), bytes);
  EXPECT_NE(error_of([&] { data::TokenFile f(tmp.file("badid.bin")); }).find("corrupt"), std::string::npos);
  tu::write_text(tmp.file("vocab.txt"), "97\nxyz\n");
  EXPECT_NE(error_of([&] { data::read_vocab(tmp.file("vocab.txt")); }).find("line 2"), std::string::npos);
  EXPECT_NE(error_of([&] { data::load_corpus(tmp.file("nowhere")); }).find("prepared data directory"), std::string::npos);
}

TEST(Download, DigestsMatchThePublishedChecksum) {
  // sha256 of dickens.txt from ../shared/data/README.md.
  EXPECT_EQ(data::file_digest(tu::shared_dir() + "/data/dickens.txt", "sha256"),
            "b24c37886142e11d0ee687db6ab06f936207aa7f2ea1fd1d9a36763c7a507e6a");
  tu::TempDir tmp;
  tu::write_text(tmp.file("abc"), "abc");
  EXPECT_EQ(data::file_digest(tmp.file("abc"), "md5"), "900150983cd24fb0d6963f7d28e17f72");
  EXPECT_EQ(data::file_digest(tmp.file("abc"), "sha1"), "a9993e364706816aba3e25717850c26c9cd0d89d");
}

#if SPANFORMER_WITH_LIBZIP
TEST(Download, FetchUnzipAndVerifyLocalFiles) {
  tu::TempDir tmp;
  // A zip holding a fake "enwik8" member, served through a file:// address.
  const std::string payload = "not the real enwik8\n";
  int err = 0;
  zip_t* archive = zip_open(tmp.file("enwik8.zip").c_str(), ZIP_CREATE | ZIP_TRUNCATE, &err);
  ASSERT_NE(archive, nullptr);
  zip_source_t* source = zip_source_buffer(archive, payload.data(), payload.size(), 0);
  ASSERT_GE(zip_file_add(archive, "enwik8", source, ZIP_FL_OVERWRITE), 0);
  ASSERT_EQ(zip_close(archive), 0);

  data::download("file://" + tmp.file("enwik8.zip"), tmp.file("copy.zip"));
  EXPECT_EQ(read_file(tmp.file("copy.zip")), read_file(tmp.file("enwik8.zip")));
  data::unzip_member(tmp.file("copy.zip"), "enwik8", tmp.file("enwik8"));
  EXPECT_EQ(read_file(tmp.file("enwik8")), payload);
  EXPECT_NE(error_of([&] { data::unzip_member(tmp.file("copy.zip"), "text8", tmp.file("x")); }).find("no member"), std::string::npos);
  EXPECT_NE(error_of([&] { data::download("file://" + tmp.file("nothing.zip"), tmp.file("y.zip")); }).find("failed"), std::string::npos);
  EXPECT_FALSE(file_exists(tmp.file("y.zip"))) << "a failed download must leave no file";

  // The whole `data get` with the fake file: refused by the size/checksum check, nothing prepared.
  auto message = error_of([&] { data::get_dataset("enwik8", tmp.file("out"), "file://" + tmp.file("enwik8.zip")); });
  EXPECT_NE(message.find("expected 100000000"), std::string::npos) << message;
  EXPECT_FALSE(file_exists(tmp.file("out/train.bin")));

  // A file of the right size but wrong content fails on the checksum.
  data::DatasetFile fake = data::known_dataset("enwik8").files[0];
  fake.bytes = static_cast<int64_t>(payload.size());
  message = error_of([&] { data::verify_file(fake, tmp.file("enwik8")); });
  EXPECT_NE(message.find("md5 checksum mismatch"), std::string::npos) << message;
  fake.digests = {{"md5", data::file_digest(tmp.file("enwik8"), "md5")},
                  {"sha256", data::file_digest(tmp.file("enwik8"), "sha256")}};
  EXPECT_EQ(error_of([&] { EXPECT_TRUE(data::verify_file(fake, tmp.file("enwik8"))); }), "");
}

namespace {
// Writes a zip with the given (member, contents) pairs.
void write_zip(const std::string& path, const std::vector<std::pair<std::string, std::string>>& members) {
  int err = 0;
  zip_t* archive = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &err);
  ASSERT_NE(archive, nullptr);
  for (const auto& [name, text] : members) {
    zip_source_t* source = zip_source_buffer(archive, text.data(), text.size(), 0);
    ASSERT_GE(zip_file_add(archive, name.c_str(), source, ZIP_FL_OVERWRITE), 0);
  }
  ASSERT_EQ(zip_close(archive), 0);
}
}  // namespace

TEST(Download, WikiText2FromAMirrorIsVerifiedAndPreparedAsWords) {
  // A mirror zip laid out as wikitext-2-v1.zip, made from the published valid and test files (the training
  // split is not on these machines: the valid text stands in for it, and has no published checksum).
  tu::TempDir tmp;
  const std::string dir = tu::shared_dir() + "/data/wikitext-2/";
  const std::string valid = read_file(dir + "wiki.valid.tokens"), test = read_file(dir + "wiki.test.tokens");
  write_zip(tmp.file("wt2.zip"), {{"wikitext-2/wiki.train.tokens", valid},
                                  {"wikitext-2/wiki.valid.tokens", valid},
                                  {"wikitext-2/wiki.test.tokens", test}});
  data::get_dataset("wikitext-2", tmp.file("out"), "file://" + tmp.file("wt2.zip"));
  EXPECT_EQ(read_file(tmp.file("out/wiki.test.tokens")), test);

  // Same directory as `data words` with the reference's WikiText-2 rule (vocabulary from all splits).
  data::WordPrepareOptions words;
  words.train = words.valid = dir + "wiki.valid.tokens";
  words.test = dir + "wiki.test.tokens";
  words.vocab_from_all = true;
  auto stats = data::prepare_words(words, tmp.file("direct"));
  EXPECT_EQ(stats.valid_tokens, 217646) << "one <eos> per line, as ../shared/data/README.md counts";
  EXPECT_EQ(stats.test_tokens, 245569);
  for (const char* f : {"words.txt", "train.bin", "valid.bin", "test.bin"})
    EXPECT_EQ(read_file(tmp.file(std::string("out/") + f)), read_file(tmp.file(std::string("direct/") + f))) << f;

  // One changed byte in the test split: refused on the published sha256, nothing prepared.
  std::string bad = test;
  bad[1000] = bad[1000] == 'a' ? 'b' : 'a';
  write_zip(tmp.file("bad.zip"), {{"wikitext-2/wiki.train.tokens", valid},
                                  {"wikitext-2/wiki.valid.tokens", valid},
                                  {"wikitext-2/wiki.test.tokens", bad}});
  auto message = error_of([&] { data::get_dataset("wikitext-2", tmp.file("bad"), "file://" + tmp.file("bad.zip")); });
  EXPECT_NE(message.find("sha256 checksum mismatch for " + tmp.file("bad/wiki.test.tokens")), std::string::npos)
      << message;
  EXPECT_FALSE(file_exists(tmp.file("bad/train.bin")));
  // A zip without the expected members names the missing one.
  write_zip(tmp.file("empty.zip"), {{"readme.txt", "x"}});
  message = error_of([&] { data::get_dataset("wikitext-103", tmp.file("e"), "file://" + tmp.file("empty.zip")); });
  EXPECT_NE(message.find("no member 'wikitext-103/wiki.train.tokens'"), std::string::npos) << message;
}

TEST(Download, PennTreebankFilesAreFetchedOneByOneAndChecked) {
  // PTB has no archive: --url names the folder; files not matching the published md5 are refused.
  tu::TempDir tmp;
  make_dirs(tmp.file("mirror"));
  for (const char* f : {"ptb.train.txt", "ptb.valid.txt", "ptb.test.txt"})
    tu::write_text(tmp.file(std::string("mirror/") + f), " the cat sat \n");
  auto message = error_of([&] { data::get_dataset("ptb", tmp.file("out"), "file://" + tmp.file("mirror")); });
  EXPECT_NE(message.find("md5 checksum mismatch for " + tmp.file("out/ptb.train.txt")), std::string::npos) << message;
  EXPECT_NE(message.find("f26c4b92c5fdc7b3f8c7cdcb991d8420"), std::string::npos) << message;
  EXPECT_EQ(read_file(tmp.file("out/ptb.valid.txt")), " the cat sat \n") << "all three files were fetched";
  EXPECT_FALSE(file_exists(tmp.file("out/train.bin")));
  EXPECT_NE(error_of([&] { data::known_dataset("wikitext2"); }).find("known: enwik8, text8, wikitext-2"), std::string::npos);
}
#endif

#if SPANFORMER_WITH_CAIRO
TEST(Pictures, SpanLayoutSwitchesToTheHeatMapBeyond32Heads) {
  // 24 layers x 8 heads (a large model's shape) draws one layers x heads heat map; 4 x 8 keeps the curves.
  tu::TempDir tmp;
  viz::SpanPlotOptions options;
  options.attn_span = 8192;
  auto spans_of = [](size_t layers, size_t heads) {
    std::vector<std::vector<double>> s(layers, std::vector<double>(heads));
    for (size_t l = 0; l < layers; ++l)
      for (size_t k = 0; k < heads; ++k) s[l][k] = std::pow(2.0, static_cast<double>((l + k) % 14));
    return s;
  };
  viz::write_span_plot(tmp.file("big.svg"), spans_of(24, 8), options);
  viz::write_span_plot(tmp.file("small.svg"), spans_of(4, 8), options);
  auto big = nlohmann::json::parse(read_file(tmp.file("big.json")));
  EXPECT_EQ(big["layout"], "grid");
  EXPECT_EQ(big["spans"].size(), 24u);
  EXPECT_EQ(nlohmann::json::parse(read_file(tmp.file("small.json")))["layout"], "curves");
  EXPECT_NE(read_file(tmp.file("big.svg")).find("<svg"), std::string::npos);
  options.layout = viz::SpanLayout::kGrid;
  viz::write_span_plot(tmp.file("forced.png"), spans_of(2, 2), options);
  EXPECT_EQ(nlohmann::json::parse(read_file(tmp.file("forced.json")))["layout"], "grid");
  EXPECT_NE(error_of([&] { viz::parse_span_layout("bars"); }).find("auto, curves or grid"), std::string::npos);
  std::vector<std::vector<double>> ragged{{1.0, 2.0}, {1.0}};
  EXPECT_NE(error_of([&] { viz::write_span_plot(tmp.file("r.png"), ragged, options); }).find("different numbers of heads"),
            std::string::npos);
}
#endif
