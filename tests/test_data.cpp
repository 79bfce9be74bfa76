// Data preparation, token files, streams, vocabularies and download helpers, on real text.
#include <gtest/gtest.h>
#include "spanformer/build_options.h"
#if SPANFORMER_WITH_LIBZIP
#include <zip.h>
#endif

#include <fstream>

#include "spanformer/data/corpus.h"
#include "spanformer/data/download.h"
#include "spanformer/util/error.h"
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
  data::KnownDataset fake = data::known_dataset("enwik8");
  fake.file_bytes = static_cast<int64_t>(payload.size());
  message = error_of([&] { data::verify_dataset_file(fake, tmp.file("enwik8")); });
  EXPECT_NE(message.find("md5 checksum mismatch"), std::string::npos) << message;
  fake.file_md5 = data::file_digest(tmp.file("enwik8"), "md5");
  fake.file_sha256 = data::file_digest(tmp.file("enwik8"), "sha256");
  EXPECT_EQ(error_of([&] { data::verify_dataset_file(fake, tmp.file("enwik8")); }), "");
}
#endif
