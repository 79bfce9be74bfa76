#include "spanformer/dist/group.h"

#include <c10/util/Logging.h>

#include <cerrno>
#include <csignal>
#include <limits>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "impl.h"
#include "spanformer/util/error.h"
#include "spanformer/util/names.h"

#if SPANFORMER_HAS_C10D_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#if SPANFORMER_HAS_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace spanformer::dist {

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int env_int(const char* name, const char* fallback_name, long max = std::numeric_limits<int>::max()) {
  const char* v = env(name) ? env(name) : env(fallback_name);
  if (!v) fail("distributed launch: {} is not set", name);
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(v, &end, 10);
  if (*end != '\0' || value < 0 || value > max || errno == ERANGE)
    fail("distributed launch: {}='{}' is not an integer in [0, {}]", name, v, max);
  return static_cast<int>(value);
}

}  // namespace

constexpr auto kBackendNames = name_table("dist_backend", std::pair{Backend::kAuto, "auto"},
                                          std::pair{Backend::kGloo, "gloo"}, std::pair{Backend::kNccl, "nccl"});

const char* backend_name(Backend value) { return kBackendNames.name(value); }
Backend parse_backend(const std::string& name) { return kBackendNames.parse(name); }

Group::~Group() = default;

std::shared_ptr<Group> Group::from_env(const GroupOptions& options) {
  const char* world_text = env("WORLD_SIZE") ? env("WORLD_SIZE") : env("SLURM_NTASKS");
  // One process is no job, unless a backend was asked for by name: then a group of one runs every
  // collective (how a single GPU checks the NCCL path against a plain run).
  if (!world_text || (std::string(world_text) == "1" && options.backend == Backend::kAuto)) return nullptr;
  const Backend backend = options.backend == Backend::kAuto ? (options.cuda ? Backend::kNccl : Backend::kGloo) : options.backend;
  if (backend == Backend::kNccl && !SPANFORMER_HAS_C10D_NCCL)
    fail("the nccl backend needs a CUDA build of spanformer with NCCL (-DSPANFORMER_CUDA=ON against a CUDA "
         "LibTorch); this one has gloo (set train.dist_backend=gloo)");
  if (backend == Backend::kNccl && !options.cuda) fail("the nccl backend runs on CUDA: set train.device=cuda");
  std::shared_ptr<Group> group(new Group());
  group->world_ = env_int("WORLD_SIZE", "SLURM_NTASKS");
  group->rank_ = env_int("RANK", "SLURM_PROCID");
  // One GPU per process on a node: the node-local rank picks it (torchrun: LOCAL_RANK; SLURM: SLURM_LOCALID).
  group->local_rank_ = (env("LOCAL_RANK") || env("SLURM_LOCALID")) ? env_int("LOCAL_RANK", "SLURM_LOCALID") : 0;
  if (backend == Backend::kNccl) group->device_ = c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(group->local_rank_));
  if (group->rank_ >= group->world_) fail("distributed launch: RANK {} >= WORLD_SIZE {}", group->rank_, group->world_);
  const char* addr = env("MASTER_ADDR");
  if (!addr) fail("distributed launch: MASTER_ADDR is not set");
  const int port = env_int("MASTER_PORT", "MASTER_PORT", 65535);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(options.timeout_seconds * 1000));
  group->impl_ = std::make_unique<Impl>();
  // A peer that dies closes its sockets; writing to one must fail as an error (the collective's one-line
  // message), not kill this process silently with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  // c10d logs every failed connection attempt, each with a C++ stack trace; the one-line message below
  // says what happened, so its log is quiet while this rank joins (c10's level: 3 = fatal only).
  struct QuietC10Log {
    int previous = FLAGS_caffe2_log_level;
    QuietC10Log() { FLAGS_caffe2_log_level = 3; }
    ~QuietC10Log() { FLAGS_caffe2_log_level = previous; }
  } quiet;
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(port);
    store_options.isServer = group->rank_ == 0;
    store_options.numWorkers = group->world_;
    store_options.waitWorkers = true;
    store_options.timeout = timeout;
    group->impl_->store = c10::make_intrusive<c10d::TCPStore>(addr, store_options);
    if (backend == Backend::kNccl) {
#if SPANFORMER_HAS_C10D_NCCL
      auto pg_options = c10d::ProcessGroupNCCL::Options::create();
      pg_options->timeout = timeout;
      group->impl_->pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(group->impl_->store, group->rank_, group->world_,
                                                                     pg_options);
#endif
    } else {
#if SPANFORMER_HAS_C10D_GLOO
      auto pg_options = c10d::ProcessGroupGloo::Options::create();
      pg_options->timeout = timeout;
      pg_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      group->impl_->pg =
          c10::make_intrusive<c10d::ProcessGroupGloo>(group->impl_->store, group->rank_, group->world_, pg_options);
#else
      fail("rank {}: this spanformer was built against a LibTorch without gloo headers (install libgloo-dev and "
           "rebuild): no data parallelism on the CPU", group->rank_);
#endif
    }
    // Nobody leaves until everyone has joined: a rank that fails just after joining (a batch the group
    // cannot split, which every rank finds) must not close its sockets while a peer is still connecting,
    // or Gloo prints its own error beside the one-line message.
    auto& store = *group->impl_->store;
    std::vector<std::string> joined;
    for (int r = 0; r < group->world_; ++r) joined.push_back("spanformer/joined/" + std::to_string(r));
    store.set(joined[group->rank_], std::vector<uint8_t>{1});
    store.wait(joined, timeout);
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
  for (const auto& t : tensors) flat_parts.push_back(t.reshape({-1}).to(device_));
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
  std::vector<at::Tensor> t = {at::full({1}, value, at::TensorOptions(at::kDouble).device(device_))};
  collective("all-reduce", rank_, [&] { impl_->pg->allreduce(t)->wait(); });
  return t[0].item<double>();
}

at::Tensor Group::all_gather_cat(const at::Tensor& tensor) {
  if (tensor.numel() == 0) {  // e.g. the empty memory of a feed-forward block: Gloo divides by the size
    auto sizes = tensor.sizes().vec();
    sizes[0] *= world_;
    return at::empty(sizes, tensor.options());
  }
  std::vector<at::Tensor> input = {tensor.to(device_).contiguous()};  // NCCL: on the group's GPU
  std::vector<std::vector<at::Tensor>> output(1);
  for (int r = 0; r < world_; ++r) output[0].push_back(at::empty_like(input[0]));
  collective("all-gather", rank_, [&] { impl_->pg->allgather(output, input)->wait(); });
  return at::cat(output[0], 0).to(tensor.device());
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

std::string process_device(const std::string& device, const Group* group) {
  if (group == nullptr || device != "cuda") return device;
  return "cuda:" + std::to_string(group->local_rank());
}

void Group::barrier() {
  collective("barrier", rank_, [&] { impl_->pg->barrier()->wait(); });
}

}  // namespace spanformer::dist
