// Sharded checkpoints (issue 9): round trip and resharding (4 ranks by rows → 2 ranks by
// columns, → 1 rank whole; tensor-parallel blocks saved at TP 4 and loaded at TP 2 and 1), files readable by Python's torch.load, an interrupted save keeps the
// previous checkpoint, truncated/corrupted files are detected, and DDP training resumed from a
// checkpoint is bitwise identical to an uninterrupted run.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/cuda.h>
#include <torch/optim/sgd.h>

#include <filesystem>
#include <fstream>

#include "tessera/checkpoint/async_save.h"
#include "tessera/checkpoint/checkpoint.h"
#include "harness/multiprocess.h"
#include "models/tiny_models.h"
#include "tessera/parallel/data_parallel/ddp/ddp.h"
#include "tessera/parallel/tensor/checkpoint_pieces.h"

using namespace tessera;
using namespace tessera::testing;
namespace ckpt = tessera::checkpoint;
namespace fs = std::filesystem;

namespace {

at::Tensor fullA() { return at::arange(48, at::kFloat).view({8, 6}) * 0.25; }
at::Tensor fullB() { return at::arange(5, at::kFloat) - 2; }
at::Tensor fullC() { return at::arange(4, at::kLong) * 7; }

fs::path freshDir(const std::string& name) {
  auto d = fs::temp_directory_path() / fmt::format("tessera-ckpt-{}-{}", name, ::getpid());
  fs::remove_all(d);
  fs::remove_all(d.string() + ".tmp");
  return d;
}

// Byte `at` of `p` XOR `mask`: same size, other content.
void flipByte(const fs::path& p, std::uintmax_t at, char mask = 0x01) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.read(&c, 1);
  f.seekp(static_cast<std::streamoff>(at));
  c = static_cast<char>(c ^ mask);
  f.write(&c, 1);
}

// A sharded by rows over the ranks, B replicated, C sharded; `scale` changes the values.
TESSERA_WORKER(ckpt_save_rows) {
  auto ctx = initWorker(w);
  auto [dir, scaleStr] = [&] {
    auto k = w.arg.find('|');
    return std::make_pair(w.arg.substr(0, k), w.arg.substr(k + 1));
  }();
  double scale = std::stod(scaleStr);
  int64_t rows = 8 / w.world;
  std::vector<ckpt::Piece> pieces{
      ckpt::chunkOf("A", (fullA() * scale).narrow(0, w.rank * rows, rows), {8, 6}, 0, w.rank),
      ckpt::whole("B", fullB() * scale),
      ckpt::chunkOf("C", fullC().narrow(0, w.rank * (4 / w.world), 4 / w.world), {4}, 0, w.rank)};
  ckpt::save(dir, pieces, *ctx.world, 17, {{"data_position", "1234"}});
}

// Loads A by columns, B and C whole.
TESSERA_WORKER(ckpt_load_cols) {
  auto ctx = initWorker(w);
  int64_t cols = 6 / w.world;
  std::vector<ckpt::Piece> pieces{ckpt::chunkOf("A", at::zeros({8, cols}), {8, 6}, 1, w.rank),
                                  ckpt::whole("B", at::zeros({5})), ckpt::whole("C", at::zeros({4}, at::kLong))};
  auto meta = ckpt::load(w.arg, pieces);
  WCHECK(meta.step == 17 && meta.world == 4 && meta.extra.at("data_position") == "1234", "metadata step {} world {}",
         meta.step, meta.world);
  WCHECK(pieces[0].local.equal(fullA().narrow(1, w.rank * cols, cols)), "rank {}: A columns differ", w.rank);
  WCHECK(pieces[1].local.equal(fullB()), "B differs");
  WCHECK(pieces[2].local.equal(fullC()), "C differs");
  // Errors name what was wrong.
  std::vector<ckpt::Piece> bad{ckpt::whole("A", at::zeros({6, 8}))};
  expectErrorContaining([&] { ckpt::load(w.arg, bad); }, {"tensor 'A' was saved with shape [8,6], asked for [6,8]"});
  std::vector<ckpt::Piece> badType{ckpt::whole("A", at::zeros({8, 6}, at::kDouble))};
  expectErrorContaining([&] { ckpt::load(w.arg, badType); }, {"tensor 'A' was saved as Float, asked for Double"});
  std::vector<ckpt::Piece> missing{ckpt::whole("D", at::zeros({1}))};
  expectErrorContaining([&] { ckpt::load(w.arg, missing); }, {"holds no tensor 'D'"});
}

