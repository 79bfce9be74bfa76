#pragma once
// The storages a LibTorch or torch.save pickle declares, read without building anything.
//
// A tensor in a TorchScript archive (torch::serialize) or a torch.save file is a pickled call whose
// persistent id names its storage: the tuple
//     ('storage', <global torch.FloatStorage>, '<key>', '<device>', <numel>)
// and the storage's bytes are the zip record <dir>/data/<key> (constants.pkl: <dir>/constants/<key>).
// LibTorch sizes the storage from numel x the element size in the pickle and points it at the record's
// buffer without comparing the two: a damaged numel makes every later read run past the buffer (found
// by fuzzing: tests/fuzz/crashes/checkpoint/tensor-bytes-beyond-record). This walks the pickle's
// opcodes (protocols 0-5) on a stack of plain values, enough to recognise those tuples, and returns
// each storage's key and declared bytes; the caller compares them with the zip records.
//
// Invariants: never reads outside `data`; fails (util/error.h) with a one-line message naming the
// opcode offset on an opcode it does not know, a truncated argument, a stack or memo misuse, or a
// storage tuple it cannot size (unknown storage type, negative or overflowing numel).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace spanformer {

struct DeclaredStorage {
  std::string key;  // the record name after <dir>/data/
  uint64_t bytes;   // numel x element size
};

// `what` names the pickle in messages ("data.pkl").
std::vector<DeclaredStorage> pickle_storages(const uint8_t* data, size_t size, const std::string& what);

}  // namespace spanformer
