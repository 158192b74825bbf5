// Settings read in one place (comm/settings.h): the library's option structs and process-wide
// state do not depend on the environment; Settings::fromEnvironment() reads every variable,
// names a malformed one, and init() applies what it read; named choices refuse unknown words.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>
#include <tuple>

#include "tessera/comm/bootstrap/init.h"
#include "tessera/comm/settings.h"
#include "comm/watchdog/fingerprint.h"
#include "comm/watchdog/flight_recorder.h"
#include "tessera/common/log.h"
#include "tessera/common/profiler.h"
#include "tessera/data/token_source.h"
#include "harness/multiprocess.h"
#include "tessera/models/config.h"
#include "tessera/nn/recompute.h"
#include "tessera/optim/lr_schedule.h"
#include "tessera/parallel/data_parallel/ddp/ddp.h"
#include "tessera/parallel/tensor/linear.h"
#include "tessera/parallel/pipeline/executor.h"
#include "tessera/parallel/pipeline/schedule.h"
#include "tessera/parallel/data_parallel/fsdp/fsdp.h"

using namespace tessera;
using namespace tessera::testing;

namespace {

// Every variable Settings reads, each set to a valid value other than its default.
const std::map<std::string, std::string> kOddEnv = {
    {"TESSERA_TIMEOUT_S", "7"},          {"TESSERA_BACKEND", "gloo"},
    {"TESSERA_LOG_LEVEL", "error"},      {"TESSERA_DEBUG", "detail"},
    {"TESSERA_FLIGHT_RECORDER_SIZE", "5"}, {"TESSERA_EXIT_ON_ERROR", "0"},
    {"TESSERA_EXIT_GRACE_S", "2"},       {"TESSERA_NCCL_BLOCKING", "0"},
    {"TESSERA_GLOO_IFNAME", "lo"},       {"TESSERA_FAULT_INJECT", "checkpoint-after-write:9"},
    {"TESSERA_OVERLAP_SM_CARVEOUT", "16"}, {"TESSERA_TP_FORWARD_CHUNKS", "3"},
    {"TESSERA_TP_RING", "1"},            {"TESSERA_PROFILE", "trace.json:1:1"},
    {"TESSERA_PROFILE_CPU", "0"},        {"TESSERA_NCCL_STREAM_PRIORITY", "normal"},
};

std::string ms(std::chrono::milliseconds t) { return std::to_string(t.count()); }

// The defaults of the library's option structs and process-wide state, as text: equal in a
// process with kOddEnv set and one without, unless some default reads the environment.
std::string libraryDefaults() {
  std::string s;
  const DdpOptions d;
  s += fmt::format("ddp {} {} {} {} {} {} {} {};", d.bucketCapBytes, d.firstBucketCapBytes, d.gradientAsBucketView,
                   d.commDtype.has_value(), d.findUnusedParameters, d.broadcastBuffers, d.rebuildBuckets,
                   d.smCarveout);
  const tp::ParallelLinearOptions l;
  s += fmt::format("linear {} {} {} {} {} {} {} {} {} {} {};", l.bias, l.gatherOutput, l.inputIsParallel,
                   l.sequenceParallel, l.name, l.initFromRng, l.overlapGradReduce, l.accumulateGradInGemm,
                   l.overlap.forwardChunks, l.overlap.smCarveout, l.overlap.ring);
  const FsdpOptions f;
  s += fmt::format("fsdp {} {} {} {} {} {};", static_cast<int>(f.paramDtype), static_cast<int>(f.reduceDtype),
                   f.reshardAfterForward, f.prefetchBudgetBytes, f.shardGroupSize, f.syncModuleStates);
  const pipeline::ExecutorOptions e;
  s += fmt::format("executor {} {};", e.device.str(), e.freeSentOutputs);
  const InitOptions i;
  s += fmt::format("init {} {} {} {};", i.backend.has_value(), i.timeout.has_value(), i.settings.has_value(),
                   i.storeHost);
  const Settings st;
  s += fmt::format("settings {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {};", ms(st.timeout), st.backend.has_value(),
                   static_cast<int>(st.logLevel), st.debugDetail + 2 * st.collectiveFingerprint, st.flightRecorderSize, st.exitOnError,
                   ms(st.exitGrace), st.ncclBlocking, toString(st.ncclCtaPolicy), st.ncclHighPriorityStreams, st.glooIfname, st.glooHost,
                   st.faultInject, st.smCarveout, st.tpForwardChunks, st.tpRing, st.profile + (st.profileCpu ? "+cpu" : ""));
  // Process-wide state before configure(): constants too.
  s += fmt::format("process {} {} {};", static_cast<int>(log::level()), static_cast<int>(fingerprint::mode()),
                   FlightRecorder::instance().capacity());
  return s;
}

}  // namespace

