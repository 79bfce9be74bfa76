#include "spanformer/dist/launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "spanformer/util/error.h"

namespace spanformer::dist {

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
