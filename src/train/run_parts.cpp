#include "run_parts.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "spanformer/data/batches.h"
#include "spanformer/dist/group.h"
#include "spanformer/util/build_info.h"
#include "spanformer/util/error.h"
#include "spanformer/util/runtime.h"

namespace spanformer::train::run {

// ---- Batches --------------------------------------------------------------------------------------

void Batches::check_same_data(const Checkpoint& ck) const {
  if (!data::same_vocabulary(ck.vocab(), data_.vocab))
    fail("checkpoint {} was trained with another vocabulary than {}", ck.path(), path_);
  if (ck.has("state.train_sha256") &&
      (ck.text("state.train_sha256") != data_.train_fingerprint || ck.text("state.valid_sha256") != data_.valid_fingerprint))
    fail("checkpoint {} was trained on other data than {} (its train.bin / valid.bin fingerprints differ)", ck.path(), path_);
  if (ck.has("state.train_tokens") &&
      (ck.integer("state.train_tokens") != data_.train_size || ck.integer("state.valid_tokens") != data_.valid_size))
    fail("checkpoint {} was trained on data of {} train / {} valid {}; {} has {} / {}: not the same data", ck.path(),
         ck.integer("state.train_tokens"), ck.integer("state.valid_tokens"), data_.item, path_, data_.train_size,
         data_.valid_size);
}

void Batches::resume(const Checkpoint& ck, const Position& p) {
  if (p.step < 0 || p.train_pos < 0 || p.valid_pos < 0 || !position_fits(p) || !(p.elapsed_seconds >= 0))
    fail("checkpoint {} is damaged: its training position (step {}, train {}, valid {}) is outside the data", ck.path(),
         p.step, p.train_pos, p.valid_pos);
  load_state(ck);
}

void Batches::save_identity(CheckpointWriter& out) const {
  out.put_int("state.train_tokens", data_.train_size);  // examples, for example data
  out.put_int("state.valid_tokens", data_.valid_size);
  out.put_text("state.train_sha256", data_.train_fingerprint);
  out.put_text("state.valid_sha256", data_.valid_fingerprint);
}

namespace {

// Token streams of a corpus directory (TokenStreams): what both ways of reading them share (the
// corpus, its identity, validation and the family's recurrent state).
class CorpusBatches : public Batches {
 public:
  CorpusBatches(TokenStreams& family, Family& core, const std::string& path) : family_(family) {
    path_ = path;
    corpus_ = data::load_corpus(path);
    core.set_vocab_size(corpus_.vocab.size(), path + "/vocab.txt");
    data_.vocab = corpus_.vocab;
    data_.train_size = corpus_.train->size();
    data_.valid_size = corpus_.valid->size();
    data_.train_fingerprint = corpus_.train->fingerprint();
    data_.valid_fingerprint = corpus_.valid->fingerprint();
    data_.item = "tokens";
  }
  Unit unit() const override { return data_.vocab.word_level ? Unit::kPpl : Unit::kBpc; }
  int64_t block() const override { return family_.block_length(); }

  void prepare(const Shard& shard) override {
    shard_ = shard;
    valid_ = std::make_unique<data::Streams>(*corpus_.valid, shard.batch);
  }
  void start() override { family_.init_state(shard_.local); }

  Validation validate(Position& p) override {
    Validation v;
    v.nll = family_.validation_loss(*corpus_.valid, shard_.batch, shard_.first, shard_.local, p.valid_pos);
    if (shard_.group) v.nll = shard_.group->all_reduce_sum(v.nll) / static_cast<double>(shard_.world);  // equal shares
    return v;
  }

  void save_state(CheckpointWriter& out, const std::function<torch::Tensor(const torch::Tensor&)>& gather) const override {
    family_.save_state(out, gather);  // the family's own state (caches, memories)
  }

