// Perf mode of the ops' case lists (tests/op_cases.h): every case marked perf, timed on one backend,
// the op's row beside its reference composition, interleaved, medians of the repetitions.
//
//   spanformer_tests --op-perf [span|flash|all] [--device cpu|cuda] [--dtype float32|bfloat16|float16] [--reps N]
//                              [--row NAME] [--fwd] [--row-only]
//
// --row runs the flash op on that row of its table (ops::flash_attention_backends(); default: the row
// the table picks); --fwd times the forward only, --row-only leaves the reference out (both for a
// profiler). Prints one line per case: the row of
// the op's backend table that ran, forward and forward + backward
// milliseconds of that row and of the reference, and the reference / row ratio of forward + backward. Numbers belong in docs/kernels.md with the machine.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "op_cases.h"

namespace spanformer::tu {
namespace {

struct Setup {
  std::string op = "all";
  at::Device device = at::kCPU;
  at::ScalarType dtype = at::kFloat;
  int reps = 5;
  std::string row;           // flash: the row to force (empty: the table's choice)
  bool forward_only = false;
  bool row_only = false;
};

double now_ms(const Setup& s) {
  if (s.device.is_cuda()) torch::cuda::synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Times f (forward only: no gradient kept) and f + backward, the row and the reference alternating.
using Forward = std::function<at::Tensor(const Inputs&)>;
void time_case(const Setup& s, const std::string& label, const char* row_name, const Inputs& inputs, const Forward& row,
               const Forward& reference) {
  std::vector<double> times[4];  // row fwd, reference fwd, row fwd+bwd, reference fwd+bwd
  for (int r = 0; r <= s.reps; ++r) {  // the first round warms up and is not kept
    for (int which = 0; which < (s.row_only ? 1 : 2); ++which) {
      const Forward& f = which == 0 ? row : reference;
      double t0 = now_ms(s);
      {
        at::NoGradGuard no_grad;
        f(inputs);
      }
      double t1 = now_ms(s);
      if (!s.forward_only) {
        auto out = f(inputs);
        auto grads = torch::autograd::grad({out.sum()}, inputs);
      }
      double t2 = now_ms(s);
      if (r > 0) {
        times[which].push_back(t1 - t0);
        times[2 + which].push_back(t2 - t1);
      }
    }
  }
  if (s.row_only) {
    std::printf("%-62s  %-5s %9.2f / %9.2f ms\n", label.c_str(), row_name, median(times[0]), median(times[2]));
    std::fflush(stdout);
    return;
  }
  const double rf = median(times[0]), ef = median(times[1]), rb = median(times[2]), eb = median(times[3]);
  std::printf("%-62s  %-5s %9.2f / %9.2f ms   reference %9.2f / %9.2f ms   x%.2f\n", label.c_str(), row_name, rf, rb, ef,
              eb, eb / rb);
  std::fflush(stdout);
}

Inputs on(const std::vector<at::Tensor>& doubles, const Setup& s) {
  Inputs in;
  for (const auto& t : doubles) in.push_back(t.to(s.device, s.dtype).requires_grad_(true));
  return in;
}

// What perf needs of one case: its label, its inputs in double, and the op's row and reference.
struct PerfRun {
  std::string label;
  std::vector<at::Tensor> inputs;
  Forward row, reference;
};

template <class Case, class Make>
void perf(const Setup& s, const char* op, const std::vector<Case>& all, const char* (*row_name)(const at::Tensor&),
          Make make) {
  std::printf("%s (fwd / fwd+bwd, median of %d):\n", op, s.reps);
  for (const auto& c : cases_of(all, true)) {
    const PerfRun run = make(c);
    const auto in = on(run.inputs, s);
    time_case(s, run.label, row_name(in[0]), in, run.row, run.reference);
  }
}

void span_perf(const Setup& s) {
  perf(s, "adaptive_span_attention", span_cases(), ops::adaptive_span_attention_backend, [](const SpanCase& c) {
    const auto o = span_options(c);
    return PerfRun{span_label(c), span_inputs(c),
                   [o](const Inputs& x) { return ops::adaptive_span_attention(x[0], x[1], x[2], x[3], x[4], o); },
                   [o](const Inputs& x) { return ops::adaptive_span_attention_reference(x[0], x[1], x[2], x[3], x[4], o); }};
  });
}

// The flash cases ask for the CUDA kernels (flash_options: cuda_kernel), so the row is named for that.
const char* flash_row(const at::Tensor& q) { return ops::flash_attention_backend(q, true); }

void flash_perf(const Setup& s) {
  std::optional<ops::FlashBackendOverride> forced;
  if (!s.row.empty()) forced.emplace(s.row);
  perf(s, "flash_attention", flash_cases(), flash_row, [](const FlashCase& c) {
    const auto o = flash_options(c);
    return PerfRun{flash_label(c), flash_inputs(c), [o](const Inputs& x) { return ops::flash_attention(x[0], x[1], x[2], o); },
                   [o](const Inputs& x) { return ops::flash_attention_reference(x[0], x[1], x[2], o); }};
  });
}

}  // namespace

// argv after "--op-perf"; returns the process status.
int op_perf_main(const std::vector<std::string>& args) {
  Setup s;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) {
        std::fprintf(stderr, "--op-perf: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return args[++i];
    };
    if (a == "span" || a == "flash" || a == "all") {
      s.op = a;
    } else if (a == "--device") {
      const std::string d = value();
      if (d != "cpu" && d != "cuda") return std::fprintf(stderr, "--op-perf: --device is cpu or cuda (got %s)\n", d.c_str()), 2;
      if (d == "cuda" && !torch::cuda::is_available()) return std::fprintf(stderr, "--op-perf: no CUDA device\n"), 2;
      s.device = d == "cuda" ? at::Device(at::kCUDA) : at::Device(at::kCPU);
    } else if (a == "--dtype") {
      const std::string d = value();
      if (d == "float32") s.dtype = at::kFloat;
      else if (d == "bfloat16") s.dtype = at::kBFloat16;
      else if (d == "float16") s.dtype = at::kHalf;
      else return std::fprintf(stderr, "--op-perf: --dtype is float32, bfloat16 or float16 (got %s)\n", d.c_str()), 2;
    } else if (a == "--row") {
      s.row = value();
    } else if (a == "--row-only") {
      s.row_only = true;
    } else if (a == "--fwd") {
      s.forward_only = true;
    } else if (a == "--reps") {
      const std::string r = value();
      s.reps = std::max(1, std::atoi(r.c_str()));
    } else {
      return std::fprintf(stderr, "--op-perf: unknown argument %s (span|flash|all, --device, --dtype, --reps, --row, --fwd, --row-only)\n", a.c_str()), 2;
    }
  }
  std::printf("op perf on %s, %s, %d threads\n", s.device.str().c_str(), c10::toString(s.dtype), at::get_num_threads());
  if (s.op == "span" || s.op == "all") span_perf(s);
  if (s.op == "flash" || s.op == "all") flash_perf(s);
  return 0;
}

}  // namespace spanformer::tu
