#pragma once
// The process's settings, read from the environment in one place.
//
// The library itself never reads the environment: option structs (DdpOptions,
// tp::LinearOverlap, FsdpOptions, ExecutorOptions, ...) default to constants. The top of a
// program — tessera::init(), train_gpt's command line, the benchmark drivers, the Python
// module — reads the TESSERA_* variables once with Settings::fromEnvironment(), applies the
// process-wide part with configure() (init() does both unless InitOptions::settings is given)
// and maps the rest (the overlap and profiler fields) into the option structs it builds.
//
// Errors: fromEnvironment() throws tessera::Error naming the variable, its value and what it
// accepts, for any malformed value; a value is never silently replaced by a default.
#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

#include "tessera/comm/types.h"
#include "tessera/common/log.h"

namespace tessera {

struct Settings {
  // --- Applied by configure() (process-wide) or by init() ---
  // Per-op timeout of the world communicator (and the groups split from it); store waits.
  std::chrono::milliseconds timeout = kDefaultTimeout;  // TESSERA_TIMEOUT_S (seconds, > 0)
  // The world's backend; overrides InitOptions::backend. Unset: NCCL when built with it and a
  // GPU is visible, else Gloo.
  std::optional<Backend> backend;  // TESSERA_BACKEND=gloo|nccl
  log::Level logLevel = log::Level::Info;  // TESSERA_LOG_LEVEL=debug|info|warn|error
  // Collectives first compared across their group (comm/watchdog/fingerprint.h): a few integers
  // per call exchanged over the op's own backend (fingerprint, the default), or through the
  // rendezvous store, which also names ranks that never call (detail, debug mode), or not at all.
  bool collectiveFingerprint = true;  // TESSERA_DEBUG=fingerprint (and detail)
  bool debugDetail = false;           // TESSERA_DEBUG=detail
  // Ops remembered per communicator for failure reports; 0: none.
  size_t flightRecorderSize = 32;  // TESSERA_FLIGHT_RECORDER_SIZE
  // After a communication failure the watchdog ends the process (exit code 3) after the
  // grace period (comm/watchdog/watchdog.h).
  bool exitOnError = true;                                        // TESSERA_EXIT_ON_ERROR=0|1
  std::chrono::milliseconds exitGrace = std::chrono::seconds(5);  // TESSERA_EXIT_GRACE_S
  // NCCL: ops on a blocking twin of the non-blocking control communicator (false: one
  // non-blocking communicator); NCCL's CTA policy (NCCL >= 2.27); each communicator's stream
  // of the device's greatest priority (false: the default priority, the compute stream's).
  bool ncclBlocking = true;                                // TESSERA_NCCL_BLOCKING=0|1
  NcclCtaPolicy ncclCtaPolicy = NcclCtaPolicy::Default;    // TESSERA_NCCL_CTA_POLICY=default|efficiency|zero
  bool ncclHighPriorityStreams = true;                     // TESSERA_NCCL_STREAM_PRIORITY=high|normal
  // Gloo's TCP device: an interface name, else a host name or address to bind, else this
  // host's name (127.0.0.1 when that does not resolve).
  std::string glooIfname;  // TESSERA_GLOO_IFNAME
  std::string glooHost;    // TESSERA_GLOO_HOST
  // Tests only: "POINT:R", rank R kills itself at POINT (injectFault below; docs/settings.md).
  std::string faultInject;  // TESSERA_FAULT_INJECT

  // --- Not applied by configure(): the top maps these into option structs ---
  int smCarveout = 0;       // TESSERA_OVERLAP_SM_CARVEOUT (0..1023) → DdpOptions, tp::LinearOverlap
  int tpForwardChunks = 1;  // TESSERA_TP_FORWARD_CHUNKS (1..64) → tp::LinearOverlap::forwardChunks
  bool tpRing = false;      // TESSERA_TP_RING=0|1 → tp::LinearOverlap::ring
  std::string profile;      // TESSERA_PROFILE=PATH[:FIRST[:COUNT]] → StepProfiler
  bool profileCpu = true;   // TESSERA_PROFILE_CPU=0|1 → StepProfiler

  // Every field above from its variable (unset or empty: the default shown). Local.
  static Settings fromEnvironment();
};

log::Level parseLogLevel(const std::string& s);  // debug | info | warn | error
Backend parseBackend(const std::string& s);      // gloo | nccl

// Applies the process-wide fields (log level, collective checks, flight recorder, watchdog
// exit, NCCL and Gloo options, fault injection) and remembers `s` for settings(). Local; call
// before making communicators (they take the backend options when made) and not concurrently
// with communication. Throws when the build cannot honour a field (a CTA policy without
// NCCL >= 2.27), before changing anything.
void configure(const Settings& s);
// The settings last given to configure() (a copy); before that, the defaults above.
Settings settings();
// Tests (TESSERA_FAULT_INJECT): when `s.faultInject` is "<point>:<rank>", logs "<who>:
// TESSERA_FAULT_INJECT: rank <rank> kills itself at <point>", flushes, and raises SIGKILL. Local.
void injectFault(const Settings& s, const std::string& point, int rank, const char* who);

}  // namespace tessera
