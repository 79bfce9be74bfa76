// A C interface to SentencePiece, built as its own module (libspanformer_sentencepiece.so) and opened
// at run time by data/subwords.cpp with dlopen(RTLD_LOCAL | RTLD_DEEPBIND).
//
// Why not link libsentencepiece directly: Debian's build carries its own copy of protobuf-lite 3.14 and
// exports its symbols, while LibTorch loads the system's libprotobuf 3.21. In one global symbol scope
// the two runtimes resolve each other's functions: the process crashes while libprotobuf initialises
// (before main), or stops on protobuf's version check. Opened locally and bound deep, SentencePiece
// resolves its own protobuf and LibTorch keeps the system's.
//
// Every function returns null on success or an error message (valid until the next call on the thread);
// buffers it returns are malloc'ed and released with sfsp_free.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

thread_local std::string last_error;

const char* error(const sentencepiece::util::Status& status) {
  if (status.ok()) return nullptr;
  last_error = status.ToString();
  return last_error.c_str();
}

char* copy(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out != nullptr) std::memcpy(out, s.data(), s.size() + 1);
  return out;
}

class Sentences : public sentencepiece::SentenceIterator {
 public:
  Sentences(const char* const* s, size_t n) : s_(s), n_(n) { load(); }
  bool done() const override { return i_ >= n_; }
  void Next() override {
    ++i_;
    load();
  }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void load() {
    if (i_ < n_) value_ = s_[i_];
  }
  const char* const* s_;
  size_t n_, i_ = 0;
  std::string value_;
};

}  // namespace

extern "C" {

const char* sfsp_train(const char* const* sentences, size_t n, const char* const* keys, const char* const* values,
                       size_t n_args, char** model, size_t* model_size) {
  try {
    std::unordered_map<std::string, std::string> args;
    for (size_t i = 0; i < n_args; ++i) args[keys[i]] = values[i];
    Sentences it(sentences, n);
    std::string proto;
    if (const char* e = error(sentencepiece::SentencePieceTrainer::Train(args, &it, &proto))) return e;
    *model = static_cast<char*>(std::malloc(proto.size() + 1));
    if (*model == nullptr) return "out of memory";
    std::memcpy(*model, proto.data(), proto.size());
    *model_size = proto.size();
    return nullptr;
  } catch (const std::exception& e) {
    last_error = e.what();
    return last_error.c_str();
  }
}

void sfsp_free(void* p) { std::free(p); }

// No exception crosses this C interface: SentencePiece's parts throw on some damaged models (darts_clone:
// "failed to insert key: zero-length key", found by the sentencepiece fuzz target, kept in
// tests/fuzz/crashes/sentencepiece/), and each becomes the function's error.
const char* sfsp_load(const char* model, size_t size, void** handle) {
  try {
    auto p = std::make_unique<sentencepiece::SentencePieceProcessor>();
    if (const char* e = error(p->LoadFromSerializedProto(std::string(model, size)))) return e;
    *handle = p.release();
    return nullptr;
  } catch (const std::exception& e) {
    last_error = e.what();
    return last_error.c_str();
  }
}

void sfsp_close(void* handle) { delete static_cast<sentencepiece::SentencePieceProcessor*>(handle); }

int sfsp_size(void* handle) { return static_cast<sentencepiece::SentencePieceProcessor*>(handle)->GetPieceSize(); }

// which: 0 pad, 1 unk, 2 bos, 3 eos
int sfsp_special(void* handle, int which) {
  auto* p = static_cast<sentencepiece::SentencePieceProcessor*>(handle);
  return which == 0 ? p->pad_id() : which == 1 ? p->unk_id() : which == 2 ? p->bos_id() : p->eos_id();
}

char* sfsp_piece(void* handle, int id) { return copy(static_cast<sentencepiece::SentencePieceProcessor*>(handle)->IdToPiece(id)); }

const char* sfsp_encode(void* handle, const char* text, size_t length, int** ids, size_t* n) {
  try {
    std::vector<int> out;
    if (const char* e = error(static_cast<sentencepiece::SentencePieceProcessor*>(handle)->Encode(std::string(text, length), &out)))
      return e;
    *ids = static_cast<int*>(std::malloc(sizeof(int) * (out.size() + 1)));
    if (*ids == nullptr) return "out of memory";
    std::memcpy(*ids, out.data(), sizeof(int) * out.size());
    *n = out.size();
    return nullptr;
  } catch (const std::exception& e) {
    last_error = e.what();
    return last_error.c_str();
  }
}

const char* sfsp_decode(void* handle, const int* ids, size_t n, char** text) {
  try {
    std::string out;
    if (const char* e = error(static_cast<sentencepiece::SentencePieceProcessor*>(handle)->Decode(std::vector<int>(ids, ids + n), &out)))
      return e;
    *text = copy(out);
    return *text == nullptr ? "out of memory" : nullptr;
  } catch (const std::exception& e) {
    last_error = e.what();
    return last_error.c_str();
  }
}

}  // extern "C"
