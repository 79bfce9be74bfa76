#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "spanformer/util/build_info.h"
#include "spanformer/util/runtime.h"
#include "lab/step_graph.h"

namespace spanformer::tu {
int op_perf_main(const std::vector<std::string>& args);  // tests/op_perf.cpp
}

namespace {

// A crashing test prints where it crashed (the test binary is linked with -rdynamic so that its own
// functions are named too): the instruction pointer, the return address on top of the stack (the
// caller, when the crash is a call through a null pointer) and the unwound stack.
void describe(const char* what, void* address) {
  Dl_info info{};
  if (dladdr(address, &info) && info.dli_sname)
    std::fprintf(stderr, "  %s %p = %s+%#lx (%s)\n", what, address, info.dli_sname,
                 static_cast<unsigned long>(static_cast<char*>(address) - static_cast<char*>(info.dli_saddr)),
                 info.dli_fname);
  else
    std::fprintf(stderr, "  %s %p (%s)\n", what, address, info.dli_fname ? info.dli_fname : "?");
}

void on_crash(int signal, siginfo_t*, void* context) {
  std::fprintf(stderr, "\nspanformer_tests: signal %d\n", signal);
#if defined(__x86_64__)
  const auto* uc = static_cast<ucontext_t*>(context);
  describe("instruction", reinterpret_cast<void*>(uc->uc_mcontext.gregs[REG_RIP]));
  describe("return address", *reinterpret_cast<void**>(uc->uc_mcontext.gregs[REG_RSP]));
#endif
  void* frames[48];
  const int n = backtrace(frames, 48);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  _exit(128 + signal);
}

}  // namespace

int main(int argc, char** argv) {
  struct sigaction action {};
  action.sa_sigaction = on_crash;
  action.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &action, nullptr);
  sigaction(SIGBUS, &action, nullptr);
  if (argc >= 2 && std::strcmp(argv[1], "--op-perf") == 0) {  // perf mode of the ops' case lists
    return spanformer::tu::op_perf_main(std::vector<std::string>(argv + 2, argv + argc));
  }
  if (argc >= 2 && std::strcmp(argv[1], "--graph-perf") == 0) {  // the lab's CUDA graphs timed (lab/step_graph.h)
    try {
      return spanformer::lab::graph_perf_main(std::vector<std::string>(argv + 2, argv + argc));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
  }
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing = listing || std::strncmp(argv[i], "--gtest_list_tests", 18) == 0;
  ::testing::InitGoogleTest(&argc, argv);
  // Every test log says what the CPU kernels run on: the line of `spanformer --version` (not when CTest
  // lists the tests: it reads that output as test names).
  if (!listing) std::printf("spanformer_tests: CPU: %s\n", spanformer::cpu_text().c_str());
  // Two intra-op threads, or OMP_NUM_THREADS where set (scripts/test.sh: one per test while CTest runs
  // one test per core). Training tests leave train.threads at 0, which follows the same variable (else
  // takes every core); only a test whose point is a thread count sets one
  // (GptTraining.RepeatedRunsAndEvaluationsAreBitIdentical).
  const int from_environment = spanformer::threads_from_environment();
  at::set_num_threads(from_environment > 0 ? from_environment : 2);
  return RUN_ALL_TESTS();
}
