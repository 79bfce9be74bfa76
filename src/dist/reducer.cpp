#include "spanformer/dist/reducer.h"

#include <torch/autograd.h>

#include "impl.h"

namespace spanformer::dist {

using WorkPtr = decltype(std::declval<Collectives&>().allreduce(std::declval<std::vector<at::Tensor>&>()));

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

}  // namespace spanformer::dist
