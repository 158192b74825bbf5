// A run's checkpoints under one root (checkpoint/series.h, issue 52): step-<N> directories, the
// `latest` pointer, keep-last, asynchronous saves committed after publication, and find()'s
// choice: the newest complete checkpoint, said when a newer one is passed over, and a refusal
// naming what is missing when nothing is complete — never "no checkpoint" for a damaged one.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>

#include "harness/multiprocess.h"
#include "tessera/checkpoint/async_save.h"
#include "tessera/checkpoint/checkpoint.h"
#include "tessera/checkpoint/series.h"
#include "tessera/common/error.h"

using namespace tessera;
using namespace tessera::testing;
namespace ckpt = tessera::checkpoint;
namespace fs = std::filesystem;

namespace {

at::Tensor valueAt(int64_t step) { return at::arange(12, at::kFloat).view({4, 3}) * static_cast<double>(step); }

// arg "root|steps|keep|async": saves steps 1..steps (A sharded by rows, B whole) into
// root/step-<s>, rank 0 committing each; async: through an AsyncSaver whose writer commits.
TESSERA_WORKER(series_saves) {
  auto ctx = initWorker(w);
  std::vector<std::string> a;
  std::stringstream ss(w.arg);
  for (std::string item; std::getline(ss, item, '|');) a.push_back(item);
  const std::string root = a.at(0);
  const int steps = std::stoi(a.at(1)), keep = std::stoi(a.at(2));
  const bool async = a.at(3) == "1";
  ckpt::AsyncSaver saver(ctx.world, ctx.store, std::chrono::seconds(30));
  for (int s = 1; s <= steps; ++s) {
    const int64_t rows = 4 / w.world;
    std::vector<ckpt::Piece> pieces{
        ckpt::chunkOf("A", valueAt(s).narrow(0, w.rank * rows, rows).clone(), {4, 3}, 0, w.rank),
        ckpt::whole("B", at::full({2}, static_cast<double>(s)))};
    const auto dir = ckpt::stepDir(root, s);
    if (async) {
      saver.save(dir, pieces, s, {}, {}, [root, s, keep] { ckpt::commitStep(root, s, keep); });
      saver.wait();
    } else {
      ckpt::save(dir, pieces, *ctx.world, s);
      if (w.rank == 0) ckpt::commitStep(root, s, keep);
    }
  }
}

// A full disk, for real: files may not grow past 4 KiB (RLIMIT_FSIZE; writes past it fail with EFBIG).
// The save of 64 KiB fails naming its file and leaves no partial <dir>.tmp (issue 52, item 6).
TESSERA_WORKER(series_disk_full) {
  auto ctx = initWorker(w);
  ::signal(SIGXFSZ, SIG_IGN);
  const rlimit small{4096, 4096};
  WCHECK(::setrlimit(RLIMIT_FSIZE, &small) == 0, "setrlimit failed");
  std::vector<ckpt::Piece> pieces{ckpt::whole("A", at::ones({128, 128}))};
  const std::string dir = ckpt::stepDir(w.arg, 1);
  std::string error;
  try {
    ckpt::save(dir, pieces, *ctx.world, 1);
  } catch (const Error& e) {
    error = e.what();
  }
  WCHECK(error.find(dir + ".tmp/rank-0.pt") != std::string::npos, "the error does not name the file: '{}'", error);
  WCHECK(!fs::exists(dir + ".tmp") && !fs::exists(dir), "a partial save was left: {}", dir);
}

fs::path freshRoot(const std::string& name) {
  auto d = fs::temp_directory_path() / fmt::format("tessera-series-{}-{}", name, ::getpid());
  fs::remove_all(d);
  return d;
}

RunOptions saves(const fs::path& root, int steps, int keep, bool async) {
  RunOptions o;
  o.ranks = 2;
  o.timeout = std::chrono::seconds(90);
  o.arg = fmt::format("{}|{}|{}|{}", root.string(), steps, keep, async ? 1 : 0);
  return o;
}

std::string readFile(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

at::Tensor loadA(const std::string& dir) {
  std::vector<ckpt::Piece> p{ckpt::whole("A", at::zeros({4, 3}))};
  ckpt::load(dir, p);
  return p[0].local;
}

}  // namespace

TEST(Series, StepDirectoriesLatestAndKeepLast) {
  for (const bool async : {false, true}) {
    const auto root = freshRoot(async ? "async" : "sync");
    fs::create_directories(root / "step-9.tmp");  // a save killed earlier: removed by the next commit
    expectAllOk(runWorkers("series_saves", saves(root, 5, 3, async)));
    EXPECT_EQ(readFile(root / "latest"), "step-5\n");
    for (int s = 1; s <= 5; ++s) EXPECT_EQ(fs::exists(root / fmt::format("step-{}", s)), s >= 3) << "step-" << s;
    EXPECT_FALSE(fs::exists(root / "step-9.tmp")) << "a stale partial save was left behind";
    const auto found = ckpt::find(root.string());
    ASSERT_TRUE(found.has_value());
    EXPECT_EQ(found->dir, (root / "step-5").string());
    EXPECT_EQ(found->step, 5);
    EXPECT_TRUE(found->note.empty()) << found->note;
    // Every reader resolves the root: locate(), load(), readMetadata().
    EXPECT_EQ(ckpt::locate(root.string()).value_or(""), (root / "step-5").string());
    EXPECT_TRUE(loadA(root.string()).equal(valueAt(5)));
    EXPECT_EQ(ckpt::readMetadata(root.string()).step, 5);
    fs::remove_all(root);
  }
}

// The newest checkpoint damaged: the newest complete older one is used and the note says what was
// passed over; nothing complete: an error listing every candidate and what it lacks.
TEST(Series, IncompleteCheckpointsArePassedOverLoudlyOrRefused) {
  const auto root = freshRoot("damaged");
  expectAllOk(runWorkers("series_saves", saves(root, 3, 0, false)));
  fs::remove(root / "step-3" / "metadata.pt");
  auto found = ckpt::find(root.string());
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->dir, (root / "step-2").string());
  EXPECT_NE(found->note.find("step-3: " + (root / "step-3" / "metadata.pt").string() + " is missing"),
            std::string::npos)
      << found->note;
  EXPECT_TRUE(loadA(root.string()).equal(valueAt(2)));
  fs::resize_file(root / "step-2" / "rank-1.pt", 100);
  found = ckpt::find(root.string());
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->step, 1);
  EXPECT_NE(found->note.find("rank-1.pt is truncated or corrupted: 100 bytes"), std::string::npos) << found->note;
  fs::remove(root / "step-1" / "metadata.sum");
  const auto e = errorOf([&] { ckpt::find(root.string()); });
  EXPECT_NE(e.find(root.string() + " holds checkpoints but none is complete"), std::string::npos) << e;
  for (const char* what : {"step-3: ", "step-2: ", "step-1: ", "metadata.sum is missing"}) {
    EXPECT_NE(e.find(what), std::string::npos) << what << " not in: " << e;
  }
  // `latest` naming a directory that is gone is said too.
  fs::remove_all(root);
  expectAllOk(runWorkers("series_saves", saves(root, 1, 0, false)));
  std::ofstream(root / "latest") << "step-7\n";
  found = ckpt::find(root.string());
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->step, 1);
  EXPECT_NE(found->note.find("step-7 (named by"), std::string::npos) << found->note;
  fs::remove_all(root);
}

