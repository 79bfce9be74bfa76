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

#include "spanformer/data/corpus.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"

namespace spanformer::data {

const KnownDataset& known_dataset(const std::string& name) {
  // Checksums from ../shared/data/README.md (the published files).
  static const std::vector<KnownDataset> datasets = {
      {"enwik8", "http://mattmahoney.net/dc/enwik8.zip", "enwik8", "",
       "2b49720ec4d78c3c9fabaee6e4179a5e997302b3a70029f30f2d582218c024a8", "",
       "a1fa5ffddb56f4953e226637dabbb36a", 100000000},
      {"text8", "http://mattmahoney.net/dc/text8.zip", "text8", "6c70299b93b7e1f927b42cd8f6ac1a31547c7a2e", "",
       "0dc3edebc970dcc96137e7deda4d9995af9d93de", "", 100000000},
  };
  for (const auto& d : datasets)
    if (d.name == name) return d;
  fail("unknown dataset '{}' (known: enwik8, text8; use `spanformer data prepare FILE` for any other text)", name);
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
  if (total > 0) std::fprintf(stderr, "\r  downloading: %.1f / %.1f MB", now / 1e6, total / 1e6);
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

void verify_dataset_file(const KnownDataset& d, const std::string& path) {
  MappedFile file(path);
  if (d.file_bytes > 0 && static_cast<int64_t>(file.size()) != d.file_bytes)
    fail("{} has {} bytes, expected {} for {}", path, file.size(), d.file_bytes, d.name);
  auto check = [&](const std::string& algorithm, const std::string& expected) {
    if (expected.empty()) return;
    auto got = file_digest(path, algorithm);
    if (got != expected) fail("{} checksum mismatch for {}: {} {}, expected {}", algorithm, path, algorithm, got, expected);
  };
  check("md5", d.file_md5);
  check("sha1", d.file_sha1);
  check("sha256", d.file_sha256);
}

void get_dataset(const std::string& name, const std::string& out_dir, const std::string& url_override) {
  const KnownDataset& d = known_dataset(name);
  make_dirs(out_dir);
  const std::string zip_path = out_dir + "/" + name + ".zip";
  const std::string raw_path = out_dir + "/" + name;
  if (!file_exists(raw_path)) {
    if (!file_exists(zip_path)) {
      std::string url = url_override.empty() ? d.url : url_override;
      fmt::print(stderr, "spanformer: downloading {} from {}\n", name, url);
      download(url, zip_path);
    }
    if (!d.zip_sha1.empty() && url_override.empty()) {
      auto got = file_digest(zip_path, "sha1");
      if (got != d.zip_sha1) {
        std::remove(zip_path.c_str());
        fail("sha1 checksum mismatch for {}: got {}, expected {} (the file was removed; try again)", zip_path, got, d.zip_sha1);
      }
    }
    unzip_member(zip_path, d.member, raw_path);
  }
  verify_dataset_file(d, raw_path);
  fmt::print(stderr, "spanformer: {} verified; preparing the 90M/5M/5M split\n", name);
  auto stats = prepare_bytes(raw_path, out_dir, PrepareOptions{});
  fmt::print(stderr, "spanformer: {} ready in {} ({} train, {} valid, {} test tokens, vocabulary {})\n", name, out_dir,
             stats.train_tokens, stats.valid_tokens, stats.test_tokens, stats.vocab_size);
}

}  // namespace spanformer::data