 protected:
  bool position_fits(const Position& p) const override { return p.valid_pos < valid_->length(); }
  void load_state(const Checkpoint& ck) override { family_.load_state(ck, shard_.batch, shard_.first, shard_.local); }
  // Refuses the train and valid splits unless each is longer than `min_length` (its tokens, or its
  // streams' length): "<path>/train.bin is too short for <what>".
  void require_longer(int64_t train_length, int64_t valid_length, int64_t min_length, const std::string& what) const {
    if (train_length <= min_length) fail("{}/train.bin is too short for {}", path_, what);
    if (valid_length <= min_length) fail("{}/valid.bin is too short for {}", path_, what);
  }

  TokenStreams& family_;
  data::Corpus corpus_;
  std::unique_ptr<data::Streams> valid_;
};

// B contiguous streams walked block by block (adaptive span, XL): block [pos - context(pos), pos + M)
// of each, restarting by the family's rule when a stream has no full block left.
class StreamBatches : public CorpusBatches {
 public:
  using CorpusBatches::CorpusBatches;

  void prepare(const Shard& shard) override {
    CorpusBatches::prepare(shard);
    const int64_t M = block();
    train_ = std::make_unique<data::Streams>(*corpus_.train, shard.batch);
    const int64_t min_length = family_.data_restart() == DataRestart::kRandomOffset ? 2 * M : M + 1;
    require_longer(train_->length(), valid_->length(), min_length, fmt::format("{} streams of blocks of {}", shard.batch, M));
  }

  std::pair<torch::Tensor, torch::Tensor> next(const Position& p, int64_t step, torch::Device device) override {
    (void)step;
    const int64_t e = family_.context(p.train_pos), M = block();
    return data::make_block(*train_, p.train_pos - e, e + M, device, shard_.first, shard_.local);  // (b, e + M)
  }

  void advance(Position& p) override {
    const int64_t M = block();
    p.train_pos += M;
    if (p.train_pos + M > train_->length() - 1) {  // no full block left
      p.train_pos = family_.data_restart() == DataRestart::kRandomOffset
                        ? torch::randint(M, {1}, torch::kLong).item<int64_t>()  // the reference's rule
                        : 0;
      family_.reset_train_state();
    }
  }

 protected:
  bool position_fits(const Position& p) const override {
    return p.train_pos + block() < train_->length() && CorpusBatches::position_fits(p);
  }

 private:
  std::unique_ptr<data::Streams> train_;
};

// B independent contexts of M tokens drawn at random each step (GPT): starts uniform in [0, n - M - 1]
// from LibTorch's CPU generator (which checkpoints keep), every process drawing all B and taking its share.
class ContextBatches : public CorpusBatches {
 public:
  using CorpusBatches::CorpusBatches;

  void prepare(const Shard& shard) override {
    CorpusBatches::prepare(shard);
    const int64_t M = block();
    require_longer(corpus_.train->size(), corpus_.valid->size(), M + 1, fmt::format("contexts of {} tokens", M));
  }

  std::pair<torch::Tensor, torch::Tensor> next(const Position& p, int64_t step, torch::Device device) override {
    (void)p, (void)step;
    const int64_t M = block();
    auto draw = torch::randint(corpus_.train->size() - M, {shard_.batch}, torch::kLong);  // (B)
    const int64_t* d = draw.data_ptr<int64_t>() + shard_.first;
    return data::make_contexts(*corpus_.train, std::vector<int64_t>(d, d + shard_.local), M, device);  // (b, M) each
  }
};

// A family's example sets (ExampleSets): batch j of epoch e is examples perm_e[j B, (j + 1) B) (drop-last
// epochs), perm_e drawn from (seed, e) alone and arranged by the family.
class ExampleBatches : public Batches {
 public:
  ExampleBatches(ExampleSets& family, const TrainConfig& train) : family_(family), seed_(train.seed) {
    path_ = train.data;
    data_ = family.open_examples(train.data);
  }
  Unit unit() const override { return Unit::kNats; }
  int64_t block() const override { return 1; }

  void prepare(const Shard& shard) override {
    shard_ = shard;
    if (data_.train_size < shard.batch)
      fail("{}: {} training examples, fewer than a batch of {}", path_, data_.train_size, shard.batch);
  }

