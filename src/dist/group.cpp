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

// ---- GradientReducer ---------------------------------------------------------------------------

using WorkPtr = decltype(std::declval<c10d::ProcessGroupGloo&>().allreduce(std::declval<std::vector<at::Tensor>&>()));

struct GradientReducer::State {
  std::shared_ptr<Group> group;
  std::vector<at::Tensor> params;
  std::vector<unsigned> hook_ids;
  struct Bucket {
    std::vector<int64_t> members;  // parameter indices
    std::vector<int64_t> offsets;  // of each member in `flat`
    at::Tensor flat;
    int64_t pending = 0;
    WorkPtr work;
  };
  std::vector<Bucket> buckets;
  std::vector<int64_t> bucket_of, slot_of;  // per parameter
  std::vector<bool> ready;                  // per parameter, this step
  int64_t next_launch = 0;
  bool armed = false;

  void launch_ready() {
    while (next_launch < static_cast<int64_t>(buckets.size()) && buckets[next_launch].pending == 0) {
      std::vector<at::Tensor> t = {buckets[next_launch].flat};
      auto& b = buckets[next_launch];
      collective("all-reduce", group->rank(), [&] { b.work = group->impl_->pg->allreduce(t); });
      ++next_launch;
    }
  }
  void put(int64_t i, const at::Tensor& grad) {
    auto& b = buckets[bucket_of[i]];
    b.flat.narrow(0, b.offsets[slot_of[i]], params[i].numel()).copy_(grad.reshape({-1}));
    ready[i] = true;
    --b.pending;
    launch_ready();
  }
};

GradientReducer::GradientReducer(std::shared_ptr<Group> group, const std::vector<at::Tensor>& params,
                                 int64_t bucket_bytes)
    : state_(std::make_unique<State>()) {
  auto& s = *state_;
  s.group = std::move(group);
  s.params = params;
  s.bucket_of.assign(params.size(), 0);
  s.slot_of.assign(params.size(), 0);
  s.ready.assign(params.size(), false);
  for (int64_t i = static_cast<int64_t>(params.size()) - 1; i >= 0; --i) {
    if (s.buckets.empty() || s.buckets.back().flat.defined()) s.buckets.emplace_back();
    auto& b = s.buckets.back();
    const int64_t offset = b.offsets.empty() ? 0 : b.offsets.back() + params[b.members.back()].numel();
    s.bucket_of[i] = static_cast<int64_t>(s.buckets.size()) - 1;
    s.slot_of[i] = static_cast<int64_t>(b.members.size());
    b.members.push_back(i);
    b.offsets.push_back(offset);
    const int64_t size = offset + params[i].numel();
    if (size * static_cast<int64_t>(params[i].element_size()) >= bucket_bytes || i == 0)
      b.flat = at::zeros({size}, params[i].options().requires_grad(false));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    State* st = state_.get();
    const auto idx = static_cast<int64_t>(i);
    s.hook_ids.push_back(s.params[i].register_hook([st, idx](const at::Tensor& grad) {
      if (!st->armed || st->ready[idx]) return;
      const auto& p = st->params[idx];
      st->put(idx, p.grad().defined() ? p.grad() + grad : grad);  // the gradient .grad will hold
    }));
  }
}

GradientReducer::~GradientReducer() {
  for (size_t i = 0; i < state_->params.size(); ++i) state_->params[i].remove_hook(state_->hook_ids[i]);
}

int64_t GradientReducer::nb_buckets() const { return static_cast<int64_t>(state_->buckets.size()); }

void GradientReducer::arm() {
  auto& s = *state_;
  s.armed = true;
  s.next_launch = 0;
  std::fill(s.ready.begin(), s.ready.end(), false);
  for (auto& b : s.buckets) b.pending = static_cast<int64_t>(b.members.size());
}

void GradientReducer::finish() {
  auto& s = *state_;
  if (!s.armed) fail("GradientReducer::finish without arm");
  // Parameters that got no gradient in the armed pass contribute what .grad holds (or zeros).
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (s.ready[i]) continue;
    const auto& p = s.params[i];
    s.put(static_cast<int64_t>(i), p.grad().defined() ? p.grad() : at::zeros_like(p));
  }
  const auto start = std::chrono::steady_clock::now();
  for (auto& b : s.buckets) collective("all-reduce", s.group->rank(), [&] { b.work->wait(); });
  s.group->collective_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double world = s.group->world();
  for (auto& b : s.buckets) {
    b.flat.div_(world);
    for (size_t k = 0; k < b.members.size(); ++k) {
      auto& p = s.params[b.members[k]];
      auto mean = b.flat.narrow(0, b.offsets[k], p.numel()).view_as(p);
      if (p.grad().defined()) p.mutable_grad().copy_(mean);
      else p.mutable_grad() = mean.clone();
    }
    b.work = WorkPtr();
  }
  s.armed = false;
}

double Group::all_reduce_sum(double value) {
  std::vector<at::Tensor> t = {at::full({1}, value, at::kDouble)};
  collective("all-reduce", rank_, [&] { impl_->pg->allreduce(t)->wait(); });
  return t[0].item<double>();
}

at::Tensor Group::all_gather_cat(const at::Tensor& tensor) {
  if (tensor.numel() == 0) {  // e.g. the empty memory of a feed-forward block: Gloo divides by the size
    auto sizes = tensor.sizes().vec();
    sizes[0] *= world_;
    return at::empty(sizes, tensor.options());
  }
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
