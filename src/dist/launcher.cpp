// The local launcher. Workers run in their own process group (a terminal's Ctrl-C reaches the launcher
// only, which forwards it once, so the workers stop together at a step boundary and checkpoint) and
// receive SIGTERM if the launcher dies (PR_SET_PDEATHSIG: no orphans after kill -9). When a worker
// fails, the others cannot finish a step without it: they are killed at once, the last checkpoint is
// kept, and the launcher returns the failure. After a forwarded signal the workers get a grace period
// to save, then are killed. Workers write their one-line errors into a folder of the launcher's
// (SPANFORMER_WORKER_ERRORS/RANK), and the launcher prints the first failed worker's line alone.
#include "spanformer/dist/launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "spanformer/util/error.h"

namespace spanformer::dist {
namespace {

volatile sig_atomic_t g_signal = 0;
void on_signal(int s) { g_signal = s; }

constexpr int kGraceSeconds = 600;  // after a forwarded signal: time to save a checkpoint

int free_port() {  // chosen by the kernel
  int sock = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (sock < 0 || ::bind(sock, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(sock, reinterpret_cast<sockaddr*>(&address), &length) != 0)
    fail("cannot find a free local port for the workers");
  ::close(sock);
  return ntohs(address.sin_port);
}

}  // namespace

std::string worker_error_file() {
  const char* dir = std::getenv("SPANFORMER_WORKER_ERRORS");
  const char* rank = std::getenv("RANK");
  return dir && rank ? std::string(dir) + "/" + rank : std::string();
}

int spawn_local_workers(int n, const std::vector<std::string>& args) {
  const int port = free_port();
  char errors_template[] = "/tmp/spanformer-workers-XXXXXX";
  const char* errors_dir = ::mkdtemp(errors_template);
  if (!errors_dir) fail("cannot create a folder for the workers' messages in /tmp: {}", std::strerror(errno));
  struct RemoveFolder {
    std::string path;
    ~RemoveFolder() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } remove_errors{errors_dir};
  struct sigaction action {};
  action.sa_handler = on_signal;  // no SA_RESTART: waitpid returns EINTR
  sigemptyset(&action.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(s, &action, nullptr);
  const pid_t launcher = ::getpid();

  std::vector<pid_t> children;
  for (int r = 0; r < n; ++r) {
    pid_t pid = ::fork();
    if (pid < 0) {
      for (pid_t c : children) ::kill(c, SIGKILL);
      fail("cannot start worker {}", r);
    }
    if (pid == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) _exit(1);  // the launcher died before prctl
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("SPANFORMER_WORKER_ERRORS", errors_dir, 1);
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

  auto alive = [&] {
    std::vector<pid_t> out;
    for (pid_t c : children)
      if (c > 0) out.push_back(c);
    return out;
  };
  int status_out = 0, failed_rank = -1;
  bool stopping = false, said = false;
  auto message_of = [&](int rank) {  // the worker's one-line error, or ""
    std::ifstream in(std::string(errors_dir) + "/" + std::to_string(rank));
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  auto deadline = std::chrono::steady_clock::time_point::max();
  while (!alive().empty()) {
    if (g_signal != 0) {  // forwarded once per signal; workers checkpoint collectively and exit
      for (pid_t c : alive()) ::kill(c, g_signal);
      g_signal = 0;
      if (!stopping) deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kGraceSeconds);
      stopping = true;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      fmt::print(stderr, "spanformer: workers did not stop within {} s; killed\n", kGraceSeconds);
      for (pid_t c : alive()) ::kill(c, SIGKILL);
      deadline = std::chrono::steady_clock::time_point::max();
      if (status_out == 0) status_out = 1;
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno != EINTR) break;
    if (pid <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    int rank = 0;
    for (size_t i = 0; i < children.size(); ++i)
      if (children[i] == pid) children[i] = -1, rank = static_cast<int>(i);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && status_out == 0) {
      status_out = code;
      failed_rank = rank;
      if (!stopping) {  // a failed worker: the others cannot finish a step without it
        const auto rest = alive();
        for (pid_t c : rest) ::kill(c, SIGKILL);
        // Its own message says why, once; a worker that left none (killed, crashed) is named here.
        const std::string message = message_of(rank);
        if (!message.empty())
          fmt::print(stderr, "{}", message);
        else if (!rest.empty())
          fmt::print(stderr, "spanformer: worker {} failed (exit {}); stopped the other workers (the last checkpoint is kept)\n",
                     rank, code);
        said = true;
      }
    }
  }
  // Stopped by a signal and then failed (a checkpoint that could not be written): its message still.
  if (status_out != 0 && !said && failed_rank >= 0) fmt::print(stderr, "{}", message_of(failed_rank));
  return status_out;
}

}  // namespace spanformer::dist
