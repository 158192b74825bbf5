#include "harness/spawn.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>

namespace tessera::testing {
int runWorkerFromEnv(const char* name);  // multiprocess.cpp

namespace {

// The test <-> zygote socket (SOCK_SEQPACKET: one message per send).
// test -> zygote: 'S', u32 count, count × (u32 length, bytes): the log path, then the environment.
// zygote -> test: a Reply: kind 'P' answers a spawn (pid, or -1 and errno in status);
//                 kind 'X' says a worker exited (waitpid's status).
struct Reply {
  int32_t pid = 0;
  int32_t status = 0;
  char kind = 0;
};
constexpr size_t kMaxMessage = 1 << 20;

struct Zygote {
  std::mutex m;
  int sock = -1;                 // the test's end; -1: no zygote, workers are fork + exec
  std::map<pid_t, int> exited;  // statuses the zygote reported that no one reaped yet
};
Zygote& zygote() {
  static Zygote z;
  return z;
}

int threadCount() {
  DIR* d = opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

void putU32(std::string& b, uint32_t v) { b.append(reinterpret_cast<const char*>(&v), sizeof v); }

std::string encode(const std::string& logPath, const std::vector<std::string>& env) {
  std::string b = "S";
  putU32(b, static_cast<uint32_t>(env.size() + 1));
  putU32(b, static_cast<uint32_t>(logPath.size()));
  b += logPath;
  for (const auto& e : env) {
    putU32(b, static_cast<uint32_t>(e.size()));
    b += e;
  }
  return b;
}

bool decode(const char* p, size_t n, std::vector<std::string>& out) {
  if (n < 5 || p[0] != 'S') return false;
  uint32_t count = 0;
  std::memcpy(&count, p + 1, 4);
  size_t off = 5;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t len = 0;
    if (off + 4 > n) return false;
    std::memcpy(&len, p + off, 4);
    off += 4;
    if (off + len > n) return false;
    out.emplace_back(p + off, len);
    off += len;
  }
  return off == n && !out.empty();
}

// In a new worker, before it runs anything: die with `parent`, write to logPath. Only
// async-signal-safe calls (the exec path forks a multi-threaded test).
void becomeWorker(pid_t parent, const char* logPath) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(125);  // the parent died before the line above
  int fd = open(logPath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) _exit(126);
  dup2(fd, 1);
  dup2(fd, 2);
  close(fd);
}

[[noreturn]] void runForkedWorker(const std::vector<std::string>& msg, pid_t zygotePid) {
  becomeWorker(zygotePid, msg[0].c_str());
  clearenv();
  for (size_t i = 1; i < msg.size(); ++i) putenv(strdup(msg[i].c_str()));
  const char* name = std::getenv("TESSERA_TEST_WORKER");
  const int rc = name ? runWorkerFromEnv(name) : 2;
  std::fflush(nullptr);
  _exit(rc);  // as main() does for a worker (harness/main.cpp)
}

void reply(int sock, Reply r) { (void)::send(sock, &r, sizeof r, MSG_NOSIGNAL); }

// The zygote: forks a worker per request, reports each worker's exit; ends with the test.
[[noreturn]] void zygoteLoop(int sock, pid_t testPid) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != testPid) _exit(0);
  sigset_t chld, old;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, &old);
  const int sfd = signalfd(-1, &chld, SFD_CLOEXEC);
  if (sfd < 0) _exit(1);
  std::vector<char> buf(kMaxMessage);
  for (;;) {
    pollfd fds[2] = {{sock, POLLIN, 0}, {sfd, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      _exit(1);
    }
    if (fds[1].revents & POLLIN) {
      signalfd_siginfo si;
      (void)!read(sfd, &si, sizeof si);
    }
    for (;;) {  // every worker that exited (SIGCHLD coalesces)
      int status = 0;
      const pid_t p = waitpid(-1, &status, WNOHANG);
      if (p <= 0) break;
      reply(sock, {p, status, 'X'});
    }
    if (!(fds[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    const ssize_t n = recv(sock, buf.data(), buf.size(), 0);
    if (n <= 0) _exit(0);  // the test closed its end, or died
    std::vector<std::string> msg;
    if (!decode(buf.data(), static_cast<size_t>(n), msg)) {
      reply(sock, {-1, EINVAL, 'P'});
      continue;
    }
    const pid_t self = getpid();
    const pid_t pid = fork();
    if (pid == 0) {
      close(sock);
      close(sfd);
      sigprocmask(SIG_SETMASK, &old, nullptr);
      runForkedWorker(msg, self);
    }
    reply(sock, {pid < 0 ? -1 : pid, pid < 0 ? errno : 0, 'P'});
  }
}

// The test's side: one reply, or false when block is false and none is waiting.
bool readReply(Zygote& z, bool block, Reply& r) {
  for (;;) {
    const ssize_t n = recv(z.sock, &r, sizeof r, block ? 0 : MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(sizeof r)) return true;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    throw std::runtime_error(
        fmt::format("harness: the worker zygote is gone ({})", n < 0 ? std::strerror(errno) : "socket closed"));
  }
}

pid_t execWorker(const std::vector<std::string>& env, const std::string& logPath) {
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (len <= 0) throw std::runtime_error("harness: cannot read /proc/self/exe");
  exe[len] = 0;
  std::vector<std::string> envCopy = env;  // execve takes char*
  std::vector<char*> envp;
  for (auto& s : envCopy) envp.push_back(s.data());
  envp.push_back(nullptr);
  char* argv[] = {exe, nullptr};
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    becomeWorker(parent, logPath.c_str());
    execve(exe, argv, envp.data());
    _exit(127);
  }
  if (pid < 0) throw std::runtime_error(fmt::format("harness: fork failed: {}", std::strerror(errno)));
  return pid;
}

}  // namespace

void startWorkerZygote() {
  const char* e = std::getenv("TESSERA_TEST_EXEC");
  if ((e && std::string(e) == "1") || threadCount() != 1) return;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return;
  const pid_t test = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(sv[0]);
    close(sv[1]);
    return;
  }
  if (pid == 0) {
    close(sv[0]);
    zygoteLoop(sv[1], test);
  }
  close(sv[1]);
  zygote().sock = sv[0];
}

