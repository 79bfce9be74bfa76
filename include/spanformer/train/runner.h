// The one training runner every model family runs on (train/family.h has the division of labour).
//
// Data (src/train/run_parts.h, Batches): a family's example sets (ExampleSets: the family reads its own
// labelled examples, the runner draws each step's batch from a shuffled epoch), or token streams
// (TokenStreams): B contiguous streams of the train split, this process's share [first, first + B / W)
// of them; step k reads block [pos - context(pos), pos + M) of each; the family's recurrent state
// carries over from block to block; when a stream has no full block left the data restarts by the
// family's rule (GPT: independent random contexts every step instead).
// Each step: lr of update k (config/train_config.h), the family's train step (gradients averaged over
// processes by the reducer), the one host read of the loss, the NaN/inf guard. Every eval_interval
// steps: the family's validation, one log record, the progress line; checkpoints every
// checkpoint_interval (default eval_interval) steps, at the end, on Ctrl-C / SIGTERM, and best.pt
// whenever validation improves.
//
// Log record (log.jsonl, one per interval, every family): step, train_loss and valid_loss (nats per
// token), train_<unit> and valid_<unit> (bpc for byte vocabularies, ppl for word ones; example data:
// valid_acc instead), lr, ms_per_step, tokens_per_s (example data: <item>_per_s, e.g. images_per_s),
// elapsed_s, eta_s, processes, allreduce_ms_per_step (several processes), best_valid_loss, then the
// family's fields (span_mean / span_max, tau / probs / argmax, BLEU).
//
// The loop is made of named parts (src/train/run_parts.h): Batches per data mode, the RunDirectory (files,
// lock, sessions, messages) and the IntervalLog (records, progress, best); run_training strings them.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "spanformer/metrics/units.h"
#include "spanformer/train/family.h"

namespace spanformer::train {

struct RunOptions {
  std::string out_dir;          // config.json, log.jsonl, checkpoint.pt, best.pt
  bool resume = false;          // continue from out_dir/checkpoint.pt (exactly where it stopped)
  bool overwrite = false;       // a new run may replace the run already in out_dir (else refused)
  std::vector<std::string> command_line;  // recorded in out_dir/sessions.jsonl with version, host, start time
  bool progress = true;         // live progress line on stderr
  int64_t stop_after = -1;      // stop (with a checkpoint) after this many steps of this session
  std::string init_from;        // new run only: start from this checkpoint's weights (same model)
  std::shared_ptr<dist::Group> group;  // data-parallel run: this process's group (null = one process)
  // Called once the data, the run directory and any checkpoint passed their checks, before the first
  // step (the command line prints the config there, so a refused run prints its one error line only).
  std::function<void()> on_started;
};

struct RunResult {
  int64_t steps = 0;           // the run's step count at the end
  int64_t session_steps = 0;   // steps done by this call
  double last_train = 0, last_valid = 0;  // in `unit`, at the last evaluation of this session
  double last_accuracy = -1;   // example data: valid accuracy at that evaluation
  bool evaluated = false;      // false: stopped before this session's first evaluation
  metrics::Unit unit = metrics::Unit::kBpc;  // bpc, ppl or nats (example data)
  bool interrupted = false;
};

// Refuses a batch that `world` processes cannot share: batch_size must divide by world * batch_split.
// run_training checks it; a launcher checks it before starting its workers.
void check_batch_splits(const TrainConfig& tc, int world);

// Trains; throws Error for bad data, config or checkpoint and for a non-finite loss.
RunResult run_training(Family& family, const RunOptions& options);

}  // namespace spanformer::train