TESSERA_WORKER(defaults_with_odd_env) {
  // The variables reached this process: Settings sees each of them...
  const auto e = Settings::fromEnvironment();
  WCHECK(e.timeout == std::chrono::seconds(7) && e.backend == Backend::Gloo && e.logLevel == log::Level::Error &&
             e.debugDetail && e.flightRecorderSize == 5 && !e.exitOnError && e.exitGrace == std::chrono::seconds(2) &&
             !e.ncclBlocking && !e.ncclHighPriorityStreams && e.glooIfname == "lo" && e.faultInject == "checkpoint-after-write:9" && e.smCarveout == 16 &&
             e.tpForwardChunks == 3 && e.tpRing && e.profile == "trace.json:1:1" && !e.profileCpu,
         "Settings::fromEnvironment() did not read every variable");
  WCHECK(tp::LinearOverlap::fromSettings(e).forwardChunks == 3 && tp::LinearOverlap::fromSettings(e).smCarveout == 16 &&
             tp::LinearOverlap::fromSettings(e).ring,
         "LinearOverlap::fromSettings does not map the overlap settings");
  // ...and the library's defaults ignore them: printed for the parent to compare.
  fmt::print("DEFAULTS<{}>\n", libraryDefaults());
  std::fflush(stdout);
}

TEST(Settings, LibraryDefaultsDoNotDependOnTheEnvironment) {
  for (const auto& [k, v] : kOddEnv) ::unsetenv(k.c_str());
  const std::string here = libraryDefaults();
  const auto res = runWorkers("defaults_with_odd_env", {.ranks = 1, .env = kOddEnv});
  expectAllOk(res);
  const auto& out = res.at(0).output;
  const auto a = out.find("DEFAULTS<"), b = out.find(">\n", a);
  ASSERT_TRUE(a != std::string::npos && b != std::string::npos) << out;
  EXPECT_EQ(out.substr(a + 9, b - a - 9), here) << "a library default changed with the environment";
}

// init() reads the environment (unless given settings) and applies it process-wide.
TESSERA_WORKER(init_applies_settings) {
  auto ctx = initWorker(w);
  WCHECK(ctx.world->timeout() == std::chrono::milliseconds(2500), "timeout is {} ms", ctx.world->timeout().count());
  WCHECK(ctx.settings.smCarveout == 8 && settings().smCarveout == 8, "settings not kept: {} / {}",
         ctx.settings.smCarveout, settings().smCarveout);
  WCHECK(log::level() == log::Level::Warn, "log level {}", static_cast<int>(log::level()));
  WCHECK(FlightRecorder::instance().capacity() == 4, "flight recorder keeps {}", FlightRecorder::instance().capacity());
  // Given settings win over the environment.
  Settings mine;
  mine.flightRecorderSize = 9;
  configure(mine);
  WCHECK(FlightRecorder::instance().capacity() == 9 && log::level() == log::Level::Info,
         "configure() did not apply the given settings");
}
TEST(Settings, InitAppliesTheEnvironment) {
  expectAllOk(runWorkers("init_applies_settings",
                         {.ranks = 1,
                          .env = {{"TESSERA_TIMEOUT_S", "2.5"},
                                  {"TESSERA_OVERLAP_SM_CARVEOUT", "8"},
                                  {"TESSERA_LOG_LEVEL", "warn"},
                                  {"TESSERA_FLIGHT_RECORDER_SIZE", "4"}}}));
}

// A malformed variable is an error naming it, its value and what it takes.
TESSERA_WORKER(bad_setting) {
  const std::string want = w.arg;
  expectErrorContaining([] { Settings::fromEnvironment(); }, {want.c_str()});
}
TEST(Settings, MalformedVariablesAreNamed) {
  const std::vector<std::pair<std::pair<std::string, std::string>, std::string>> cases = {
      {{"TESSERA_OVERLAP_SM_CARVEOUT", "-3"}, "TESSERA_OVERLAP_SM_CARVEOUT=-3 is not a number of SMs (0 to 1023)"},
      {{"TESSERA_TP_FORWARD_CHUNKS", "0"}, "TESSERA_TP_FORWARD_CHUNKS=0 is not a number of pieces (1 to 64)"},
      {{"TESSERA_TP_RING", "2"}, "TESSERA_TP_RING=2 is not 0 or 1"},
      {{"TESSERA_TIMEOUT_S", "soon"}, "TESSERA_TIMEOUT_S='soon' is not a positive number of seconds"},
      {{"TESSERA_BACKEND", "mpi"}, "TESSERA_BACKEND='mpi' is not one of gloo, nccl"},
      {{"TESSERA_LOG_LEVEL", "verbose"}, "unknown TESSERA_LOG_LEVEL value 'verbose'; allowed: debug, info, warn, error"},
      {{"TESSERA_DEBUG", "1"}, "unknown TESSERA_DEBUG value '1'; allowed: off, detail, fingerprint"},
      {{"TESSERA_NCCL_CTA_POLICY", "fastest"}, "unknown TESSERA_NCCL_CTA_POLICY value 'fastest'; allowed: default, efficiency, zero"},
      {{"TESSERA_NCCL_STREAM_PRIORITY", "low"}, "unknown TESSERA_NCCL_STREAM_PRIORITY value 'low'; allowed: high, normal"},
      {{"TESSERA_FLIGHT_RECORDER_SIZE", "-1"}, "TESSERA_FLIGHT_RECORDER_SIZE=-1 is not a number of ops"},
      {{"TESSERA_EXIT_ON_ERROR", "yes"}, "environment variable TESSERA_EXIT_ON_ERROR='yes' is not an integer"},
      {{"TESSERA_FAULT_INJECT", "bootstrap-after-stor:1"},
       "TESSERA_FAULT_INJECT='bootstrap-after-stor:1' is not POINT:RANK with POINT one of bootstrap-after-store"},
      {{"TESSERA_FAULT_INJECT", "kill-after-step-x:0"},
       "TESSERA_FAULT_INJECT='kill-after-step-x:0' is not POINT:RANK"},
  };
  for (const auto& [var, message] : cases) {
    SCOPED_TRACE(var.first + "=" + var.second);
    expectAllOk(runWorkers("bad_setting", {.ranks = 1, .env = {var}, .arg = message}));
  }
}

