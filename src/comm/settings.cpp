// The only reader of tessera's TESSERA_* runtime variables (the launchers' variables are read
// by the bootstrap detectors, comm/bootstrap/).
#include "tessera/comm/settings.h"

#include <signal.h>

#include <cstdio>
#include <mutex>

#include "tessera/comm/backends.h"
#include "comm/watchdog/fingerprint.h"
#include "comm/watchdog/flight_recorder.h"
#include "comm/watchdog/watchdog.h"
#include "common/choice.h"
#include "common/env.h"
#include "tessera/common/error.h"

namespace tessera {
namespace {

constexpr Choices<log::Level, 4> kLogLevel{"TESSERA_LOG_LEVEL value",
                                           {{{log::Level::Debug, "debug"},
                                             {log::Level::Info, "info"},
                                             {log::Level::Warn, "warn"},
                                             {log::Level::Error, "error"}}}};
constexpr Choices<Backend, 2> kBackend{"backend", {{{Backend::Gloo, "gloo"}, {Backend::Nccl, "nccl"}}}};
constexpr Choices<NcclCtaPolicy, 3> kCtaPolicy{
    "TESSERA_NCCL_CTA_POLICY value",
    {{{NcclCtaPolicy::Default, "default"}, {NcclCtaPolicy::Efficiency, "efficiency"}, {NcclCtaPolicy::Zero, "zero"}}}};
constexpr Choices<bool, 2> kStreamPriority{"TESSERA_NCCL_STREAM_PRIORITY value", {{{true, "high"}, {false, "normal"}}}};
constexpr Choices<fingerprint::Mode, 3> kDebug{"TESSERA_DEBUG value",
                                                {{{fingerprint::Mode::Off, "off"},
                                                  {fingerprint::Mode::Detail, "detail"},
                                                  {fingerprint::Mode::Fingerprint, "fingerprint"}}}};

// An integer variable within [lo, hi], else an error naming it.
template <typename T>
void readInt(const char* name, T& out, long long lo, long long hi, const char* what) {
  if (auto v = env::getInt(name)) {
    TESSERA_CHECK(*v >= lo && *v <= hi, "{}={} is not {} ({} to {})", name, *v, what, lo, hi);
    out = static_cast<T>(*v);
  }
}
void readBool(const char* name, bool& out) {
  if (auto v = env::getInt(name)) {
    TESSERA_CHECK(*v == 0 || *v == 1, "{}={} is not 0 or 1", name, *v);
    out = *v == 1;
  }
}
template <typename E, size_t N>
void readChoice(const char* name, E& out, const Choices<E, N>& c) {
  if (auto v = env::get(name)) out = c.parse(*v);
}

std::mutex g_mu;
Settings& current() {
  static auto* s = new Settings();  // leaked: read from detached threads at exit
  return *s;
}

}  // namespace

const char* toString(NcclCtaPolicy p) { return kCtaPolicy.name(p); }
log::Level parseLogLevel(const std::string& s) { return kLogLevel.parse(s); }
Backend parseBackend(const std::string& s) { return kBackend.parse(s); }

Settings Settings::fromEnvironment() {
  Settings s;
  if (auto t = env::getSeconds("TESSERA_TIMEOUT_S")) s.timeout = *t;
  if (auto b = env::get("TESSERA_BACKEND")) {
    try {
      s.backend = parseBackend(*b);
    } catch (const Error&) {
      throw Error(fmt::format("TESSERA_BACKEND='{}' is not one of {}", *b, kBackend.allowed()));
    }
  }
  readChoice("TESSERA_LOG_LEVEL", s.logLevel, kLogLevel);
  auto check = fingerprint::Mode::Fingerprint;
  readChoice("TESSERA_DEBUG", check, kDebug);
  s.collectiveFingerprint = check != fingerprint::Mode::Off;
  s.debugDetail = check == fingerprint::Mode::Detail;
  readInt("TESSERA_FLIGHT_RECORDER_SIZE", s.flightRecorderSize, 0, 1 << 20, "a number of ops");
  readBool("TESSERA_EXIT_ON_ERROR", s.exitOnError);
  if (auto g = env::getSeconds("TESSERA_EXIT_GRACE_S")) s.exitGrace = *g;
  readBool("TESSERA_NCCL_BLOCKING", s.ncclBlocking);
  readChoice("TESSERA_NCCL_CTA_POLICY", s.ncclCtaPolicy, kCtaPolicy);
  readChoice("TESSERA_NCCL_STREAM_PRIORITY", s.ncclHighPriorityStreams, kStreamPriority);
  s.glooIfname = env::get("TESSERA_GLOO_IFNAME").value_or("");
  s.glooHost = env::get("TESSERA_GLOO_HOST").value_or("");
  s.faultInject = env::get("TESSERA_FAULT_INJECT").value_or("");
  if (!s.faultInject.empty()) {  // tests only; a misspelt point would silently inject nothing
    const auto colon = s.faultInject.find(':');
    const auto point = s.faultInject.substr(0, colon);
    const auto rank = colon == std::string::npos ? std::string() : s.faultInject.substr(colon + 1);
    auto atStep = [&](const std::string& prefix) {
      return point.rfind(prefix, 0) == 0 && point.size() > prefix.size() &&
             point.find_first_not_of("0123456789", prefix.size()) == std::string::npos;
    };
    const bool stepPoint = atStep("kill-after-step-") || atStep("nan-loss-at-step-");
    const bool named = point == "bootstrap-after-store" || point == "checkpoint-after-write" ||
                       point == "checkpoint-after-metadata" || point == "checkpoint-between-renames" ||
                       point == "checkpoint-before-cleanup" || point == "checkpoint-before-latest";
    TESSERA_CHECK((named || stepPoint) && !rank.empty() && rank.find_first_not_of("0123456789") == std::string::npos,
                  "TESSERA_FAULT_INJECT='{}' is not POINT:RANK with POINT one of bootstrap-after-store, "
                  "checkpoint-after-write, checkpoint-after-metadata, checkpoint-between-renames, "
                  "checkpoint-before-cleanup, checkpoint-before-latest, kill-after-step-STEP, "
                  "nan-loss-at-step-STEP (train_gpt)",
                  s.faultInject);
  }
  readInt("TESSERA_OVERLAP_SM_CARVEOUT", s.smCarveout, 0, 1023, "a number of SMs");
  readInt("TESSERA_TP_FORWARD_CHUNKS", s.tpForwardChunks, 1, 64, "a number of pieces");
  readBool("TESSERA_TP_RING", s.tpRing);
  s.profile = env::get("TESSERA_PROFILE").value_or("");
  readBool("TESSERA_PROFILE_CPU", s.profileCpu);
  return s;
}

void injectFault(const Settings& s, const std::string& point, int rank, const char* who) {
  if (s.faultInject.empty() || s.faultInject != fmt::format("{}:{}", point, rank)) return;
  log::error("{}: TESSERA_FAULT_INJECT: rank {} kills itself at {}", who, rank, point);
  std::fflush(nullptr);
  ::raise(SIGKILL);
}

void configure(const Settings& s) {
  setNcclOptions(s.ncclBlocking, s.ncclCtaPolicy, s.ncclHighPriorityStreams);  // first: it may refuse the policy
  setGlooDevice(s.glooIfname, s.glooHost);
  log::setLevel(s.logLevel);
  fingerprint::setMode(s.debugDetail             ? fingerprint::Mode::Detail
                       : s.collectiveFingerprint ? fingerprint::Mode::Fingerprint
                                                 : fingerprint::Mode::Off);
  FlightRecorder::instance().setCapacity(s.flightRecorderSize);
  watchdog::setExitPolicy(s.exitOnError, s.exitGrace);
  std::lock_guard<std::mutex> l(g_mu);
  current() = s;
}

Settings settings() {
  std::lock_guard<std::mutex> l(g_mu);
  return current();
}

}  // namespace tessera
