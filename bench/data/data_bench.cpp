// tessera's data layer on the host (src/data): how fast it reads a tokenized dataset, and what
// the trainer's data step costs. bench/data/run.sh runs it beside PyTorch's way on the same file
// (bench/data/torch_data.py) and writes bench/results/data.{json,md}.
//
//   tessera_bench_data --data PATH [--format auto] [--name LABEL] [--vocab V] [--seq-len 1024]
//                      [--batch 8] [--steps 1000] [--warm 50] [--repeats 5] [--seq-passes 3]
//                      [--loader-steps 200] [--work-ms 2] [--build-repeats 5] [--cold]
//                      [--only seq,sample,loader,build]
//
// Measurements (each one JSON line on stdout: {"system": "tessera", "dataset", "measurement",
// ...}; human lines on stderr):
//   seq_read_cold  (--cold) one pass as seq_read over a file just evicted from the page cache
//                  (fdatasync + posix_fadvise(DONTNEED) on PATH's data file before it is opened;
//                  "resident_before" says how much of it was still cached)
//   seq_read       every document in order through TokenSource::read into one reused int64
//                  buffer; --seq-passes passes after one warm-up pass, median tokens/s
//   sample_read    readSamples(train blend, step · B, B, vocab): the sampler's host time per step
//                  (B rows of seq-len + 1 tokens, a new tensor each, every token checked against
//                  the vocabulary); --warm steps, then --repeats runs of --steps steps continuing
//                  through the sample index (so through several epochs of a small dataset); per
//                  run mean/p50/p99 µs per step, medians over the runs; tokens/s = B · (T + 1) / mean
//   loader_next    BatchLoader::next() (CPU device, depth 2) when the consumer spins --work-ms of
//                  fake work per step (how long the trainer waits for data when the loader keeps
//                  up), and with no work (work_ms 0: the loader's own rate)
//   build          GptData construction (open + validate the index, fingerprint, per-document
//                  lengths) and the first batch after it (builds epoch 0's shuffled order); medians
//                  of --build-repeats
// Timing: std::chrono::steady_clock. Local; one process.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "tessera/data/batch.h"
#include "tessera/data/dataset.h"
#include "tessera/data/loader.h"
#include "data/megatron.h"
#include "tessera/data/token_source.h"

namespace {

using namespace tessera::data;
using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

struct Args {
  std::string data, format = "auto", name, only = "seq,sample,loader,build";
  int64_t vocab = INT64_MAX, seqLen = 1024, batch = 8, steps = 1000, warm = 50, repeats = 5, seqPasses = 3,
          loaderSteps = 200, buildRepeats = 5;
  double workMs = 2.0;
  bool cold = false;
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "tessera_bench_data: " << why
            << "\nusage: tessera_bench_data --data PATH [--format auto] [--name LABEL] [--vocab V] [--seq-len 1024] "
               "[--batch 8] [--steps 1000] [--warm 50] [--repeats 5] [--seq-passes 3] [--loader-steps 200] "
               "[--work-ms 2] [--build-repeats 5] [--cold] [--only seq,sample,loader,build]\n";
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage(k + " needs a value");
      return argv[++i];
    };
    auto num = [&]() -> int64_t {
      const std::string v = val();
      try {
        size_t n = 0;
        const long long x = std::stoll(v, &n);
        if (n == v.size() && x >= 0) return x;
      } catch (const std::exception&) {
      }
      usage(k + ": '" + v + "' is not a number >= 0");
    };
    if (k == "--data") a.data = val();
    else if (k == "--format") a.format = val();
    else if (k == "--name") a.name = val();
    else if (k == "--only") a.only = val();
    else if (k == "--vocab") a.vocab = num();
    else if (k == "--seq-len") a.seqLen = num();
    else if (k == "--batch") a.batch = num();
    else if (k == "--steps") a.steps = num();
    else if (k == "--warm") a.warm = num();
    else if (k == "--repeats") a.repeats = num();
    else if (k == "--seq-passes") a.seqPasses = num();
    else if (k == "--loader-steps") a.loaderSteps = num();
    else if (k == "--build-repeats") a.buildRepeats = num();
    else if (k == "--work-ms") a.workMs = std::atof(val().c_str());
    else if (k == "--cold") a.cold = true;
    else if (k == "-h" || k == "--help") usage("help");
    else usage("unknown argument '" + k + "'");
  }
  if (a.data.empty()) usage("--data is required");
  if (a.seqLen < 1 || a.batch < 1 || a.steps < 1 || a.repeats < 1 || a.seqPasses < 1 || a.vocab < 1)
    usage("--seq-len, --batch, --steps, --repeats, --seq-passes and --vocab must be >= 1");
  if (a.name.empty()) a.name = a.data;
  return a;
}