  std::pair<torch::Tensor, torch::Tensor> next(const Position& p, int64_t step, torch::Device device) override {
    (void)p;
    const int64_t B = shard_.batch;
    const int64_t per_epoch = data_.train_size / B, e = (step - 1) / per_epoch, j = (step - 1) % per_epoch;
    if (e != epoch_) {
      auto generator = at::detail::createCPUGenerator(seed_ * 1000003ULL + static_cast<uint64_t>(e));
      order_ = torch::randperm(data_.train_size, generator, torch::kLong);  // (train examples)
      family_.arrange_epoch(order_, B, generator);
      epoch_ = e;
    }
    const int64_t* order = order_.data_ptr<int64_t>() + j * B + shard_.first;
    return family_.example_batch(std::vector<int64_t>(order, order + shard_.local), device);
  }

  Validation validate(Position&) override {
    Validation v;
    v.score = family_.score_examples("valid", shard_.rank, shard_.world);
    v.score.all_reduce(shard_.group);
    v.nll = v.score.nll_sum / v.score.count;
    v.accuracy = v.score.correct / v.score.count;
    return v;
  }

 protected:
  bool position_fits(const Position& p) const override { return p.valid_pos < 1; }

 private:
  ExampleSets& family_;
  uint64_t seed_;
  int64_t epoch_ = -1;   // the epoch whose order order_ holds
  torch::Tensor order_;  // (train examples) int64
};

}  // namespace

std::unique_ptr<Batches> open_batches(Family& family, const TrainConfig& train) {
  if (auto* streams = family.as<TokenStreams>()) {
    if (streams->data_restart() == DataRestart::kRandomContexts)
      return std::make_unique<ContextBatches>(*streams, family, train.data);
    return std::make_unique<StreamBatches>(*streams, family, train.data);
  }
  if (auto* sets = family.as<ExampleSets>()) return std::make_unique<ExampleBatches>(*sets, train);
  fail("the {} family reads neither token streams nor example sets", family.name());
}

// ---- RunDirectory ---------------------------------------------------------------------------------

RunDirectory::RunDirectory(const std::string& dir, bool main_rank, bool resume, bool overwrite)
    : paths_(dir), main_(main_rank) {
  make_dirs(dir);
  if (!main_) return;  // the main rank owns the run directory
  lock_ = std::make_unique<DirectoryLock>(dir, "training run");
  remove_stale_temporaries(dir);
  // A directory where a run file belongs would be taken for "no checkpoint" and removed (std::remove
  // deletes an empty directory) or fail at the first save: refused before anything runs.
  check_regular_or_absent(paths_.checkpoint(), "the run's checkpoint");
  check_regular_or_absent(paths_.best(), "the run's best checkpoint");
  check_regular_or_absent(paths_.log(), "the run's log");
  check_regular_or_absent(paths_.sessions(), "the run's session records");
  // A run is a checkpoint, or a log with records. A run whose first `train` failed before its first save
  // (a full disk) leaves an empty log, which a new run may replace, or records without a checkpoint,
  // which cannot be continued: said as such rather than "continue it with --resume".
  std::error_code ec;
  const bool has_records = file_exists(paths_.log()) && std::filesystem::file_size(paths_.log(), ec) > 0 && !ec;
  if (!resume && !overwrite && file_exists(paths_.checkpoint()))
    fail("{} already holds a run: continue it with --resume, or replace it with --overwrite", dir);
  if (!resume && !overwrite && has_records)
    fail("{} holds the log of a run that saved no checkpoint (its first save failed?): start again with --overwrite", dir);
}

void RunDirectory::say(const std::string& text) {
  if (!main_) return;
  // The run's own log first, then the terminal, which may be gone (a killed parent's pipe: the write fails
  // and is let go, where fmt::print would throw and lose the log line too).
  const std::string line = fmt::format("[{}] {}", utc_timestamp(), text);
  if (text_log_.is_open())
    text_log_ << line << std::endl;
  else
    early_.push_back(line);
  std::fprintf(stderr, "%s\n", text.c_str());
}

void RunDirectory::start_new() {
  if (!main_) return;
  write_file_atomic(paths_.log(), "");
  write_file_atomic(paths_.text_log(), "");
  std::remove(paths_.best().c_str());
  std::remove(paths_.checkpoint().c_str());
  std::remove(paths_.sessions().c_str());
}

namespace {

// A log that a session stopped in the middle of a line (a full disk, a killed process) ends without its
// newline; the next session's first line would be glued to that piece. JSON Lines logs lose the piece
// (it is no record); train.log keeps it and gets its newline. Returns what was done, for the user ("" if
// the file ended cleanly).
std::string mend_cut_tail(const std::string& path, bool drop_piece) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return "";
  const std::string text = read_file(path);
  if (text.empty() || text.back() == '\n') return "";
  const size_t keep = text.find_last_of('\n') == std::string::npos ? 0 : text.find_last_of('\n') + 1;
  if (drop_piece) {
    std::filesystem::resize_file(path, keep, ec);
    if (ec) fail("cannot mend {} (its last record is cut short): {}", path, ec.message());
    return fmt::format("spanformer: {} ended in a record cut short ({} bytes, from a session stopped mid-write); "
                       "it is left out", path, text.size() - keep);
  }
  std::ofstream out(path, std::ios::app);
  out << "\n";
  if (!out.flush()) fail("cannot write to {}: {}", path, std::strerror(errno));
  return "";
}

}  // namespace

