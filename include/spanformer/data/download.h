// `spanformer data get NAME`: the data sets of the adaptive-span and Transformer-XL reference scripts,
// downloaded from their published addresses, verified against published checksums and prepared.
//
//   enwik8, text8      one zip, one member -> bytes, the standard 90M / 5M / 5M split (prepare_bytes)
//   wikitext-2, -103   one zip, three members wiki.{train,valid,test}.tokens -> words (prepare_words)
//   ptb                three plain files ptb.{train,valid,test}.txt -> words
//
// Vocabulary rule of the Transformer-XL reference (data_utils.py): WikiText-2 and PTB count all three
// splits, WikiText-103 counts the training split only. Every download and extraction writes a temporary
// file first, so an interrupted run never leaves a file that looks complete; a file without a published
// checksum is named as such rather than passed silently.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace spanformer::data {

enum class DatasetLevel { Bytes, Words };

struct Digest {
  std::string algorithm;  // md5 | sha1 | sha256
  std::string hex;
};

struct DatasetFile {
  std::string name;              // file name in the output directory (enwik8, wiki.train.tokens, ptb.train.txt)
  std::string source;            // member of the archive, or the file's own address when there is no archive
  int64_t bytes = 0;             // 0 when no size is published
  std::vector<Digest> digests;   // published checksums of the file itself (may be empty)
};

struct KnownDataset {
  std::string name;
  DatasetLevel level = DatasetLevel::Bytes;
  std::string archive_url;              // zip holding the files ("" = each file fetched from its source)
  std::vector<Digest> archive_digests;  // published checksums of the zip
  std::vector<DatasetFile> files;       // Bytes: one file; Words: train, valid, test
  bool vocab_from_all = false;          // Words: count the vocabulary on all three splits
};
const KnownDataset& known_dataset(const std::string& name);
std::vector<std::string> known_dataset_names();

// Hex digests of a file ("md5", "sha1" or "sha256"), streamed.
std::string file_digest(const std::string& path, const std::string& algorithm);

// Downloads url (http, https or file://) to path atomically; prints progress to stderr.
void download(const std::string& url, const std::string& path);

// Extracts one member of a zip archive to path atomically.
void unzip_member(const std::string& zip_path, const std::string& member, const std::string& path);

// Checks a file against its published size and digests; throws Error naming the file and the mismatch.
// Returns false when nothing was published to check against.
bool verify_file(const DatasetFile& file, const std::string& path);

// The whole `data get`: download (or reuse a verified local copy), unzip, verify, prepare into out_dir.
// url_override replaces the published address: the zip's (a mirror, or file:///path/enwik8.zip), or for
// data sets without an archive the folder holding the files (file:///path/ptb). A mirror's zip is not
// held to the published zip checksum (mirrors repack); the extracted files always are.
void get_dataset(const std::string& name, const std::string& out_dir, const std::string& url_override = "");

}  // namespace spanformer::data