bool wants(const Args& a, const std::string& what) { return ("," + a.only + ",").find("," + what + ",") != std::string::npos; }

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
// Nearest-rank percentile (p in (0, 100]).
double percentile(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::min(v.size(), std::max<size_t>(rank, 1)) - 1];
}
double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? NAN : s / static_cast<double>(v.size());
}

std::string num(double v, int digits = 3) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}
std::string list(const std::vector<double>& v, int digits = 3) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + num(v[i], digits);
  return s + "]";
}
std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out + "\"";
}

// One JSON line: {"system": "tessera", "dataset": ..., "measurement": ..., <members>}.
void emit(const Args& a, const std::string& measurement, const std::string& members) {
  std::cout << "{\"system\": \"tessera\", \"dataset\": " << quote(a.name) << ", \"measurement\": " << quote(measurement)
            << ", " << members << "}" << std::endl;
}

// Per-step statistics (µs) of several runs: medians over the runs of each run's mean/p50/p99.
struct StepStats {
  double mean = 0, p50 = 0, p99 = 0, max = 0;
  std::vector<double> means;
};
StepStats stepStats(const std::vector<std::vector<double>>& runsUs) {
  StepStats s;
  std::vector<double> p50, p99, mx;
  for (const auto& r : runsUs) {
    s.means.push_back(mean(r));
    p50.push_back(percentile(r, 50));
    p99.push_back(percentile(r, 99));
    mx.push_back(percentile(r, 100));
  }
  s.mean = median(s.means);
  s.p50 = median(p50);
  s.p99 = median(p99);
  s.max = median(mx);
  return s;
}

// The data file(s) of PATH that hold the tokens (for eviction): PREFIX.bin and PREFIX.idx of a
// Megatron dataset, else PATH itself when it is a regular file (a glob is not evicted).
std::vector<std::string> dataFiles(const std::string& path) {
  auto isFile = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
  };
  const std::string prefix = megatronPrefix(path);
  if (isFile(prefix + ".bin") && isFile(prefix + ".idx")) return {prefix + ".bin", prefix + ".idx"};
  if (isFile(path)) return {path};
  return {};
}

// Writes back and drops `file`'s cached pages (only pages no process maps can go).
void evict(const std::string& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// The fraction of `file`'s pages in the page cache (mincore over a fresh mapping; touches nothing).
double residentFraction(const std::string& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NAN;
  struct stat st {};
  ::fstat(fd, &st);
  const auto size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return NAN;
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return NAN;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE)), pages = (size + page - 1) / page;
  std::vector<unsigned char> vec(pages);
  double frac = NAN;
  if (::mincore(p, size, vec.data()) == 0) {
    size_t in = 0;
    for (unsigned char c : vec) in += c & 1;
    frac = static_cast<double>(in) / static_cast<double>(pages);
  }
  ::munmap(p, size);
  return frac;
}

constexpr const char* kSeqWhat = "per document: TokenSource::read into a reused int64 buffer";

// One sequential pass: every document in order into `buf` (grown to the longest document).
double sequentialPass(const TokenSource& src, std::vector<int64_t>& buf, int64_t& checksum) {
  const int64_t docs = src.numDocuments();
  const auto t0 = Clock::now();
  int64_t sum = 0;
  for (int64_t d = 0; d < docs; ++d) {
    const int64_t n = src.documentLength(d);
    if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
    src.read(d, 0, n, buf.data());
    if (n > 0) sum += buf[n - 1];  // keeps the reads observable
  }
  const double s = seconds(t0, Clock::now());
  checksum += sum;
  return s;
}

