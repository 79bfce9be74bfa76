// The files of a run directory (`spanformer train --out RUN`), named once: the runner writes them,
// eval, report, par and checkpoint lookup read them.
//
//   config.json      the run's config (model + train), rewritten at each session's start
//   log.jsonl        one record per validation interval (train/runner.h lists the fields)
//   train.log        what the run said on stderr, with UTC times, plus progress every 30 s
//   sessions.jsonl   one record per session: code version, host, command line, starting step
//   checkpoint.pt    the latest state (resume continues from it), best.pt the best validation's
//   eval.jsonl       `spanformer eval` results of the run's checkpoints
#pragma once
#include <string>

namespace spanformer {

struct RunPaths {
  explicit RunPaths(std::string dir) : dir(std::move(dir)) {}
  std::string dir;
  std::string config() const { return dir + "/config.json"; }
  std::string log() const { return dir + "/log.jsonl"; }
  std::string text_log() const { return dir + "/train.log"; }
  std::string sessions() const { return dir + "/sessions.jsonl"; }
  std::string checkpoint() const { return dir + "/checkpoint.pt"; }
  std::string best() const { return dir + "/best.pt"; }
  std::string evals() const { return dir + "/eval.jsonl"; }
};

}  // namespace spanformer
