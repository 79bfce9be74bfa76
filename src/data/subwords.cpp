#include "spanformer/data/subwords.h"

#include "spanformer/build_options.h"
#include "spanformer/sentencepiece_module.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>

#include <fmt/format.h>

#include "spanformer/data/corpus.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"

namespace spanformer::data {
namespace {

// The module's C interface (src/data/sentencepiece_shim.cpp): null on success, else a message.
struct Module {
  const char* (*train)(const char* const*, size_t, const char* const*, const char* const*, size_t, char**, size_t*);
  void (*free)(void*);
  const char* (*load)(const char*, size_t, void**);
  void (*close)(void*);
  int (*size)(void*);
  int (*special)(void*, int);
  char* (*piece)(void*, int);
  const char* (*encode)(void*, const char*, size_t, int**, size_t*);
  const char* (*decode)(void*, const int*, size_t, char**);
};

std::string first_line(const char* s) {
  std::string t = s;
  return t.substr(0, t.find('\n'));
}

std::string directory_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// AddressSanitizer cannot run a library opened with RTLD_DEEPBIND (google/sanitizers#611): sanitizer
// builds (-DSPANFORMER_SANITIZE=ON, the fuzz targets) open it without, which is safe against PyPI's
// LibTorch (its protobuf is not exported); Debian's LibTorch 1.13 needs the isolation (sentencepiece_shim.cpp).
#if defined(__SANITIZE_ADDRESS__)
constexpr int kDeepBind = 0;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr int kDeepBind = 0;
#else
constexpr int kDeepBind = RTLD_DEEPBIND;
#endif
#else
constexpr int kDeepBind = RTLD_DEEPBIND;
#endif

// Opens the module once per process (RTLD_LOCAL | RTLD_DEEPBIND: its protobuf stays its own).
const Module& module() {
  static std::once_flag once;
  static Module m;
  static std::string failure;
  std::call_once(once, [] {
    if (!SPANFORMER_WITH_SENTENCEPIECE) {
      failure = "this build has no SentencePiece (install libsentencepiece-dev and configure with "
                "-DSPANFORMER_SENTENCEPIECE=ON)";
      return;
    }
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("SPANFORMER_SENTENCEPIECE_MODULE")) candidates.push_back(env);
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
      const std::string dir = directory_of(std::string(exe, static_cast<size_t>(n)));
      candidates.push_back(dir + "/" + kSentencePieceModuleName);
      candidates.push_back(directory_of(dir) + "/" + kSentencePieceModuleName);
      candidates.push_back(directory_of(dir) + "/lib/spanformer/" + kSentencePieceModuleName);  // installed: bin/../lib/spanformer
    }
    // Beside the shared object this code was linked into (the Python module in an installed package).
    Dl_info self{};
    if (dladdr(reinterpret_cast<void*>(&directory_of), &self) != 0 && self.dli_fname != nullptr)
      candidates.push_back(directory_of(self.dli_fname) + "/" + kSentencePieceModuleName);
    candidates.push_back(kSentencePieceModuleBuilt);
    void* lib = nullptr;
    std::string tried;
    for (const auto& path : candidates) {
      if (!file_exists(path)) {
        tried += (tried.empty() ? "" : ", ") + path;
        continue;
      }
      lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | kDeepBind);
      if (lib == nullptr) {
        failure = fmt::format("cannot open the SentencePiece module {}: {}", path, dlerror());
        return;
      }
      break;
    }
    if (lib == nullptr) {
      failure = fmt::format("the SentencePiece module {} is not built or installed (looked in {}; "
                            "SPANFORMER_SENTENCEPIECE_MODULE names another)", kSentencePieceModuleName, tried);
      return;
    }
    auto sym = [&](const char* name) {
      void* p = dlsym(lib, name);
      if (p == nullptr && failure.empty()) failure = fmt::format("the SentencePiece module lacks {}", name);
      return p;
    };
    m.train = reinterpret_cast<decltype(m.train)>(sym("sfsp_train"));
    m.free = reinterpret_cast<decltype(m.free)>(sym("sfsp_free"));
    m.load = reinterpret_cast<decltype(m.load)>(sym("sfsp_load"));
    m.close = reinterpret_cast<decltype(m.close)>(sym("sfsp_close"));
    m.size = reinterpret_cast<decltype(m.size)>(sym("sfsp_size"));
    m.special = reinterpret_cast<decltype(m.special)>(sym("sfsp_special"));
    m.piece = reinterpret_cast<decltype(m.piece)>(sym("sfsp_piece"));
    m.encode = reinterpret_cast<decltype(m.encode)>(sym("sfsp_encode"));
    m.decode = reinterpret_cast<decltype(m.decode)>(sym("sfsp_decode"));
  });
  if (!failure.empty()) fail("subwords: {}", failure);
  return m;
}

}  // namespace

