#include "comm/watchdog/process_state.h"

#include <fmt/format.h>
#include <signal.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/host.h"

namespace tessera::board {

ProcessState processStateNow(long pid) {
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return {"its process is gone (killed?)", true};
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  std::getline(stat, line);
  const auto close = line.rfind(')');
  const char state = close != std::string::npos && close + 2 < line.size() ? line[close + 2] : '?';
  if (state == 'T' || state == 't') return {"its process is stopped (SIGSTOP?)", true};
  if (state == 'Z' || state == 'X') {
    // A zombie: field 52 of stat is its exit status as waitpid reports it (Linux >= 3.5).
    std::istringstream fields(line.substr(close + 2));
    std::string f;
    int field = 3;
    long status = -1;
    while (fields >> f) {
      if (field++ == 52) status = std::strtol(f.c_str(), nullptr, 10);
    }
    if (status >= 0 && (status & 0x7f) != 0)
      return {fmt::format("its process is gone (killed by signal {}: {})", status & 0x7f, ::strsignal(status & 0x7f)),
              true};
    if (status >= 0) return {fmt::format("its process has exited (status {})", (status >> 8) & 0xff), true};
    return {"its process has exited", true};
  }
  return {"its process is alive but did not report (stalled, or blocked behind another rank)"};
}

ProcessState processState(const std::string& host, long pid) {
  if (host != hostName() || pid <= 0) return {fmt::format("dead or stalled (host {} is not this one)", host)};
  // A killed process closes its sockets while the kernel still tears it down (state R or D, not
  // yet a zombie): a peer that saw the connection drop can look in that instant. Look again for a
  // moment before calling it alive (this is the error path: the wait costs nothing else).
  ProcessState st = processStateNow(pid);
  for (int i = 0; i < 30 && !st.certain; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    st = processStateNow(pid);
  }
  return st;
}

}  // namespace tessera::board