// A single-directory checkpoint (older tessera's, or checkpoint::save's own): complete, missing
// its metadata (refused, or <dir>.old used and said), and directories that hold no checkpoint.
TEST(Series, SingleDirectoryCheckpoints) {
  const auto base = freshRoot("single");
  const auto dir = base / "ck";
  expectAllOk(runWorkers("series_saves", saves(base, 1, 0, false)));
  fs::rename(base / "step-1", dir);
  auto found = ckpt::find(dir.string());
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->dir, dir.string());
  EXPECT_TRUE(found->note.empty());
  fs::copy(dir, dir.string() + ".keep", fs::copy_options::recursive);
  fs::remove(dir / "metadata.pt");
  auto e = errorOf([&] { ckpt::find(dir.string()); });
  EXPECT_NE(e.find(dir.string() + " is not a complete checkpoint, so nothing was resumed: " +
                   (dir / "metadata.pt").string() + " is missing"),
            std::string::npos)
      << e;
  fs::rename(dir.string() + ".keep", dir.string() + ".old");
  found = ckpt::find(dir.string());
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->dir, dir.string() + ".old");
  EXPECT_NE(found->note.find(dir.string() + " is incomplete ("), std::string::npos) << found->note;
  fs::remove_all(dir);
  found = ckpt::find(dir.string());
  ASSERT_TRUE(found.has_value());
  EXPECT_NE(found->note.find(dir.string() + " is missing (a save was interrupted"), std::string::npos) << found->note;
  // No checkpoint: a missing directory, an empty one, one with other files.
  fs::remove_all(dir.string() + ".old");
  EXPECT_FALSE(ckpt::find(dir.string()).has_value());
  fs::create_directories(dir);
  EXPECT_FALSE(ckpt::find(dir.string()).has_value());
  std::ofstream(dir / "notes.txt") << "mine\n";
  EXPECT_FALSE(ckpt::find(dir.string()).has_value());
  fs::remove_all(base);
}

TEST(Series, FailedSaveLeavesNoPartialDirectory) {
  const auto root = freshRoot("full");
  RunOptions o;
  o.ranks = 1;
  o.timeout = std::chrono::seconds(60);
  o.arg = root.string();
  expectAllOk(runWorkers("series_disk_full", o));
  fs::remove_all(root);
}
