#include "spanformer/dist/group.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <thread>

#include "spanformer/util/error.h"

namespace spanformer::dist {

struct Group::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
};

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int env_int(const char* name, const char* fallback_name) {
  const char* v = env(name) ? env(name) : env(fallback_name);
  if (!v) fail("distributed launch: {} is not set", name);
  char* end = nullptr;
  long value = std::strtol(v, &end, 10);
  if (*end != '\0' || value < 0) fail("distributed launch: {}='{}' is not a non-negative integer", name, v);
  return static_cast<int>(value);
}

// Runs a collective and turns a failure (a peer that died or hung) into one clear message.
template <typename F>
void collective(const char* what, int rank, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    fail("rank {}: {} failed, another rank died or hung ({})", rank, what, one_line_message(e));
  }
}

}  // namespace

Group::~Group() = default;

std::shared_ptr<Group> Group::from_env(const GroupOptions& options) {
  const char* world_text = env("WORLD_SIZE") ? env("WORLD_SIZE") : env("SLURM_NTASKS");
  if (!world_text || std::string(world_text) == "1") return nullptr;
  const std::string backend = options.backend == "auto" ? (options.cuda ? "nccl" : "gloo") : options.backend;
  if (backend != "gloo")
    fail("the {} backend is not built into spanformer yet (gloo is; set train.dist_backend=gloo)", backend);
  std::shared_ptr<Group> group(new Group());
  group->world_ = env_int("WORLD_SIZE", "SLURM_NTASKS");
  group->rank_ = env_int("RANK", "SLURM_PROCID");
  if (group->rank_ >= group->world_) fail("distributed launch: RANK {} >= WORLD_SIZE {}", group->rank_, group->world_);
  const char* addr = env("MASTER_ADDR");
  if (!addr) fail("distributed launch: MASTER_ADDR is not set");
  const int port = env_int("MASTER_PORT", "MASTER_PORT");
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(options.timeout_seconds * 1000));
  group->impl_ = std::make_unique<Impl>();
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(port);
    store_options.isServer = group->rank_ == 0;
    store_options.numWorkers = group->world_;
    store_options.waitWorkers = true;
    store_options.timeout = timeout;
    group->impl_->store = c10::make_intrusive<c10d::TCPStore>(addr, store_options);
    auto pg_options = c10d::ProcessGroupGloo::Options::create();
    pg_options->timeout = timeout;
    pg_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    group->impl_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(group->impl_->store, group->rank_, group->world_, pg_options);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail("rank {}: cannot join the job at {}:{} ({})", group->rank_, addr, port, one_line_message(e));
  }
  return group;
}

void Group::all_reduce_mean(const std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) return;
  std::vector<at::Tensor> flat_parts;
  for (const auto& t : tensors) flat_parts.push_back(t.reshape({-1}));
  std::vector<at::Tensor> bucket = {at::cat(flat_parts)};
  const auto start = std::chrono::steady_clock::now();
  collective("all-reduce", rank_, [&] { impl_->pg->allreduce(bucket)->wait(); });
  collective_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  bucket[0].div_(world_);
  int64_t offset = 0;
  for (const auto& t : tensors) {
    t.copy_(bucket[0].narrow(0, offset, t.numel()).view_as(t));
    offset += t.numel();
  }
}

double Group::all_reduce_sum(double value) {
  std::vector<at::Tensor> t = {at::full({1}, value, at::kDouble)};
  collective("all-reduce", rank_, [&] { impl_->pg->allreduce(t)->wait(); });
  return t[0].item<double>();
}

at::Tensor Group::all_gather_cat(const at::Tensor& tensor) {
  std::vector<at::Tensor> input = {tensor.contiguous()};
  std::vector<std::vector<at::Tensor>> output(1);
  for (int r = 0; r < world_; ++r) output[0].push_back(at::empty_like(input[0]));
  collective("all-gather", rank_, [&] { impl_->pg->allgather(output, input)->wait(); });
  return at::cat(output[0], 0);
}

void Group::check_same_as_main(const std::string& what, const std::string& text) {
  const std::string key = "spanformer/" + what;
  std::string main_text;
  collective("start-up check", rank_, [&] {
    if (rank_ == 0) impl_->store->set(key, std::vector<uint8_t>(text.begin(), text.end()));
    auto bytes = impl_->store->get(key);
    main_text.assign(bytes.begin(), bytes.end());
  });
  const bool same = main_text == text;
  const double mismatches = all_reduce_sum(same ? 0.0 : 1.0);
  if (!same) fail("rank {} was started with another {} than rank 0: refusing to train", rank_, what);
  if (mismatches > 0) fail("rank {}: another rank was started with another {} than rank 0: refusing to train", rank_, what);
}

void Group::barrier() {
  collective("barrier", rank_, [&] { impl_->pg->barrier()->wait(); });
}

int spawn_local_workers(int n, const std::vector<std::string>& args) {
  // A free port for the store, chosen by the kernel.
  int sock = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (sock < 0 || ::bind(sock, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(sock, reinterpret_cast<sockaddr*>(&address), &length) != 0)
    fail("cannot find a free local port for the workers");
  const int port = ntohs(address.sin_port);
  ::close(sock);

  std::vector<pid_t> children;
  for (int r = 0; r < n; ++r) {
    pid_t pid = ::fork();
    if (pid < 0) fail("cannot start worker {}", r);
    if (pid == 0) {
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      // OpenBLAS starts one thread per core in every process: share the cores instead.
      const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
      setenv("OPENBLAS_NUM_THREADS", std::to_string(std::max(1u, cores / static_cast<unsigned>(n))).c_str(), 0);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv("/proc/self/exe", argv.data());
      _exit(127);
    }
    children.push_back(pid);
  }
  int status_out = 0;
  size_t running = children.size();
  while (running > 0) {
    int status = 0;
    pid_t pid = ::wait(&status);
    if (pid < 0) break;
    --running;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && status_out == 0) {
      status_out = code;
      // One worker failed: the others cannot finish a step without it.
      for (pid_t other : children)
        if (other != pid) ::kill(other, SIGTERM);
    }
  }
  return status_out;
}

}  // namespace spanformer::dist