void benchSequential(const Args& a, SourceOptions so) {
  int64_t checksum = 0;
  std::vector<int64_t> buf;
  if (a.cold) {
    const auto files = dataFiles(a.data);
    if (files.empty()) {
      std::cerr << "tessera_bench_data: --cold: no single data file to evict for '" << a.data << "'; skipped\n";
    } else {
      for (const auto& f : files) evict(f);
      const double resident = residentFraction(files[0]);
      const auto t0 = Clock::now();
      auto src = openTokenSource(a.data, so);
      const double openS = seconds(t0, Clock::now());
      const double s = sequentialPass(*src, buf, checksum);
      const double tokens = static_cast<double>(src->numTokens());
      const double bytes = tokens * static_cast<double>(tokenBytes(src->tokenType()));
      std::cerr << "[tessera " << a.name << "] seq_read_cold: " << tokens / s / 1e6 << " M tokens/s ("
                << bytes / s / 1e6 << " MB/s of the file; open " << openS * 1e3 << " ms; "
                << num(resident * 100, 1) << "% cached before)\n";
      emit(a, "seq_read_cold",
           "\"tokens\": " + num(tokens, 0) + ", \"file_bytes\": " + num(bytes, 0) + ", \"tokens_per_s\": " +
               num(tokens / s, 0) + ", \"file_MB_per_s\": " + num(bytes / s / 1e6, 1) + ", \"pass_ms\": " +
               num(s * 1e3, 2) + ", \"open_ms\": " + num(openS * 1e3, 3) + ", \"resident_before\": " + num(resident, 4) +
               ", \"what\": " + quote(kSeqWhat));
    }
  }
  auto src = openTokenSource(a.data, so);
  sequentialPass(*src, buf, checksum);  // warm-up: page cache and buffer
  std::vector<double> passes;
  for (int64_t p = 0; p < a.seqPasses; ++p) passes.push_back(sequentialPass(*src, buf, checksum));
  const double tokens = static_cast<double>(src->numTokens());
  const double s = median(passes);
  std::vector<double> rates;
  for (double x : passes) rates.push_back(tokens / x);
  std::cerr << "[tessera " << a.name << "] seq_read: " << tokens / s / 1e6 << " M tokens/s (" << src->numDocuments()
            << " documents, " << tokens / 1e6 << " M tokens, median of " << passes.size() << " passes of "
            << s * 1e3 << " ms; checksum " << checksum << ")\n";
  emit(a, "seq_read",
       "\"documents\": " + std::to_string(src->numDocuments()) + ", \"tokens\": " + num(tokens, 0) +
           ", \"token_bytes\": " + std::to_string(tokenBytes(src->tokenType())) + ", \"tokens_per_s\": " +
           num(tokens / s, 0) + ", \"pass_ms\": " + num(s * 1e3, 2) + ", \"passes\": " +
           std::to_string(passes.size()) + ", \"tokens_per_s_all\": " + list(rates, 0) + ", \"what\": " + quote(kSeqWhat));
}

DataOptions dataOptions(const Args& a) {
  DataOptions o;
  o.train = a.data;
  o.format = parseFormat(a.format);
  o.seqLen = a.seqLen;
  return o;
}

void benchSamples(const Args& a) {
  GptData data(dataOptions(a));
  const Blend& train = data.train();
  const int64_t B = a.batch, row = a.seqLen + 1;
  int64_t step = 0, checksum = 0;
  auto one = [&] {
    const auto t0 = Clock::now();
    at::Tensor s = readSamples(train, step * B, B, a.vocab);
    const double us = seconds(t0, Clock::now()) * 1e6;
    checksum += s.data_ptr<int64_t>()[row - 1];
    ++step;
    return us;
  };
  for (int64_t i = 0; i < a.warm; ++i) one();
  std::vector<std::vector<double>> runs;
  for (int64_t r = 0; r < a.repeats; ++r) {
    std::vector<double> us;
    us.reserve(a.steps);
    for (int64_t i = 0; i < a.steps; ++i) us.push_back(one());
    runs.push_back(std::move(us));
  }
  const auto st = stepStats(runs);
  const double perEpoch = static_cast<double>(train.part(0).samplesPerEpoch());
  const double tokens = static_cast<double>(B * row);
  std::cerr << "[tessera " << a.name << "] sample_read B=" << B << " T=" << a.seqLen << ": mean " << st.mean
            << " us, p50 " << st.p50 << " us, p99 " << st.p99 << " us per step, " << tokens / st.mean * 1e6 / 1e6
            << " M tokens/s (" << a.repeats << " x " << a.steps << " steps, " << static_cast<double>(step * B) / perEpoch
            << " epochs of " << perEpoch << " samples; checksum " << checksum << ")\n";
  emit(a, "sample_read",
       "\"batch\": " + std::to_string(B) + ", \"seq_len\": " + std::to_string(a.seqLen) + ", \"us_mean\": " +
           num(st.mean) + ", \"us_p50\": " + num(st.p50) + ", \"us_p99\": " + num(st.p99) + ", \"us_max\": " +
           num(st.max) + ", \"tokens_per_s\": " + num(tokens / st.mean * 1e6, 0) + ", \"steps\": " +
           std::to_string(a.steps) + ", \"repeats\": " + std::to_string(a.repeats) + ", \"epochs_read\": " +
           num(static_cast<double>(step * B) / perEpoch, 2) + ", \"us_mean_all\": " + list(st.means));
}

