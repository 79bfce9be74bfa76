// Byte-level corpora: preparation, compact token files, and the stream layout used for training.
//
// Preparation follows the reference (facebookresearch/adaptive-span, prep_enwik8.py + data.py):
// every byte is a token, the newline byte becomes `<eos>`, every split ends with one extra `<eos>`,
// ids are given in order of first appearance in the train split, and bytes of valid/test that never
// occur in train are dropped. So a model trained by the reference applies to our files directly.
//
// Splits: train / valid / test = the first n - 2v / next v / last v bytes with v = floor(n / 20):
// exactly the standard 90M / 5M / 5M split for enwik8 and text8 (n = 100M), and 90/5/5 for any file.
//
// Token file (train.bin, valid.bin, test.bin): a 24-byte header
//     "SPFTOK01" | uint32 bytes_per_token (1, 2 or 4) | uint32 vocab_size | uint64 count
// then `count` little-endian token ids. Memory-mapped at train time, never loaded whole.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "spanformer/util/io.h"

namespace spanformer::data {

inline constexpr const char* kEos = "<eos>";

class SubwordModel;  // data/subwords.h
class ByteBpe;       // data/byte_bpe.h

// Token strings: "<eos>" or the decimal value of a byte ("97" is 'a'), saved as vocab.txt; or, for
// word-level data (data/words.h), words saved as words.txt; or SentencePiece pieces (data/subwords.h),
// word_level and with the model that makes them; or GPT-2's byte-level BPE tokens (data/byte_bpe.h), with
// the tokenizer that makes them (a GPT-2 imported with its tokenizer).
struct Vocab {
  std::vector<std::string> tokens;  // id -> token
  bool word_level = false;
  std::shared_ptr<const SubwordModel> subwords;  // set for SentencePiece vocabularies
  std::shared_ptr<const ByteBpe> bpe;            // set for byte-level BPE vocabularies
  // The bytes of the model that makes the tokens (SentencePiece's proto, the BPE's tokenizer.json), or "".
  std::string model_bytes() const;
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  // Bytes of a token ("<eos>" -> "\n"; a word -> the word and a space).
  std::string decode(int64_t id) const;
  // Token id of a byte, or -1 when the byte is not in the vocabulary.
  std::vector<int64_t> byte_to_id() const;
};
Vocab read_vocab(const std::string& path);
// words.txt: one word per line (no spaces), in id order; clear errors for empty files and repeats.
Vocab read_word_vocab(const std::string& path);
// The same checks on vocabulary text held elsewhere (a checkpoint); `origin` names it in errors.
Vocab parse_vocab(const std::string& text, const std::string& origin);
Vocab parse_word_vocab(const std::string& text, const std::string& origin);
std::string vocab_to_text(const Vocab& vocab);

// SHA-256 (hex) of a vocabulary file's text. `data prepare` / `data words` write it into meta.json as
// "vocab_sha256", and load_corpus checks it when present: a vocabulary edited after preparing (two lines
// swapped) would otherwise map ids to the wrong bytes without a word.
std::string vocab_checksum(const std::string& text);
// The same tokens of the same kind (and, for subwords, the same model bytes).
bool same_vocabulary(const Vocab& a, const Vocab& b);
// How stored vocabularies name their kind: "byte", "word" or "sentencepiece".
const char* vocab_level(const Vocab& vocab);
// A vocabulary from its stored parts (a checkpoint's or an exported file's): the token text, the level,
// and for "sentencepiece" the model's bytes (which must make exactly these tokens). One-line errors
// naming `origin`.
// A vocabulary of a byte-level BPE's tokens, with it.
Vocab bpe_vocab(std::shared_ptr<const ByteBpe> bpe);
Vocab vocab_from_parts(const std::string& text, const std::string& level, const std::string& subword_model,
                       const std::string& origin);

struct PrepareOptions {
  bool crlf_to_lf = false;  // turn CRLF line ends into LF first (as done for ../shared/data files)
};

struct PrepareStats {
  int64_t input_bytes = 0;
  int64_t train_tokens = 0, valid_tokens = 0, test_tokens = 0;
  int64_t dropped = 0;  // valid/test bytes unseen in train
  int64_t vocab_size = 0;
};

// Prepares `input` into out_dir/{train,valid,test}.bin, vocab.txt and meta.json. Streams the input in
// two passes over a memory map: peak memory is independent of the corpus size.
PrepareStats prepare_bytes(const std::string& input, const std::string& out_dir, const PrepareOptions& options);

// Writes a token file atomically.
void write_tokens(const std::string& path, const std::vector<int64_t>& ids, int64_t vocab_size);

// A memory-mapped token file with validated header and contents.
class TokenFile {
 public:
  explicit TokenFile(const std::string& path);
  // A headerless file of one-byte token ids (as the reference's *.ids.u8 files), checked against vocab_size.
  struct RawBytes {};
  TokenFile(const std::string& path, RawBytes, int64_t vocab_size);
  int64_t size() const { return count_; }
  int64_t vocab_size() const { return vocab_size_; }
  int64_t at(int64_t i) const {
    return bytes_per_token_ == 1   ? tokens_[i]
           : bytes_per_token_ == 2 ? reinterpret_cast<const uint16_t*>(tokens_)[i]
                                   : static_cast<int64_t>(reinterpret_cast<const uint32_t*>(tokens_)[i]);
  }
  const std::string& path() const { return map_.path(); }
  // SHA-256 of the whole file: what a resumed run checks its data against.
  std::string fingerprint() const;

 private:
  MappedFile map_;
  const uint8_t* tokens_ = nullptr;
  int64_t count_ = 0, vocab_size_ = 0;
  uint32_t bytes_per_token_ = 1;
};

// A prepared data directory.
struct Corpus {
  std::string dir;
  Vocab vocab;
  std::unique_ptr<TokenFile> train, valid, test;
  const TokenFile& split(const std::string& name) const;
};
// Loads dir (all three splits unless `only_split` names one); clear errors for anything missing or corrupt.
Corpus load_corpus(const std::string& dir, const std::string& only_split = "");

// B contiguous streams over a token file, as the reference's batchify: stream b is tokens
// [b * S, (b + 1) * S) with S = floor(count / B) (the tail that does not divide is dropped).
class Streams {
 public:
  Streams(const TokenFile& tokens, int64_t batch);
  int64_t batch() const { return batch_; }
  int64_t length() const { return length_; }  // S
  // Fills inputs (B, M) and targets (B, M), row-major, from positions [pos, pos + M) / [pos + 1, pos + M + 1).
  void block(int64_t pos, int64_t M, int64_t* inputs, int64_t* targets, int64_t first_stream = 0,
             int64_t nb_streams = -1) const;

 private:
  const TokenFile* tokens_;
  int64_t batch_, length_;
};

}  // namespace spanformer::data
