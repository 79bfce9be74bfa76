// Perf mode of the ops' case lists (tests/op_cases.h): every case marked perf, timed on every row of the
// op's backend table that takes the device's tensors (or the one --row names), beside the op's reference
// composition, all interleaved, medians of the repetitions; with each one's rate in GFLOP/s from the
// case's closed-form FLOP count (span_flops, flash_flops), as ggml's test-backend-ops prints it.
//
//   spanformer_tests --op-perf [span|flash|all] [--device cpu|cuda] [--dtype float32|bfloat16|float16] [--reps N]
//                              [--row NAME] [--fwd] [--row-only]
//
// --fwd times the forward only, --row-only leaves the reference out (both for a profiler). Prints per
// case its FLOP count, then one line per row and one for the reference composition ("plain"): forward
// and forward + backward milliseconds and GFLOP/s, and for a row the plain / row ratio of forward +
// backward. Numbers
// belong in docs/kernels.md with the machine.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "op_cases.h"
#include "spanformer/util/error.h"

namespace spanformer::tu {
namespace {

struct Setup {
  std::string op = "all";
  at::Device device = at::kCPU;
  at::ScalarType dtype = at::kFloat;
  int reps = 5;
  std::string row;           // the one row to time (empty: every row that takes the device's tensors)
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

using Forward = std::function<at::Tensor(const Inputs&)>;
using Guard = std::shared_ptr<void>;  // an op's backend override, alive while a row runs both halves

// One implementation timed: a row of the table (forced by `force` for its forward and backward) or the
// reference composition (no guard).
struct Timed {
  std::string name;
  std::function<Guard()> force;
  Forward f;
};

// Times each implementation's forward (no gradient kept) and forward + backward, all of them in turn in
// every round (the first round warms up and is not kept); prints one line each.
void time_case(const Setup& s, const std::string& label, const Flops& flops, const Inputs& inputs,
               const std::vector<Timed>& impls) {
  std::vector<std::vector<double>> fwd(impls.size()), both(impls.size());
  for (int r = 0; r <= s.reps; ++r)
    for (size_t i = 0; i < impls.size(); ++i) {
      const Guard guard = impls[i].force();
      const double t0 = now_ms(s);
      {
        at::NoGradGuard no_grad;
        impls[i].f(inputs);
      }
      const double t1 = now_ms(s);
      if (!s.forward_only) {
        auto out = impls[i].f(inputs);
        auto grads = torch::autograd::grad({out.sum()}, inputs);
      }
      const double t2 = now_ms(s);
      if (r > 0) {
        fwd[i].push_back(t1 - t0);
        both[i].push_back(t2 - t1);
      }
    }
  std::printf("%s   (%.2f GFLOP forward, %.2f backward)\n", label.c_str(), flops.forward / 1e9, flops.backward / 1e9);
  const bool has_reference = !s.row_only;
  const double reference_ms = has_reference ? median(both.back()) : 0;
  for (size_t i = 0; i < impls.size(); ++i) {
    const double f = median(fwd[i]), b = median(both[i]);
    std::string line = fmt::format("  {:<10} {:9.2f} ms {:7.1f} GFLOP/s", impls[i].name, f, flops.forward / f / 1e6);
    if (!s.forward_only) {
      line += fmt::format("   fwd+bwd {:9.2f} ms {:7.1f} GFLOP/s", b, (flops.forward + flops.backward) / b / 1e6);
      if (has_reference && i + 1 < impls.size()) line += fmt::format("   x{:.2f}", reference_ms / b);
    }
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);
}

Inputs on(const std::vector<at::Tensor>& doubles, const Setup& s) {
  Inputs in;
  for (const auto& t : doubles) in.push_back(t.to(s.device, s.dtype).requires_grad_(true));
  return in;
}

// What perf needs of one case: its label, FLOPs and inputs in double, the op, and its reference.
struct PerfRun {
  std::string label;
  Flops flops;
  std::vector<at::Tensor> inputs;
  Forward op, reference;
};

// Every perf case of an op's list on the rows `rows_of` finds for the device's inputs (or --row), each
// forced by Override, and the reference last.
template <class Override, class Case, class Make>
void perf(const Setup& s, const char* op, const std::vector<Case>& all,
          std::vector<std::string> (*rows_of)(const at::Tensor&), Make make) {
  std::printf("%s (median of %d):\n", op, s.reps);
  for (const auto& c : cases_of(all, true)) {
    const PerfRun run = make(c);
    const auto in = on(run.inputs, s);
    std::vector<Timed> impls;
    for (const auto& row : s.row.empty() ? rows_of(in[0]) : std::vector<std::string>{s.row})
      impls.push_back({row, [row] { return Guard(std::make_shared<Override>(row)); }, run.op});
    if (!s.row_only) impls.push_back({"plain", [] { return Guard(); }, run.reference});
    time_case(s, run.label, run.flops, in, impls);
  }
}

void span_perf(const Setup& s) {
  perf<ops::SpanBackendOverride>(s, "adaptive_span_attention", span_cases(), span_rows, [](const SpanCase& c) {
    const auto o = span_options(c);
    return PerfRun{span_label(c), span_flops(c), span_inputs(c),
                   [o](const Inputs& x) { return ops::adaptive_span_attention(x[0], x[1], x[2], x[3], x[4], o); },
                   [o](const Inputs& x) { return ops::adaptive_span_attention_reference(x[0], x[1], x[2], x[3], x[4], o); }};
  });
}

void flash_perf(const Setup& s) {
  perf<ops::FlashBackendOverride>(s, "flash_attention", flash_cases(), flash_rows, [](const FlashCase& c) {
    const auto o = flash_options(c);
    return PerfRun{flash_label(c), flash_flops(c), flash_inputs(c),
                   [o](const Inputs& x) { return ops::flash_attention(x[0], x[1], x[2], o); },
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
  if (!s.row.empty() && s.op == "all")
    return std::fprintf(stderr, "--op-perf: --row names a row of one op: give span or flash\n"), 2;
  try {
    if (s.op == "span" || s.op == "all") span_perf(s);
    if (s.op == "flash" || s.op == "all") flash_perf(s);
  } catch (const std::exception& e) {  // a row that is not in the table, or cannot take the inputs
    return std::fprintf(stderr, "--op-perf: %s\n", one_line_message(e).c_str()), 2;
  }
  return 0;
}

}  // namespace spanformer::tu
