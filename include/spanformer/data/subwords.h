// Subword vocabularies with SentencePiece (Kudo and Richardson, EMNLP 2018 demo; Debian's
// libsentencepiece-dev): the unigram language model of Kudo (ACL 2018) by default, byte-pair encoding
// (Sennrich, Haddow and Birch, ACL 2016) by `subword_kind = bpe`.
//
// A model is learned from the normalised sentences of a training split (data/pairs.h), source and
// target together, so that one table can serve encoder, decoder and output. Its ids keep the layout
// every seq2seq vocabulary has: 0 <pad>, 1 <unk>, 2 <bos>, 3 <eos> (config/pairs_options.h), then the
// pieces. A piece begins with U+2581 ("▁") where a word begins; decoding joins the pieces and turns
// those marks back into spaces, so decode(encode(s)) == s for any normalised sentence whose characters
// the model covers (character_coverage 1.0: every character of the training split).
//
// Invariants:
//   - learning is deterministic: the same sentences and options give the same model bytes (one
//     thread, every sentence used in its order, no sampling);
//   - the text is not normalised again (SentencePiece's "identity" rule): data/pairs.h did it;
//   - the serialized model (proto()) is what a checkpoint stores, so a trained model translates without
//     the data it was learned from.
//
// SentencePiece runs inside libspanformer_sentencepiece.so (src/data/sentencepiece_shim.cpp), opened on
// first use: its bundled protobuf must not meet LibTorch's (that file says why). The module is looked
// for in $SPANFORMER_SENTENCEPIECE_MODULE, beside the executable, one directory up, and in the build
// directory it was built in; a missing module is a one-line error naming where it looked.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "spanformer/config/pairs_options.h"

namespace spanformer::data {

class SubwordModel {
 public:
  // Loads serialized model bytes; one-line error naming `origin` when they are not a model or its
  // special ids are not the layout above.
  SubwordModel(std::string proto, const std::string& origin);
  ~SubwordModel();
  SubwordModel(const SubwordModel&) = delete;
  SubwordModel& operator=(const SubwordModel&) = delete;

  const std::string& proto() const { return proto_; }
  int64_t size() const;
  std::vector<std::string> pieces() const;                    // id -> piece
  std::vector<int64_t> encode(const std::string& text) const;  // no <bos>/<eos>; unknown -> <unk>
  std::string decode(const std::vector<int64_t>& ids) const;   // specials skipped

 private:
  std::string proto_;
  void* handle_ = nullptr;  // the module's processor
};

// Learns a model of `vocab_size` pieces (fewer when the sentences cannot fill it) from `sentences`.
// `origin` names the data in errors.
std::string learn_subwords(const std::vector<std::string>& sentences, SubwordKind kind, int64_t vocab_size,
                           const std::string& origin);

// Whether this build has SentencePiece (CMake option SPANFORMER_SENTENCEPIECE).
bool subwords_available();

}  // namespace spanformer::data