RunOptions withArg(int ranks, std::string arg, std::map<std::string, std::string> env = {}) {
  RunOptions o;
  o.ranks = ranks;
  o.timeout = std::chrono::seconds(90);
  o.arg = std::move(arg);
  o.env = std::move(env);
  return o;
}

}  // namespace

TEST(Checkpoint, SaveOnFourRanksLoadResharded) {
  auto dir = freshDir("reshard");
  expectAllOk(runWorkers("ckpt_save_rows", withArg(4, dir.string() + "|1")));
  // Only the lowest rank holding a replicated piece writes it: B is in rank-0.pt only.
  EXPECT_TRUE(fs::exists(dir / "metadata.pt"));
  EXPECT_FALSE(fs::exists(dir.string() + ".tmp"));
  expectAllOk(runWorkers("ckpt_load_cols", withArg(2, dir.string())));
  // One process, no communicator: whole tensors from the 4-rank checkpoint.
  std::vector<ckpt::Piece> all{ckpt::whole("A", at::zeros({8, 6})), ckpt::whole("B", at::zeros({5}))};
  ckpt::load(dir.string(), all);
  EXPECT_TRUE(all[0].local.equal(fullA()));
  EXPECT_TRUE(all[1].local.equal(fullB()));
  // Readable outside tessera: Python's torch.load on the metadata and a shard.
  std::string py = fmt::format(
      "/usr/bin/python3 -c \"import torch; m = torch.load('{0}/metadata.pt'); s = torch.load('{0}/rank-1.pt'); "
      "p = m['tensors']['A']['pieces'][1]; assert m['step'] == 17 and m['world'] == 4, m; "
      "assert p['file'] == 'rank-1.pt' and list(p['offset']) == [2, 0], p; "
      "assert torch.equal(s[p['key']], torch.arange(48.).view(8, 6)[2:4] * 0.25); "
      "assert not any(k.startswith('B@') for k in s), list(s)\"",
      dir.string());
  EXPECT_EQ(std::system(py.c_str()), 0) << py;
  fs::remove_all(dir);
}

TEST(Checkpoint, InterruptedSaveKeepsThePreviousCheckpoint) {
  auto dir = freshDir("interrupt");
  expectAllOk(runWorkers("ckpt_save_rows", withArg(2, dir.string() + "|1")));
  RunOptions o = withArg(2, dir.string() + "|3",
                         {{"TESSERA_FAULT_INJECT", "checkpoint-after-write:1"}, {"TESSERA_TIMEOUT_S", "5"}});
  o.killSiblingsOnFailure = false;
  auto res = runWorkers("ckpt_save_rows", o);
  EXPECT_EQ(res[1].signal, SIGKILL) << res[1].output;
  EXPECT_FALSE(res[0].ok()) << "rank 0 finished a save whose peer died:\n" << res[0].output;
  EXPECT_FALSE(res[0].killedByHarness) << "rank 0 hung:\n" << res[0].output;
  std::vector<ckpt::Piece> a{ckpt::whole("A", at::zeros({8, 6}))};
  ckpt::load(dir.string(), a);
  EXPECT_TRUE(a[0].local.equal(fullA())) << "the interrupted save (values x3) replaced the good checkpoint";
  fs::remove_all(dir);
  fs::remove_all(dir.string() + ".tmp");
}