void spin(double ms) {
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
  while (Clock::now() < until) {
  }
}

void benchLoader(const Args& a) {
  auto data = std::make_shared<GptData>(dataOptions(a));
  std::shared_ptr<const Blend> train(data, &data->train());
  const int64_t B = a.batch;
  for (double work : {a.workMs, 0.0}) {
    std::vector<std::vector<double>> runs;
    int64_t checksum = 0;
    for (int64_t r = 0; r < std::min<int64_t>(a.repeats, 3); ++r) {
      LoaderOptions lo;
      lo.globalBatch = B;
      lo.rowBegin = 0;
      lo.rows = B;
      lo.vocab = a.vocab;
      BatchLoader loader(train, lo, r * (a.loaderSteps + a.warm) * B);
      std::vector<double> us;
      for (int64_t i = 0; i < a.warm + a.loaderSteps; ++i) {
        const auto t0 = Clock::now();
        TokenBatch b = loader.next();
        const double t = seconds(t0, Clock::now()) * 1e6;
        checksum += b.targets.data_ptr<int64_t>()[0];
        if (i >= a.warm) us.push_back(t);
        spin(work);
      }
      runs.push_back(std::move(us));
    }
    const auto st = stepStats(runs);
    std::cerr << "[tessera " << a.name << "] loader_next with " << work << " ms of work per step: mean " << st.mean
              << " us, p50 " << st.p50 << " us, p99 " << st.p99 << " us, max " << st.max << " us (checksum "
              << checksum << ")\n";
    emit(a, "loader_next",
         "\"batch\": " + std::to_string(B) + ", \"seq_len\": " + std::to_string(a.seqLen) + ", \"work_ms\": " +
             num(work, 2) + ", \"us_mean\": " + num(st.mean) + ", \"us_p50\": " + num(st.p50) + ", \"us_p99\": " +
             num(st.p99) + ", \"us_max\": " + num(st.max) + ", \"tokens_per_s\": " +
             num(static_cast<double>(B * (a.seqLen + 1)) / st.mean * 1e6, 0) + ", \"steps\": " +
             std::to_string(a.loaderSteps) + ", \"repeats\": " + std::to_string(runs.size()) + ", \"us_mean_all\": " +
             list(st.means));
  }
}

void benchBuild(const Args& a) {
  std::vector<double> build, first;
  std::string describe;
  for (int64_t r = 0; r < a.buildRepeats + 1; ++r) {  // the first is a warm-up
    const auto t0 = Clock::now();
    GptData data(dataOptions(a));
    const auto t1 = Clock::now();
    at::Tensor s = readSamples(data.train(), 0, a.batch, a.vocab);
    const auto t2 = Clock::now();
    if (r == 0) {
      describe = data.describe();
      continue;
    }
    build.push_back(seconds(t0, t1) * 1e3);
    first.push_back(seconds(t1, t2) * 1e3);
  }
  std::cerr << "[tessera " << a.name << "] build: GptData " << median(build) << " ms, first batch "
            << median(first) << " ms (median of " << build.size() << "); " << describe << "\n";
  emit(a, "build",
       "\"build_ms\": " + num(median(build), 4) + ", \"first_batch_ms\": " + num(median(first), 4) +
           ", \"repeats\": " + std::to_string(build.size()) + ", \"build_ms_all\": " + list(build, 4) +
           ", \"describe\": " + quote(describe));
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  try {
    SourceOptions so;
    so.format = parseFormat(a.format);
    if (wants(a, "seq")) benchSequential(a, so);
    if (wants(a, "build")) benchBuild(a);
    if (wants(a, "sample")) benchSamples(a);
    if (wants(a, "loader")) benchLoader(a);
  } catch (const std::exception& e) {
    std::cerr << "tessera_bench_data: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
