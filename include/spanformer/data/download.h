// `spanformer data get enwik8|text8`: download from the canonical site, verify checksums, unzip and
// prepare with the standard 90M / 5M / 5M split. Every step writes to a temporary file first, so an
// interrupted download never leaves a file that looks complete.
#pragma once
#include <string>

namespace spanformer::data {

struct KnownDataset {
  std::string name;          // enwik8 | text8
  std::string url;           // canonical zip
  std::string member;        // file inside the zip
  std::string zip_sha1;      // of the zip ("" if unknown)
  std::string file_sha256;   // of the unzipped file ("" if unknown)
  std::string file_sha1;     // of the unzipped file ("" if unknown)
  std::string file_md5;      // of the unzipped file ("" if unknown)
  int64_t file_bytes = 0;
};
const KnownDataset& known_dataset(const std::string& name);

// Hex digests of a file ("md5", "sha1" or "sha256"), streamed.
std::string file_digest(const std::string& path, const std::string& algorithm);

// Downloads url (http, https or file://) to path atomically; prints progress to stderr.
void download(const std::string& url, const std::string& path);

// Extracts one member of a zip archive to path atomically.
void unzip_member(const std::string& zip_path, const std::string& member, const std::string& path);

// Checks a file against the dataset's size and digests; throws Error naming the mismatch.
void verify_dataset_file(const KnownDataset& dataset, const std::string& path);

// The whole `data get`: download (or reuse a verified local copy) + unzip + verify + prepare into out_dir.
// url_override replaces the canonical address (a mirror, or file:///path/enwik8.zip).
void get_dataset(const std::string& name, const std::string& out_dir, const std::string& url_override = "");

}  // namespace spanformer::data