TEST(Checkpoint, TruncatedOrCorruptedFilesAreDetected) {
  auto dir = freshDir("corrupt");
  expectAllOk(runWorkers("ckpt_save_rows", withArg(2, dir.string() + "|1")));
  auto shard = dir / "rank-1.pt";
  auto size = fs::file_size(shard);
  std::vector<ckpt::Piece> a{ckpt::whole("A", at::zeros({8, 6}))};
  flipByte(shard, size / 2, 0x5a);
  try {
    ckpt::load(dir.string(), a);
    ADD_FAILURE() << "a corrupted shard loaded";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("rank-1.pt is corrupted: its checksum differs"), std::string::npos)
        << e.what();
  }
  fs::resize_file(shard, size / 2);
  try {
    ckpt::load(dir.string(), a);
    ADD_FAILURE() << "a truncated shard loaded";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("rank-1.pt is truncated or corrupted: {} bytes", size / 2)),
              std::string::npos)
        << e.what();
  }
  fs::resize_file(dir / "metadata.pt", 100);
  try {
    ckpt::readMetadata(dir.string());
    ADD_FAILURE() << "a truncated metadata file loaded";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("metadata.pt is truncated or corrupted: 100 bytes, metadata.sum says"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

// ---- resume: DDP + SGD with momentum; data drawn from the global generator (seeded per rank),
// so the RNG state is part of what must be restored.
namespace {

constexpr int kSteps = 6;

struct Trainer {
  explicit Trainer(const WorkerArgs& w)
      : ctx(initWorker(w)),
        model(makeTinyMlp(7)),
        ddp(namedParameters(*model), namedBuffers(*model), ctx.world),
        opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9)) {
    torch::manual_seed(100 + w.rank);
  }
  void step() {
    auto x = torch::randn({4, 8}), y = torch::randn({4, 4});
    opt.zero_grad();
    torch::mse_loss(model->forward(x), y).backward();
    opt.step();
  }
  std::vector<ckpt::Piece> state(bool withMomentum) {
    std::vector<ckpt::Piece> out;
    for (auto& [name, p] : namedParameters(*model)) {
      out.push_back(ckpt::whole("model." + name, p));
      if (!withMomentum) continue;
      auto key = c10::guts::to_string(p.unsafeGetTensorImpl());
      auto& st = opt.state();
      if (!st.count(key)) {
        auto s = std::make_unique<torch::optim::SGDParamState>();
        s->momentum_buffer(torch::zeros_like(p));
        st[key] = std::move(s);
      }
      out.push_back(ckpt::whole("optim.momentum." + name,
                                static_cast<torch::optim::SGDParamState&>(*st[key]).momentum_buffer()));
    }
    // Each rank's own generator state (different per rank: one name per rank).
    out.push_back(ckpt::whole(fmt::format("rng.cpu.rank{}", ctx.world->rank()), rngState()));
    return out;
  }
  static at::Tensor rngState() { return at::detail::getDefaultCPUGenerator().get_state(); }

  Context ctx;
  TinyMlp model;
  DistributedDataParallel ddp;
  torch::optim::SGD opt;
};

std::pair<std::string, std::string> splitArg(const std::string& a) {
  auto k = a.find('|');
  return {a.substr(0, k), a.substr(k + 1)};
}

}  // namespace

// arg "<dir>|<mode>": "full" trains kSteps then saves; "half" trains kSteps/2 then saves;
// "resume" loads, trains the rest, saves.
TESSERA_WORKER(ckpt_train) {
  auto [dir, mode] = splitArg(w.arg);
  Trainer t(w);
  int64_t start = 0;
  if (mode == "resume") {
    auto pieces = t.state(true);
    auto meta = ckpt::load(dir + ".half", pieces);
    auto gen = at::detail::getDefaultCPUGenerator();
    gen.set_state(pieces.back().local);
    start = meta.step;
    WCHECK(start == kSteps / 2 && meta.extra.at("data_position") == std::to_string(start), "resumed at step {}",
           start);
  }
  int64_t end = mode == "half" ? kSteps / 2 : kSteps;
  for (int64_t s = start; s < end; ++s) t.step();
  ckpt::save(mode == "half" ? dir + ".half" : dir + "." + mode, t.state(true), *t.ctx.world, end,
             {{"data_position", std::to_string(end)}});
}

TEST(Checkpoint, ResumedDdpTrainingIsBitwiseIdentical) {
  auto dir = freshDir("resume").string();
  expectAllOk(runWorkers("ckpt_train", withArg(2, dir + "|full")));
  expectAllOk(runWorkers("ckpt_train", withArg(2, dir + "|half")));
  expectAllOk(runWorkers("ckpt_train", withArg(2, dir + "|resume")));
  auto full = ckpt::readMetadata(dir + ".full"), resumed = ckpt::readMetadata(dir + ".resume");
  ASSERT_EQ(full.shapes.size(), resumed.shapes.size());
  int compared = 0;
  for (const auto& [name, shape] : full.shapes) {
    std::vector<ckpt::Piece> a{{name, shape, std::vector<int64_t>(shape.size(), 0), at::empty(shape)}};
    std::vector<ckpt::Piece> b{{name, shape, std::vector<int64_t>(shape.size(), 0), at::empty(shape)}};
    if (name.rfind("rng.", 0) == 0) {
      a[0].local = at::empty(shape, at::kByte);
      b[0].local = at::empty(shape, at::kByte);
    }
    ckpt::load(dir + ".full", a);
    ckpt::load(dir + ".resume", b);
    EXPECT_TRUE(a[0].local.equal(b[0].local)) << name << " differs between the uninterrupted and the resumed run";
    ++compared;
  }
  EXPECT_EQ(compared, 6 + 6 + 2);  // 6 parameters, 6 momentum buffers, 2 generator states
  // And training did move the parameters (the comparison is not between two initial states).
  std::vector<ckpt::Piece> half{ckpt::whole("model.fc1.weight", at::empty({32, 8}))},
      fin{ckpt::whole("model.fc1.weight", at::empty({32, 8}))};
  ckpt::load(dir + ".half", half);
  ckpt::load(dir + ".full", fin);
  EXPECT_FALSE(half[0].local.equal(fin[0].local));
  for (auto s : {".full", ".half", ".resume"}) fs::remove_all(dir + s);
}

