// The named parts of the training loop (train/runner.h; internal to the library):
//
//   Batches       what each step reads, per data mode (token streams walked block by block, GPT's
//                 random contexts, a family's example sets in shuffled epochs), how the position moves,
//                 what validation reads, and what a checkpoint keeps of the data (its identity, the
//                 family's recurrent state) so that a resumed run reads exactly what it would have.
//   RunDirectory  the run's files (util/run_paths.h): the lock, the refusal of a second run, the clean
//                 start of a new one, the session records, and what the run says (stderr + train.log).
//   IntervalLog   the interval's losses, the progress line, the record of log.jsonl and best tracking.
#pragma once
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "spanformer/data/corpus.h"
#include "spanformer/metrics/units.h"
#include "spanformer/train/family.h"
#include "spanformer/util/io.h"
#include "spanformer/util/run_paths.h"
#include "spanformer/util/runtime.h"

namespace spanformer::train::run {

using metrics::in_unit;
using metrics::Unit;
using metrics::unit_name;

// Where a run is: saved in every checkpoint and restored exactly on resume.
struct Position {
  int64_t step = 0, train_pos = 0, valid_pos = 0;
  double elapsed_seconds = 0;
  double best_valid = std::numeric_limits<double>::infinity();
  // The validation interval open at this step: the sum of its training losses and their count, so that a
  // run stopped between two records logs the same train_loss at the next one as an uninterrupted run.
  double interval_loss = 0;
  int64_t interval_steps = 0;
};

// This process's share of the global batch B: streams (or examples) [first, first + local).
struct Shard {
  dist::Group* group = nullptr;
  int64_t world = 1, rank = 0, batch = 0, first = 0, local = 0;
};

// A validation's result: the mean NLL in nats, and for example data the accuracy and the full score.
struct Validation {
  double nll = 0;
  double accuracy = -1;
  ExampleScore score;
};

class Batches {
 public:
  virtual ~Batches() = default;
  // The data's vocabulary, sizes and fingerprints, and what the speed counts.
  const ExampleData& data() const { return data_; }
  virtual Unit unit() const = 0;
  virtual int64_t block() const = 0;  // M: tokens (examples: 1) per row of a step
  const char* speed_unit() const { return unit() == Unit::kNats ? "ex/s" : "tok/s"; }
  // Once the model is built: the data split into this shard's rows, refused when too short for them.
  virtual void prepare(const Shard& shard) = 0;
  // A new run: the family's recurrent state for this shard.
  virtual void start() {}
  // Resume: refuses another vocabulary or other data than the checkpoint's, then positions outside the
  // data, and restores the family's recurrent state.
  void check_same_data(const Checkpoint& ck) const;
  void resume(const Checkpoint& ck, const Position& p);
  // Into a checkpoint: what identifies the data (sizes, fingerprints), and the family's recurrent state
  // (`gather` turns a (local, ...) tensor into the (B, ...) one of all processes).
  void save_identity(CheckpointWriter& out) const;
  virtual void save_state(CheckpointWriter& out, const std::function<torch::Tensor(const torch::Tensor&)>& gather) const {
    (void)out, (void)gather;
  }
  // Inputs and targets of update `step` at `p`, on `device`.
  virtual std::pair<torch::Tensor, torch::Tensor> next(const Position& p, int64_t step, torch::Device device) = 0;
  // After the step: past its block, restarting the data by the family's rule.
  virtual void advance(Position& p) { (void)p; }
  // Validation at an interval end (every process calls it; the result is every process's mean).
  virtual Validation validate(Position& p) = 0;

 protected:
  virtual bool position_fits(const Position& p) const = 0;
  virtual void load_state(const Checkpoint& ck) { (void)ck; }
  std::string path_;  // train.data
  ExampleData data_;
  Shard shard_;
};

// The family's data side from train.data: a corpus directory for TokenStreams (vocab_size filled from
// it), or what ExampleSets::open_examples reads.
std::unique_ptr<Batches> open_batches(Family& family, const TrainConfig& train);

class RunDirectory {
 public:
  // The main rank locks `dir`, clears what a crashed session left, and refuses run files that are not
  // regular files and (without resume or overwrite) a directory that already holds a run.
  RunDirectory(const std::string& dir, bool main_rank, bool resume, bool overwrite);
  const RunPaths& paths() const { return paths_; }
  // Messages for the user: stderr and train.log with their UTC time (what comes before the log is
  // opened waits for it). Only the main rank speaks.
  void say(const std::string& text);
  // A new run: empty logs, no checkpoint or session of the run it replaces.
  void start_new();
  // The session's start: config.json, a sessions.jsonl record, train.log opened.
  void begin_session(const nlohmann::json& config, const std::vector<std::string>& command_line, int64_t step,
                     int64_t world);
  void record(const nlohmann::json& record);  // one log.jsonl line
  // The progress line into train.log, at most every 30 s: due, and written.
  bool progress_due() const;
  void progress(const std::string& line);
  void text(const std::string& line);  // one train.log line (interval lines)

 private:
  RunPaths paths_;
  bool main_;
  std::unique_ptr<DirectoryLock> lock_;
  // Says once that `file` (at `path`) could not take a line: `what` is lost.
  static void lost(std::ofstream& file, bool& said, const std::string& path, const std::string& what);
  std::ofstream text_log_, log_;
  bool log_lost_ = false, text_log_lost_ = false;  // a line could not be written (said once each)
  std::vector<std::string> early_;
  double last_progress_ = 0;
};

// The losses of one validation interval, and the record and line that close it.
class IntervalLog {
 public:
  IntervalLog(Unit unit, std::string speed_key, const char* speed_unit, int64_t items_per_step, int64_t world);
  void add(double loss) { loss_ += loss, ++loss_steps_, ++steps_; }
  // The open interval's losses, to save (Position::interval_*) and to carry on after a resume.
  void save_open(Position& p) const { p.interval_loss = loss_, p.interval_steps = loss_steps_; }
  void carry(const Position& p) { loss_ += p.interval_loss, loss_steps_ += p.interval_steps; }
  // The line after every step (terminal) and every 30 s (train.log).
  std::string progress_line(int64_t step, int64_t nb_steps, double loss, double lr, double per_step,
                            int64_t steps_left) const;
  double seconds() const { return now_seconds() - start_; }  // since the interval began
  // Closes the interval of `seconds` at p.step: its log.jsonl record (runner.h lists the fields; the
  // family's are added after), with p.best_valid updated and `best` telling whether this validation is it.
  nlohmann::json close(Position& p, const Validation& v, double lr, double seconds, double elapsed, double eta,
                       dist::Group* group, bool& best);
  // The interval's line for the terminal and train.log.
  std::string line(const nlohmann::json& record, double eta, double accuracy, const std::string& extra) const;
  void restart() { start_ = now_seconds(); }  // the next interval's clock
  double last_train = 0, last_valid = 0;  // in the unit, at the last close

 private:
  Unit unit_;
  std::string speed_key_;
  const char* speed_unit_;
  int64_t items_per_step_, world_;
  double loss_ = 0, start_, collective_ = 0;
  int64_t loss_steps_ = 0;  // the losses in loss_ (this session's and the ones carried)
  int64_t steps_ = 0;       // this session's steps of the interval (its speed)
};

}  // namespace spanformer::train::run