void RunDirectory::begin_session(const nlohmann::json& config, const std::vector<std::string>& command_line,
                                 int64_t step, int64_t world) {
  last_progress_ = now_seconds();
  if (!main_) return;
  std::vector<std::string> mended;
  for (const auto& path : {paths_.log(), paths_.sessions()})
    if (auto said = mend_cut_tail(path, /*drop_piece=*/true); !said.empty()) mended.push_back(said);
  mend_cut_tail(paths_.text_log(), /*drop_piece=*/false);
  write_file_atomic(paths_.config(), config.dump(2) + "\n");
  auto record = build_record(command_line);
  record["step"] = step;
  record["processes"] = world;
  // The session record and the text log are the run's history as much as log.jsonl: a session that
  // cannot write them stops before any work (nothing is lost yet), with the reason in one line.
  {
    std::ofstream sessions(paths_.sessions(), std::ios::app);
    sessions << record.dump() << "\n";
    if (!sessions.flush()) fail("cannot write to {}: {}", paths_.sessions(), std::strerror(errno));
  }
  text_log_.open(paths_.text_log(), std::ios::app);
  text_log_ << fmt::format("[{}] session at step {}: {}", utc_timestamp(), step, fmt::join(command_line, " ")) << std::endl;
  if (!text_log_) fail("cannot write to {}: {}", paths_.text_log(), std::strerror(errno));
  for (const auto& line : early_) text_log_ << line << std::endl;
  early_.clear();
  for (const auto& said : mended) say(said);
  log_.open(paths_.log(), std::ios::app);
  if (!log_) fail("cannot write to {}: {}", paths_.log(), std::strerror(errno));
}

void RunDirectory::lost(std::ofstream& file, bool& said, const std::string& path, const std::string& what) {
  // A line that cannot be written (a full disk, a removed directory) is said once, not lost silently;
  // training goes on, and its checkpoints fail loudly if the disk stays full.
  if (!file && !said) {
    said = true;
    fmt::print(stderr, "spanformer: warning: cannot write to {} ({}): {} are lost\n", path, std::strerror(errno), what);
  }
}

void RunDirectory::record(const nlohmann::json& record) {
  if (!main_) return;
  log_ << record.dump() << std::endl;
  lost(log_, log_lost_, paths_.log(), fmt::format("the records from step {} on", record.value("step", int64_t{-1})));
}