pid_t spawnWorker(const std::vector<std::string>& env, const std::string& logPath) {
  auto& z = zygote();
  std::lock_guard<std::mutex> lock(z.m);
  if (z.sock < 0) return execWorker(env, logPath);
  const std::string msg = encode(logPath, env);
  if (msg.size() > kMaxMessage) throw std::runtime_error("harness: worker environment too large");
  if (::send(z.sock, msg.data(), msg.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(msg.size()))
    throw std::runtime_error(fmt::format("harness: cannot reach the worker zygote: {}", std::strerror(errno)));
  for (;;) {
    Reply r;
    readReply(z, true, r);
    if (r.kind == 'X') {
      z.exited[r.pid] = r.status;
      continue;
    }
    if (r.pid < 0) throw std::runtime_error(fmt::format("harness: the zygote could not fork: {}", std::strerror(r.status)));
    return r.pid;
  }
}

bool reapWorker(pid_t pid, bool block, int* status) {
  auto& z = zygote();
  std::lock_guard<std::mutex> lock(z.m);
  if (z.sock < 0) {
    for (;;) {
      const pid_t done = waitpid(pid, status, block ? 0 : WNOHANG);
      if (done < 0 && errno == EINTR) continue;
      return done == pid;
    }
  }
  for (;;) {
    auto it = z.exited.find(pid);
    if (it != z.exited.end()) {
      *status = it->second;
      z.exited.erase(it);
      return true;
    }
    Reply r;
    if (!readReply(z, block, r)) return false;
    if (r.kind == 'X') z.exited[r.pid] = r.status;
  }
}

}  // namespace tessera::testing