bool subwords_available() {
  try {
    module();
    return true;
  } catch (const Error&) {
    return false;
  }
}

SubwordModel::SubwordModel(std::string proto, const std::string& origin) : proto_(std::move(proto)) {
  const auto& m = module();
  if (const char* e = m.load(proto_.data(), proto_.size(), &handle_))
    fail("{}: not a SentencePiece model ({})", origin, first_line(e));
  if (m.special(handle_, 0) != kPadId || m.special(handle_, 1) != kUnkId || m.special(handle_, 2) != kBosId ||
      m.special(handle_, 3) != kEosId)
    fail("{}: a SentencePiece model whose special ids are not <pad> 0, <unk> 1, <bos> 2, <eos> 3", origin);
}

SubwordModel::~SubwordModel() {
  if (handle_ != nullptr) module().close(handle_);
}

int64_t SubwordModel::size() const { return module().size(handle_); }

std::vector<std::string> SubwordModel::pieces() const {
  const auto& m = module();
  std::vector<std::string> out;
  for (int i = 0; i < m.size(handle_); ++i) {
    char* p = m.piece(handle_, i);
    out.emplace_back(p);
    m.free(p);
  }
  return out;
}

std::vector<int64_t> SubwordModel::encode(const std::string& text) const {
  const auto& m = module();
  int* ids = nullptr;
  size_t n = 0;
  if (const char* e = m.encode(handle_, text.data(), text.size(), &ids, &n))
    fail("subwords: cannot encode '{}' ({})", text, first_line(e));
  std::vector<int64_t> out(ids, ids + n);
  m.free(ids);
  return out;
}

std::string SubwordModel::decode(const std::vector<int64_t>& ids) const {
  const auto& m = module();
  std::vector<int> kept;
  for (int64_t i : ids) {
    if (i < 0 || i >= size()) fail("decode: token id {} is outside the vocabulary of {}", i, size());
    if (i == kEosId) break;
    if (i != kPadId && i != kBosId) kept.push_back(static_cast<int>(i));
  }
  char* text = nullptr;
  if (const char* e = m.decode(handle_, kept.data(), kept.size(), &text)) fail("subwords: cannot decode ({})", first_line(e));
  std::string out = text;
  m.free(text);
  return out;
}

std::string learn_subwords(const std::vector<std::string>& sentences, SubwordKind kind, int64_t vocab_size,
                           const std::string& origin) {
  const auto& m = module();
  if (sentences.empty()) fail("{}: no training sentences to learn subwords from", origin);
  const std::vector<std::pair<std::string, std::string>> args = {
      {"model_type", subword_kind_name(kind)},
      {"vocab_size", std::to_string(vocab_size)},
      {"hard_vocab_limit", "false"},  // a small corpus gets the pieces it has, not an error
      {"character_coverage", "1.0"},
      {"normalization_rule_name", "identity"},
      {"pad_id", std::to_string(kPadId)},
      {"unk_id", std::to_string(kUnkId)},
      {"bos_id", std::to_string(kBosId)},
      {"eos_id", std::to_string(kEosId)},
      {"pad_piece", "<pad>"},
      {"unk_piece", "<unk>"},
      {"bos_piece", "<bos>"},
      {"eos_piece", kEos},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"num_threads", "1"},
      {"minloglevel", "2"},
  };
  std::vector<const char*> text, keys, values;
  for (const auto& s : sentences) text.push_back(s.c_str());
  for (const auto& [k, v] : args) keys.push_back(k.c_str()), values.push_back(v.c_str());
  char* model = nullptr;
  size_t size = 0;
  if (const char* e = m.train(text.data(), text.size(), keys.data(), values.data(), keys.size(), &model, &size))
    fail("{}: learning subwords failed ({})", origin, first_line(e));
  std::string out(model, size);
  m.free(model);
  return out;
}

}  // namespace spanformer::data