bool RunDirectory::progress_due() const { return text_log_.is_open() && now_seconds() - last_progress_ >= 30; }

void RunDirectory::progress(const std::string& line) {
  text_log_ << fmt::format("[{}]   {}", utc_timestamp(), line) << std::endl;
  lost(text_log_, text_log_lost_, paths_.text_log(), "its lines from here on");
  last_progress_ = now_seconds();
}

void RunDirectory::text(const std::string& line) {
  if (!text_log_.is_open()) return;
  text_log_ << fmt::format("[{}] {}", utc_timestamp(), line) << std::endl;
  lost(text_log_, text_log_lost_, paths_.text_log(), "its lines from here on");
}

// ---- IntervalLog ----------------------------------------------------------------------------------

IntervalLog::IntervalLog(Unit unit, std::string speed_key, const char* speed_unit, int64_t items_per_step, int64_t world)
    : unit_(unit), speed_key_(std::move(speed_key)), speed_unit_(speed_unit), items_per_step_(items_per_step),
      world_(world), start_(now_seconds()) {}

std::string IntervalLog::progress_line(int64_t step, int64_t nb_steps, double loss, double lr, double per_step,
                                       int64_t steps_left) const {
  return fmt::format("step {}/{} | train {:.3f} {} | lr {:.2e} | {:.0f} ms/step | {:.0f} {} | left {}", step, nb_steps,
                     in_unit(loss, unit_), unit_name(unit_), lr, per_step * 1e3,
                     static_cast<double>(items_per_step_) / per_step, speed_unit_,
                     format_duration(per_step * static_cast<double>(steps_left)));
}

nlohmann::json IntervalLog::close(Position& p, const Validation& v, double lr, double seconds, double elapsed, double eta,
                                  dist::Group* group, bool& best) {
  const double train_nll = loss_ / static_cast<double>(loss_steps_);
  last_train = in_unit(train_nll, unit_);
  last_valid = in_unit(v.nll, unit_);
  const double ms_per_step = seconds * 1e3 / static_cast<double>(steps_);
  best = v.nll < p.best_valid;
  if (best) p.best_valid = v.nll;
  const std::string unit = unit_name(unit_);
  nlohmann::json record = {
      {"step", p.step},
      {"train_loss", train_nll},
      {"valid_loss", v.nll},
      {"train_" + unit, last_train},
      {"valid_" + unit, last_valid},
      {"lr", lr},
      {"ms_per_step", ms_per_step},
      {speed_key_, static_cast<double>(items_per_step_) * 1e3 / ms_per_step},
      {"elapsed_s", p.elapsed_seconds + elapsed},
      {"eta_s", eta},
      {"processes", world_},
      {"best_valid_loss", p.best_valid},
  };
  if (unit_ == Unit::kNats) {  // example data: the loss is already in nats; the accuracy is what users read
    record.erase("train_" + unit);
    record.erase("valid_" + unit);
    record["valid_acc"] = v.accuracy;
  }
  if (group) {
    record["allreduce_ms_per_step"] = (group->collective_seconds() - collective_) * 1e3 / static_cast<double>(steps_);
    collective_ = group->collective_seconds();
  }
  loss_ = 0;
  loss_steps_ = 0;
  steps_ = 0;
  return record;
}

std::string IntervalLog::line(const nlohmann::json& record, double eta, double accuracy, const std::string& extra) const {
  const double ms_per_step = record["ms_per_step"].get<double>();
  const char* unit = unit_name(unit_);
  return fmt::format("step {:>7} | train {:.3f} {} | valid {:.3f} {}{} | {:.0f} ms/step | {:.0f} {} | left {}{}",
                     record["step"].get<int64_t>(), last_train, unit, last_valid, unit,
                     unit_ == Unit::kNats ? fmt::format(" | valid acc {:.2f}%", 100 * accuracy) : "", ms_per_step,
                     static_cast<double>(items_per_step_) * 1e3 / ms_per_step, speed_unit_, format_duration(eta), extra);
}

}  // namespace spanformer::train::run
