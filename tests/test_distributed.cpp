// Data-parallel training through the real command line on Gloo over loopback: W processes give the
// parameters one process gives, checkpoints resume across W, a dead rank stops the others with a
// message, and ranks with different configs are refused.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "spanformer/train/checkpoint.h"
#include "spanformer/train/family.h"
#include "util.h"

using namespace spanformer;

namespace {

struct Proc {
  pid_t pid;
  std::string err;
};

// Starts the CLI with args and extra environment; stderr goes to err_path.
Proc start(const std::vector<std::string>& args, const std::vector<std::pair<std::string, std::string>>& env,
           const std::string& err_path) {
  pid_t pid = fork();
  if (pid == 0) {
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    FILE* err = freopen(err_path.c_str(), "w", stderr);
    FILE* out = freopen("/dev/null", "w", stdout);
    (void)err;
    (void)out;
    std::vector<char*> argv = {const_cast<char*>(SPANFORMER_CLI)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(SPANFORMER_CLI, argv.data());
    _exit(127);
  }
  return {pid, err_path};
}

// Exit status, or -1 when still running after `seconds` (the process is then killed).
int wait_for(pid_t pid, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

int run(const std::vector<std::string>& args, const std::string& err_path, double seconds = 120) {
  return wait_for(start(args, {}, err_path).pid, seconds);
}

class Distributed : public ::testing::Test {
 protected:
  void SetUp() override {
    tu::prepare_dickens_slice(tmp_.path(), 200000);
    tu::write_text(tmp_.file("c.json"), R"({
      "model": {"nb_layers": 2, "hidden_size": 32, "inner_hidden_size": 64, "nb_heads": 2, "attn_span": 64,
                "block_size": 32, "adapt_span_init": 0.2, "adapt_span_loss": 0.5},
      "train": {"optim": "sgd", "lr": 0.1, "grad_clip": 0, "batch_size": 4, "batch_split": 2, "nb_steps": 6, "eval_interval": 3, "eval_blocks": 2,
                "lr_warmup": 2, "dist_timeout": 20, "threads": 1}})");
  }
  std::vector<std::string> train_args(const std::string& out) {
    return {"train", "-c", tmp_.file("c.json"), "--data", tmp_.path(), "--out", tmp_.file(out), "--quiet"};
  }
  static std::vector<std::string> plus(std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }
  // Largest parameter difference between two checkpoints.
  static double max_param_diff(const std::string& a, const std::string& b) {
    train::Checkpoint ca(a), cb(b);
    double diff = 0;
    int compared = 0;
    const auto manifest = nlohmann::json::parse(ca.text("manifest"));
    for (const auto& [key, digest] : manifest.items()) {
      if (key.rfind("model.", 0) != 0) continue;
      diff = std::max(diff, (ca.tensor(key) - cb.tensor(key)).abs().max().item<double>());
      ++compared;
    }
    EXPECT_GT(compared, 0);
    return diff;
  }
  tu::TempDir tmp_;
};

// float32 gradients summed in another order (per rank, then across ranks), through 6 SGD steps.
// (SGD, not Adagrad: Adagrad divides each element by its own gradient and turns the summation-order
// noise of near-zero gradients, e.g. at the mask's zero point once spans are clamped to 0, into
// full-size steps of either sign.) Measured 1.2e-7; 1e-5 leaves room while a wrong average fails.
constexpr double kTolerance = 1e-5;

}  // namespace

TEST_F(Distributed, TwoProcessesGiveTheParametersOfOne) {
  ASSERT_EQ(run(train_args("one"), tmp_.file("one.err")), 0) << tu::read_file_or_empty(tmp_.file("one.err"));
  ASSERT_EQ(run(plus(train_args("two"), {"--nproc-per-node", "2"}), tmp_.file("two.err")), 0)
      << tu::read_file_or_empty(tmp_.file("two.err"));
  EXPECT_LT(max_param_diff(tmp_.file("one/checkpoint.pt"), tmp_.file("two/checkpoint.pt")), kTolerance);
  // The same with many small buckets all-reduced while backward runs (1 KB: 15 buckets here, started
  // from hooks in backward's order), and with one bucket after backward.
  for (const char* kb : {"1", "0"}) {
    const std::string out = std::string("two_kb") + kb;
    ASSERT_EQ(run(plus(train_args(out), {"--nproc-per-node", "2", std::string("--dist_bucket_kb=") + kb}),
                  tmp_.file(out + ".err")), 0)
        << tu::read_file_or_empty(tmp_.file(out + ".err"));
    EXPECT_LT(max_param_diff(tmp_.file("one/checkpoint.pt"), tmp_.file(out + "/checkpoint.pt")), kTolerance) << kb;
  }
  // The strong span loss drives every span below 0 within the first steps: the clamp must have put
  // them back at exactly 0 on every rank (a missing or rank-local clamp leaves them negative or apart).
  for (const char* run : {"one", "two"}) {
    train::Checkpoint ck(tmp_.file(std::string(run) + "/checkpoint.pt"));
    for (const auto& layer : train::family_from_checkpoint(ck)->need<train::Spans>().spans())
      for (double z : layer) EXPECT_EQ(z, 0.0) << run;
  }
}

// WORLD_SIZE=1 with a backend named: a group of one runs every collective (the averaging, the gathered
// state in checkpoints), and must give the plain run's parameters bit for bit (a GPU machine checks the
// NCCL path this way; here Gloo). With the backend left to auto, WORLD_SIZE=1 is a plain run.
TEST_F(Distributed, AGroupOfOneGivesThePlainRunBitForBit) {
  ASSERT_EQ(run(train_args("plain"), tmp_.file("plain.err")), 0) << tu::read_file_or_empty(tmp_.file("plain.err"));
  const std::vector<std::pair<std::string, std::string>> env = {
      {"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(20000 + (getpid() + 13) % 20000)}};
  auto p = start(plus(train_args("group"), {"--dist_backend=gloo"}), env, tmp_.file("group.err"));
  ASSERT_EQ(wait_for(p.pid, 120), 0) << tu::read_file_or_empty(tmp_.file("group.err"));
  EXPECT_EQ(max_param_diff(tmp_.file("plain/checkpoint.pt"), tmp_.file("group/checkpoint.pt")), 0.0);
  const auto log = tu::read_file_or_empty(tmp_.file("group/train.log"));
  EXPECT_NE(log.find("1 processes; gradients all-reduced"), std::string::npos) << log;  // the group ran
}

// The same equivalence for the Transformer-XL family (it runs on the same runner and reducer): memories
// carried per rank, a feed-forward block whose memory is empty, adaptive span on.
TEST_F(Distributed, TransformerXlTwoProcessesGiveTheParametersOfOne) {
  tu::write_text(tmp_.file("xl.json"), R"({"arch": "xl",
      "model": {"n_layer": 2, "layers": "aaf", "d_model": 32, "n_head": 2, "d_head": 16, "d_inner": 64, "tgt_len": 16,
                "mem_len": 16, "dropout": 0.0, "adapt_span": true, "adapt_span_init": 0.5},
      "train": {"optim": "sgd", "lr": 0.1, "grad_clip": 0, "batch_size": 4, "batch_split": 2, "nb_steps": 6,
                "eval_interval": 3, "eval_blocks": 2, "lr_warmup": 2, "dist_timeout": 20, "threads": 1}})");
  auto args = [&](const std::string& out) {
    return std::vector<std::string>{"train", "-c", tmp_.file("xl.json"), "--data", tmp_.path(), "--out", tmp_.file(out), "--quiet"};
  };
  ASSERT_EQ(run(args("xl1"), tmp_.file("xl1.err")), 0) << tu::read_file_or_empty(tmp_.file("xl1.err"));
  ASSERT_EQ(run(plus(args("xl2"), {"--nproc-per-node", "2"}), tmp_.file("xl2.err")), 0)
      << tu::read_file_or_empty(tmp_.file("xl2.err"));
  EXPECT_LT(max_param_diff(tmp_.file("xl1/checkpoint.pt"), tmp_.file("xl2/checkpoint.pt")), kTolerance);
  // Memories are saved for all streams, gathered from both ranks, equal to the one-process run's.
  train::Checkpoint a(tmp_.file("xl1/checkpoint.pt")), b(tmp_.file("xl2/checkpoint.pt"));
  for (const char* key : {"state.mem.0", "state.mem.1"}) {
    ASSERT_EQ(a.tensor(key).sizes(), b.tensor(key).sizes()) << key;
    EXPECT_LT((a.tensor(key) - b.tensor(key)).abs().max().item<double>(), 1e-4) << key;
  }
}

TEST_F(Distributed, CheckpointsResumeWithAnotherNumberOfProcesses) {
  ASSERT_EQ(run(train_args("ref"), tmp_.file("ref.err")), 0);
  for (const char* resume_procs : {"1", "2"}) {
    const std::string dir = std::string("run") + resume_procs;
    ASSERT_EQ(run(plus(train_args(dir), {"--nproc-per-node", "2", "--stop-after", "3"}), tmp_.file("a.err")), 0)
        << tu::read_file_or_empty(tmp_.file("a.err"));
    ASSERT_EQ(run(plus(train_args(dir), {"--nproc-per-node", resume_procs, "--resume"}), tmp_.file("b.err")), 0)
        << tu::read_file_or_empty(tmp_.file("b.err"));
    EXPECT_LT(max_param_diff(tmp_.file("ref/checkpoint.pt"), tmp_.file(dir + "/checkpoint.pt")), kTolerance) << resume_procs;
  }
}

TEST_F(Distributed, ADeadRankStopsTheOthersWithAMessage) {
  const std::string port = std::to_string(20000 + getpid() % 20000);
  auto env = [&](int rank) {
    return std::vector<std::pair<std::string, std::string>>{
        {"RANK", std::to_string(rank)}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}};
  };
  auto args = plus(train_args("killed"), {"--optim=adagrad", "--lr=0.07", "--grad_clip=0.03", "--nb_steps=100000",
                                          "--eval_interval=100000", "--checkpoint_interval=2",
                                          "--dist_timeout=5"});
  Proc r0 = start(args, env(0), tmp_.file("r0.err"));
  Proc r1 = start(args, env(1), tmp_.file("r1.err"));
  // Wait for a complete checkpoint, then kill rank 1 as a crash would.
  for (int i = 0; i < 600 && !file_exists(tmp_.file("killed/checkpoint.pt")); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(file_exists(tmp_.file("killed/checkpoint.pt")));
  kill(r1.pid, SIGKILL);
  waitpid(r1.pid, nullptr, 0);
  const int status = wait_for(r0.pid, 30);  // the timeout is 5 s
  EXPECT_GT(status, 0) << "rank 0 did not stop";
  auto message = tu::read_file_or_empty(r0.err);
  EXPECT_NE(message.find("another rank died or hung"), std::string::npos) << "exit status " << status << ": " << message;
  train::Checkpoint checkpoint(tmp_.file("killed/checkpoint.pt"));  // intact and loadable
  EXPECT_TRUE(checkpoint.has_train_state());
}

TEST_F(Distributed, RanksWithDifferentConfigsAreRefused) {
  const std::string port = std::to_string(20000 + (getpid() + 7) % 20000);
  auto env = [&](int rank) {
    return std::vector<std::pair<std::string, std::string>>{
        {"RANK", std::to_string(rank)}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}};
  };
  Proc r0 = start(train_args("mismatch"), env(0), tmp_.file("m0.err"));
  Proc r1 = start(plus(train_args("mismatch"), {"--lr=0.5"}), env(1), tmp_.file("m1.err"));
  EXPECT_GT(wait_for(r0.pid, 60), 0);
  EXPECT_GT(wait_for(r1.pid, 60), 0);
  EXPECT_NE(tu::read_file_or_empty(r1.err).find("started with another config than rank 0"), std::string::npos)
      << tu::read_file_or_empty(r1.err);
  EXPECT_FALSE(file_exists(tmp_.file("mismatch/checkpoint.pt")));
}
