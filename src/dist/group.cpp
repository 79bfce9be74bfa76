#include "spanformer/dist/group.h"

#include <cerrno>
#include <limits>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <thread>

#include "impl.h"
#include "spanformer/util/error.h"

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
  const int port = env_int("MASTER_PORT", "MASTER_PORT", 65535);
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
#if SPANFORMER_HAS_C10D_GLOO
    auto pg_options = c10d::ProcessGroupGloo::Options::create();
    pg_options->timeout = timeout;
    pg_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    group->impl_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(group->impl_->store, group->rank_, group->world_, pg_options);
#else
    fail("rank {}: this spanformer was built against a LibTorch without gloo headers: no data parallelism",
         group->rank_);
#endif
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

}  // namespace spanformer::dist