// Named choices: each word parses to its value and back; an unknown word is an error that
// lists the allowed ones, never a default.
template <typename E>
void expectChoices(E (*parse)(const std::string&), const char* (*name)(E), std::initializer_list<const char*> words,
                   const std::string& unknownMessage) {
  for (const char* w : words) EXPECT_STREQ(name(parse(w)), w);
  try {
    parse("nonsense");
    ADD_FAILURE() << "'nonsense' was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(unknownMessage), std::string::npos) << e.what();
  }
}

TEST(Settings, NamedChoicesRefuseUnknownWords) {
  expectChoices<pipeline::ScheduleKind>(pipeline::parseScheduleKind, pipeline::scheduleName,
                                        {"1f1b", "gpipe", "interleaved"},
                                        "unknown pipeline schedule 'nonsense'; allowed: 1f1b, gpipe, interleaved");
  expectChoices<nn::Recompute>(nn::parseRecompute, nn::toString, {"none", "full", "selective"},
                               "unknown recompute mode 'nonsense'; allowed: none, full, selective");
  expectChoices<optim::LrKind>(optim::parseLrKind, optim::toString, {"constant", "cosine", "linear", "wsd"},
                               "unknown lr schedule 'nonsense'; allowed: constant, cosine, linear, wsd");
  expectChoices<models::Positions>(models::parsePositions, models::toString, {"none", "learned", "rope"},
                                   "unknown positions 'nonsense'; allowed: none, learned, rope");
  expectChoices<data::Format>(data::parseFormat, data::formatName,
                              {"auto", "megatron", "llmc", "raw-uint16", "raw-uint32"},
                              "unknown data format 'nonsense'; allowed: auto, megatron, llmc, raw-uint16, raw-uint32");
  expectChoices<Backend>(parseBackend, toString, {"gloo", "nccl"}, "unknown backend 'nonsense'; allowed: gloo, nccl");
  EXPECT_EQ(parseLogLevel("warn"), log::Level::Warn);
  EXPECT_THROW(parseLogLevel("nonsense"), Error);
}

// TESSERA_DEBUG's three words, each mapped to its fields and, applied, to the process's check mode.
TEST(Settings, DebugModes) {
  const std::vector<std::tuple<const char*, bool, bool, fingerprint::Mode>> cases = {
      {"off", false, false, fingerprint::Mode::Off},
      {"fingerprint", true, false, fingerprint::Mode::Fingerprint},
      {"detail", true, true, fingerprint::Mode::Detail}};
  const auto before = fingerprint::mode();
  for (const auto& [word, check, detail, mode] : cases) {
    ::setenv("TESSERA_DEBUG", word, 1);
    const auto s = Settings::fromEnvironment();
    EXPECT_EQ(s.collectiveFingerprint, check) << word;
    EXPECT_EQ(s.debugDetail, detail) << word;
    configure(s);
    EXPECT_EQ(fingerprint::mode(), mode) << word;
  }
  ::unsetenv("TESSERA_DEBUG");
  configure(Settings::fromEnvironment());
  fingerprint::setMode(before);
}

TEST(Settings, MalformedProfileSpecIsNamed) {
  expectErrorContaining([] { StepProfiler p(0, "trace.json:x"); }, {"TESSERA_PROFILE='trace.json:x'", "PATH[:FIRST[:COUNT]]"});
  expectErrorContaining([] { StepProfiler p(0, "trace.json:3:0"); }, {"TESSERA_PROFILE='trace.json:3:0'", "COUNT > 0"});
  expectErrorContaining([] { StepProfiler p(0, ":3"); }, {"TESSERA_PROFILE=':3'"});
  EXPECT_FALSE(StepProfiler(0, "").enabled());
}