// Tensor-parallel blocks (tp::blockPieces): a 2-block stack saved at TP 4, loaded into fresh
// stacks (other weights) at TP 2 (ranks {0,1} and {2,3}) and TP 1 (each rank alone, the
// unsharded layout); each loaded stack must compute what the saved one computes.
namespace {
constexpr int64_t kTpD = 8, kTpHeads = 4;

std::vector<tp::ParallelBlock> tpStack(const CommPtr& g, uint64_t seed, bool perturb) {
  torch::manual_seed(seed);
  std::vector<tp::ParallelBlock> s;
  for (int i = 0; i < 2; ++i) s.emplace_back(g, kTpD, kTpHeads, false, fmt::format("blocks.{}", i));
  if (perturb) {  // the same elementwise change of the full weights on every shard
    at::NoGradGuard ng;
    for (auto& b : s)
      for (auto& p : b->parameters()) p.mul_(1.5).add_(0.125);
  }
  return s;
}

at::Tensor runStack(std::vector<tp::ParallelBlock>& s, const at::Tensor& x) {
  at::Tensor h = x;
  for (auto& b : s) h = b->forward(h);
  return h.detach();
}

std::vector<ckpt::Piece> stackPieces(std::vector<tp::ParallelBlock>& s) {
  std::vector<ckpt::Piece> out;
  for (size_t i = 0; i < s.size(); ++i)
    for (auto& p : tp::blockPieces(*s[i], fmt::format("blocks.{}.", i))) out.push_back(std::move(p));
  return out;
}
}  // namespace

TESSERA_WORKER(ckpt_tp) {
  auto ctx = initWorker(w);
  const std::string dir = w.arg;
  auto x = at::randn({6, 2, kTpD}, at::detail::createCPUGenerator(5));  // [S, B, d], the same on every rank
  auto saved = tpStack(ctx.world, 7, true);
  const auto want = runStack(saved, x);
  auto pieces = stackPieces(saved);
  ckpt::save(dir, pieces, *ctx.world, 3);
  for (int degree : {2, 1}) {
    auto g = ctx.world->split(w.rank / degree, w.rank, fmt::format("tp{}", degree));
    auto fresh = tpStack(g, 99, false);
    WCHECK(!at::allclose(runStack(fresh, x), want, 1e-5, 1e-6), "a fresh TP {} stack already matches: vacuous", degree);
    auto p = stackPieces(fresh);
    ckpt::load(dir, p);
    const auto got = runStack(fresh, x);
    WCHECK(at::allclose(got, want, 1e-5, 1e-6), "rank {}: TP {} loaded from TP 4 differs by {}", w.rank, degree,
           (got - want).abs().max().item<double>());
  }
}

TEST(Checkpoint, TensorParallelBlocksLoadAtOtherDegrees) {
  auto dir = freshDir("tp");
  expectAllOk(runWorkers("ckpt_tp", withArg(4, dir.string())));
  EXPECT_TRUE(fs::exists(dir / "metadata.pt"));
  fs::remove_all(dir);
}

// ---- metadata.pt's checksum (issue 35): a flipped byte, a truncated file, a missing sum file are
// errors naming the file, never a misleading message about the contents (or a load).
namespace {
void expectLoadError(const fs::path& dir, const std::string& text) {
  std::vector<ckpt::Piece> a{ckpt::whole("A", at::zeros({8, 6}))};
  try {
    ckpt::load(dir.string(), a);
    ADD_FAILURE() << "loaded; expected an error containing: " << text;
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}
}  // namespace

TEST(Checkpoint, MetadataChecksumCatchesEveryFlippedByte) {
  auto dir = freshDir("metasum");
  expectAllOk(runWorkers("ckpt_save_rows", withArg(2, dir.string() + "|1")));
  const auto meta = dir / "metadata.pt";
  ASSERT_TRUE(fs::exists(dir / "metadata.sum"));
  const auto size = fs::file_size(meta);
  const auto pristine = fs::temp_directory_path() / fmt::format("tessera-meta-{}.pt", ::getpid());
  fs::copy_file(meta, pristine, fs::copy_options::overwrite_existing);
  int trials = 0;
  for (std::uintmax_t at = 0; at < size; at += std::max<std::uintmax_t>(1, size / 97)) {
    fs::copy_file(pristine, meta, fs::copy_options::overwrite_existing);
    flipByte(meta, at);
    SCOPED_TRACE(fmt::format("byte {} of {}", at, size));
    expectLoadError(dir, fmt::format("{} is corrupted: its checksum differs from the one in metadata.sum", meta.string()));
    ++trials;
  }
  EXPECT_GT(trials, 90);
  fs::copy_file(pristine, meta, fs::copy_options::overwrite_existing);
  fs::resize_file(meta, size - 7);
  expectLoadError(dir, fmt::format("{} is truncated or corrupted: {} bytes, metadata.sum says {}", meta.string(),
                                   size - 7, size));
  fs::copy_file(pristine, meta, fs::copy_options::overwrite_existing);
  fs::remove(dir / "metadata.sum");
  expectLoadError(dir, fmt::format("{} is missing (it holds metadata.pt's checksum)", (dir / "metadata.sum").string()));
  fs::remove(pristine);
  fs::remove_all(dir);
}

// A save killed between its two renames leaves <dir> missing and <dir>.old complete: locate() and
// load() take <dir>.old, and the next save keeps it until the new checkpoint is in place.
TEST(Checkpoint, InterruptedRenameFallsBackToOld) {
  auto dir = freshDir("renames");
  fs::remove_all(dir.string() + ".old");
  expectAllOk(runWorkers("ckpt_save_rows", withArg(2, dir.string() + "|1")));
  RunOptions o = withArg(2, dir.string() + "|3", {{"TESSERA_FAULT_INJECT", "checkpoint-between-renames:0"},
                                                  {"TESSERA_TIMEOUT_S", "5"}});
  o.killSiblingsOnFailure = false;
  auto res = runWorkers("ckpt_save_rows", o);
  EXPECT_EQ(res[0].signal, SIGKILL) << res[0].output;
  ASSERT_FALSE(fs::exists(dir)) << "rank 0 was to die between the renames";
  ASSERT_TRUE(fs::exists(dir.string() + ".old/metadata.pt"));
  EXPECT_EQ(ckpt::locate(dir.string()).value_or(""), dir.string() + ".old");
  std::vector<ckpt::Piece> a{ckpt::whole("A", at::zeros({8, 6}))};
  ckpt::load(dir.string(), a);
  EXPECT_TRUE(a[0].local.equal(fullA())) << "not the previous checkpoint's values";
  // The next save: the new checkpoint at <dir>, the old one gone.
  expectAllOk(runWorkers("ckpt_save_rows", withArg(2, dir.string() + "|5")));
  EXPECT_EQ(ckpt::locate(dir.string()).value_or(""), dir.string());
  EXPECT_FALSE(fs::exists(dir.string() + ".old"));
  ckpt::load(dir.string(), a);
  EXPECT_TRUE(a[0].local.equal(fullA() * 5));
  EXPECT_FALSE(ckpt::locate((dir / "nothing").string()).has_value());
  fs::remove_all(dir);
  fs::remove_all(dir.string() + ".tmp");
}

// AsyncSaver: the same files as save(); the values are those at the call, though the caller
// changes its tensors right after beforeUpdate(); two saves in a row; a rank that dies after its
// shard is named by rank 0's writer, and the previous checkpoint is kept.
TESSERA_WORKER(ckpt_async) {
  auto ctx = initWorker(w);
  auto [dir, mode] = splitArg(w.arg);
  checkpoint::AsyncSaver saver(ctx.world, ctx.store, std::chrono::seconds(mode == "die" ? 3 : 60));
  int64_t rows = 8 / w.world;
  auto a = fullA().narrow(0, w.rank * rows, rows).clone();
  auto b = fullB().clone();
  auto pieces = [&] {
    return std::vector<ckpt::Piece>{ckpt::chunkOf("A", a, {8, 6}, 0, w.rank), ckpt::whole("B", b)};
  };
  if (mode == "die") {  // rank 1 kills itself after writing its shard
    auto p = pieces();
    try {
      saver.save(dir, p, 3, {{"k", "v3"}});
      saver.wait();
      WCHECK(w.rank != 0, "rank 0 published a save whose peer died");
    } catch (const std::exception& e) {
      WCHECK(std::string(e.what()).find("ranks [1] did not write their shards") != std::string::npos, "{}", e.what());
      throw;
    }
    return;
  }
  saver.save(dir, pieces(), 1, {{"k", "v1"}});
  saver.beforeUpdate();
  a.mul_(2);  // the next "optimizer step"
  b.mul_(2);
  saver.save(dir, pieces(), 2, {{"k", "v2"}});  // waits for the first
  saver.wait();
}

TEST(Checkpoint, AsyncSavesWriteTheValuesOfTheirCall) {
  auto dir = freshDir("async");
  expectAllOk(runWorkers("ckpt_async", withArg(2, dir.string() + "|ok")));
  auto meta = ckpt::readMetadata(dir.string());
  EXPECT_EQ(meta.step, 2);
  EXPECT_EQ(meta.extra.at("k"), "v2");
  std::vector<ckpt::Piece> all{ckpt::whole("A", at::zeros({8, 6})), ckpt::whole("B", at::zeros({5}))};
  ckpt::load(dir.string(), all);
  EXPECT_TRUE(all[0].local.equal(fullA() * 2));
  EXPECT_TRUE(all[1].local.equal(fullB() * 2));
  EXPECT_FALSE(fs::exists(dir.string() + ".tmp"));
  EXPECT_TRUE(fs::exists(dir / "metadata.sum"));
  // A peer killed after writing its shard of the next save: rank 0 names it, step 2 is kept.
  RunOptions o = withArg(2, dir.string() + "|die", {{"TESSERA_FAULT_INJECT", "checkpoint-after-write:1"}});
  o.killSiblingsOnFailure = false;
  auto res = runWorkers("ckpt_async", o);
  EXPECT_EQ(res[1].signal, SIGKILL) << res[1].output;
  EXPECT_FALSE(res[0].ok());
  EXPECT_NE(res[0].output.find("ranks [1] did not write their shards"), std::string::npos) << res[0].output;
  meta = ckpt::readMetadata(dir.string());
  EXPECT_EQ(meta.step, 2);
  ckpt::load(dir.string(), all);
  EXPECT_TRUE(all[0].local.equal(fullA() * 2));
  fs::remove_all(dir);
  fs::remove_all(dir.string() + ".tmp");
}

// CUDA tensors (GPU machine; skipped elsewhere): the host copies run on a side stream while the
// caller goes on; beforeUpdate() orders the caller's next kernels after them, so a tensor changed
// right after it is saved with the values of the save's call.
TESSERA_WORKER(ckpt_async_cuda) {
  auto ctx = initWorker(w);
  checkpoint::AsyncSaver saver(ctx.world, ctx.store, std::chrono::seconds(60));
  auto gen = at::detail::createCPUGenerator(3);
  auto a = at::randn({4096, 4096}, gen).to(at::kCUDA);  // 64 MiB: the copy takes a while
  auto b = at::randn({1000}, gen).to(at::kCUDA).to(at::kBFloat16);
  const auto wantA = a.cpu(), wantB = b.cpu();
  saver.save(w.arg, {ckpt::whole("A", a), ckpt::whole("B", b)}, 1);
  saver.beforeUpdate();
  for (int k = 0; k < 8; ++k) a.mul_(1.5);  // the "optimizer step", queued at once
  b.zero_();
  saver.wait();
  std::vector<ckpt::Piece> got{ckpt::whole("A", at::empty({4096, 4096})), ckpt::whole("B", at::empty({1000}, at::kBFloat16))};
  ckpt::load(w.arg, got);
  WCHECK(got[0].local.equal(wantA) && got[1].local.equal(wantB), "the saved values are not those of the call");
}

TEST(Checkpoint, AsyncSaveOfCudaTensors) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto dir = freshDir("async-cuda");
  RunOptions o = withArg(1, dir.string());
  expectAllOk(runWorkers("ckpt_async_cuda", o));
  fs::remove_all(dir);
}
