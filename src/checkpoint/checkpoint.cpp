#include "checkpoint/checkpoint.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>

#include <filesystem>
#include <fstream>
#include <set>

#include "comm/settings.h"
#include "common/error.h"
#include "common/log.h"

namespace tessera::checkpoint {
namespace fs = std::filesystem;
namespace {

constexpr int64_t kVersion = 1;

// rm -r with POSIX nftw instead of std::filesystem::remove_all: on the GPU image (CUDA LibTorch
// 2.11) remove_all of a non-empty directory crashed the process (SIGSEGV, 2026-11-22: every save
// that replaced an existing checkpoint), presumably a second std::filesystem implementation
// interposed by a loaded library. A missing path is fine; other failures are tessera::Error.
void removeTree(const fs::path& p) {
  struct stat st{};
  if (::lstat(p.c_str(), &st) != 0) return;  // nothing there
  auto rm = [](const char* path, const struct stat*, int, FTW*) { return ::remove(path); };
  TESSERA_CHECK(::nftw(p.c_str(), rm, 16, FTW_DEPTH | FTW_PHYS) == 0, "checkpoint: cannot remove {}: {}", p.string(),
                std::strerror(errno));
}

uint64_t fnv1a(const std::vector<char>& b) {
  uint64_t h = 1469598103934665603ull;
  for (char c : b) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

void writeDurably(const fs::path& p, const std::vector<char>& bytes) {
  int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  TESSERA_CHECK(fd >= 0, "checkpoint: cannot create {}: {}", p.string(), std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      ::close(fd);
      throw Error(fmt::format("checkpoint: writing {} failed after {} of {} bytes: {}", p.string(), done,
                              bytes.size(), std::strerror(e)));
    }
    done += static_cast<size_t>(n);
  }
  bool ok = ::fsync(fd) == 0;
  ::close(fd);
  TESSERA_CHECK(ok, "checkpoint: fsync of {} failed: {}", p.string(), std::strerror(errno));
}

void syncDir(const fs::path& d) {
  int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

std::vector<char> readAll(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  TESSERA_CHECK(f.good(), "checkpoint: cannot open {}", p.string());
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

c10::IValue unpickle(const fs::path& p, const std::vector<char>& bytes) {
  try {
    return torch::jit::pickle_load(bytes);
  } catch (const std::exception& e) {
    throw Error(fmt::format("checkpoint: {} is corrupted or truncated ({} bytes): {}", p.string(), bytes.size(),
                            std::string(e.what()).substr(0, 300)));
  }
}

std::vector<int64_t> ints(const c10::IValue& v) {
  if (v.isIntList()) return v.toIntVector();
  std::vector<int64_t> out;
  for (const auto& e : v.toListRef()) out.push_back(e.toInt());
  return out;
}

c10::impl::GenericDict anyDict() { return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()); }

std::string boxKey(const Piece& p) {
  return fmt::format("{}@[{}]+[{}]", p.name, fmt::join(p.offset, ","), fmt::join(p.local.sizes(), ","));
}

void checkPiece(const Piece& p, const char* op) {
  TESSERA_CHECK(p.local.defined(), "checkpoint {}: tensor '{}' is undefined", op, p.name);
  TESSERA_CHECK(p.offset.size() == p.globalShape.size() && p.local.dim() == static_cast<int64_t>(p.globalShape.size()),
                "checkpoint {}: tensor '{}': piece of {} dims at offset [{}] does not fit global shape [{}]", op, p.name,
                p.local.dim(), fmt::join(p.offset, ","), fmt::join(p.globalShape, ","));
  for (size_t d = 0; d < p.offset.size(); ++d) {
    TESSERA_CHECK(p.offset[d] >= 0 && p.offset[d] + p.local.size(d) <= p.globalShape[d],
                  "checkpoint {}: tensor '{}': piece [{}] at offset [{}] exceeds global shape [{}] in dim {}", op,
                  p.name, fmt::join(p.local.sizes(), ","), fmt::join(p.offset, ","), fmt::join(p.globalShape, ","), d);
  }
}

at::Device commDevice(Communicator& comm) {
  return comm.backend() == Backend::Nccl ? at::Device(at::kCUDA) : at::Device(at::kCPU);
}

// For each of my pieces: true when no lower rank holds the same box (that rank writes it).
std::vector<bool> ownedPieces(const std::vector<Piece>& pieces, Communicator& comm) {
  auto dev = commDevice(comm);
  auto opts = at::TensorOptions().dtype(at::kLong);
  auto n = at::full({1}, static_cast<int64_t>(pieces.size()), opts).to(dev);
  auto counts = at::empty({comm.size()}, opts.device(dev));
  comm.allGather(counts, n)->synchronize();
  int64_t most = counts.max().item<int64_t>();
  std::vector<int64_t> mine(std::max<int64_t>(most, 1), -1);
  for (size_t k = 0; k < pieces.size(); ++k) {
    mine[k] = static_cast<int64_t>(std::hash<std::string>{}(boxKey(pieces[k])) & 0x7fffffffffffffffull);
  }
  auto all = at::empty({comm.size() * static_cast<int64_t>(mine.size())}, opts.device(dev));
  comm.allGather(all, at::tensor(mine, opts).to(dev))->synchronize();
  auto cpu = all.cpu();
  const int64_t* v = cpu.data_ptr<int64_t>();
  std::set<int64_t> lower(v, v + comm.rank() * mine.size());
  std::vector<bool> owned;
  for (size_t k = 0; k < pieces.size(); ++k) owned.push_back(!lower.count(mine[k]));
  return owned;
}

std::string rankFile(int r) { return fmt::format("rank-{}.pt", r); }

}  // namespace

Piece whole(const std::string& name, const at::Tensor& t) {
  return Piece{name, t.sizes().vec(), std::vector<int64_t>(t.dim(), 0), t};
}

Piece chunkOf(const std::string& name, const at::Tensor& local, const std::vector<int64_t>& globalShape, int64_t dim,
              int64_t index) {
  std::vector<int64_t> off(globalShape.size(), 0);
  TESSERA_CHECK(dim >= 0 && dim < static_cast<int64_t>(globalShape.size()),
                "checkpoint: tensor '{}': dim {} out of range for shape [{}]", name, dim, fmt::join(globalShape, ","));
  off[dim] = index * local.size(dim);
  return Piece{name, globalShape, off, local};
}

void save(const std::string& dirName, const std::vector<Piece>& pieces, Communicator& comm, int64_t step,
          const std::map<std::string, std::string>& extra) {
  for (const auto& p : pieces) checkPiece(p, "save");
  const fs::path dir(dirName), tmp(dirName + ".tmp"), old(dirName + ".old");
  if (comm.rank() == 0) {
    removeTree(tmp);
    fs::create_directories(tmp);
  }
  comm.barrier()->synchronize();

  auto owned = ownedPieces(pieces, comm);
  c10::Dict<std::string, at::Tensor> tensors;
  auto index = c10::impl::GenericList(c10::AnyType::get());
  for (size_t k = 0; k < pieces.size(); ++k) {
    if (!owned[k]) continue;
    const auto& p = pieces[k];
    std::string key = boxKey(p);
    TESSERA_CHECK(!tensors.contains(key), "checkpoint save: rank {} gives the piece {} twice", comm.rank(), key);
    tensors.insert(key, p.local.detach().to(at::kCPU).contiguous().clone());
    auto e = anyDict();
    e.insert("name", p.name);
    e.insert("key", key);
    e.insert("shape", p.globalShape);
    e.insert("offset", p.offset);
    e.insert("sizes", p.local.sizes().vec());
    e.insert("dtype", std::string(c10::toString(p.local.scalar_type())));
    index.push_back(e);
  }
  auto bytes = torch::jit::pickle_save(tensors);
  writeDurably(tmp / rankFile(comm.rank()), bytes);
  auto idx = anyDict();
  idx.insert("pieces", index);
  idx.insert("bytes", static_cast<int64_t>(bytes.size()));
  idx.insert("fnv1a64", static_cast<int64_t>(fnv1a(bytes)));
  writeDurably(tmp / fmt::format("rank-{}.index.pt", comm.rank()), torch::jit::pickle_save(idx));
  // Fault injection for the tests (an interrupted save): TESSERA_FAULT_INJECT=checkpoint-after-write:<rank>.
  if (settings().faultInject == fmt::format("checkpoint-after-write:{}", comm.rank())) {
    log::error("checkpoint: TESSERA_FAULT_INJECT: rank {} kills itself after writing its shard", comm.rank());
    ::raise(SIGKILL);
  }
  comm.barrier()->synchronize();

  if (comm.rank() == 0) {
    auto tens = anyDict();  // name -> {shape, dtype, pieces}
    auto files = anyDict();
    for (int r = 0; r < comm.size(); ++r) {
      fs::path ip = tmp / fmt::format("rank-{}.index.pt", r);
      auto in = unpickle(ip, readAll(ip)).toGenericDict();
      auto f = anyDict();
      f.insert("bytes", in.at("bytes"));
      f.insert("fnv1a64", in.at("fnv1a64"));
      files.insert(rankFile(r), f);
      for (const auto& ev : in.at("pieces").toListRef()) {
        auto e = ev.toGenericDict();
        std::string name = e.at("name").toStringRef();
        if (!tens.contains(name)) {
          auto t = anyDict();
          t.insert("shape", e.at("shape"));
          t.insert("dtype", e.at("dtype"));
          t.insert("pieces", c10::impl::GenericList(c10::AnyType::get()));
          tens.insert(name, t);
        }
        auto t = tens.at(name).toGenericDict();
        TESSERA_CHECK(ints(t.at("shape")) == ints(e.at("shape")) && t.at("dtype").toStringRef() == e.at("dtype").toStringRef(),
                      "checkpoint save: ranks disagree on the global shape or dtype of '{}' ([{}] {} vs [{}] {})", name,
                      fmt::join(ints(t.at("shape")), ","), t.at("dtype").toStringRef(),
                      fmt::join(ints(e.at("shape")), ","), e.at("dtype").toStringRef());
        auto pe = anyDict();
        pe.insert("file", rankFile(r));
        pe.insert("key", e.at("key"));
        pe.insert("offset", e.at("offset"));
        pe.insert("sizes", e.at("sizes"));
        t.at("pieces").toList().push_back(pe);
      }
      fs::remove(ip);
    }
    auto ex = anyDict();
    for (const auto& [k, v] : extra) ex.insert(k, v);
    auto meta = anyDict();
    meta.insert("version", kVersion);
    meta.insert("world", static_cast<int64_t>(comm.size()));
    meta.insert("step", step);
    meta.insert("tensors", tens);
    meta.insert("files", files);
    meta.insert("extra", ex);
    writeDurably(tmp / "metadata.pt", torch::jit::pickle_save(meta));
    syncDir(tmp);
    // The previous checkpoint stays complete at <dir> or <dir>.old at every instant.
    removeTree(old);
    if (fs::exists(dir)) fs::rename(dir, old);
    fs::rename(tmp, dir);
    syncDir(dir.parent_path().empty() ? fs::path(".") : dir.parent_path());
    removeTree(old);
    log::info("checkpoint: saved step {} to {} ({} ranks)", step, dir.string(), comm.size());
  }
  comm.barrier()->synchronize();
}

namespace {

struct Opened {
  fs::path dir;
  c10::impl::GenericDict meta = anyDict();
};

Opened openDir(const std::string& dirName) {
  fs::path dir(dirName);
  if (!fs::exists(dir / "metadata.pt") && fs::exists(fs::path(dirName + ".old") / "metadata.pt")) {
    log::warn("checkpoint: {} is missing (a save was interrupted between its renames); using {}.old", dirName, dirName);
    dir = dirName + ".old";
  }
  fs::path mp = dir / "metadata.pt";
  TESSERA_CHECK(fs::exists(mp), "checkpoint: no checkpoint at {} (no metadata.pt)", dirName);
  Opened o{dir, unpickle(mp, readAll(mp)).toGenericDict()};
  TESSERA_CHECK(o.meta.contains("version") && o.meta.at("version").toInt() == kVersion,
                "checkpoint: {} has an unknown format version", mp.string());
  return o;
}

Metadata summarize(const Opened& o) {
  Metadata m;
  m.step = o.meta.at("step").toInt();
  m.world = static_cast<int>(o.meta.at("world").toInt());
  for (const auto& kv : o.meta.at("extra").toGenericDict()) m.extra[kv.key().toStringRef()] = kv.value().toStringRef();
  for (const auto& kv : o.meta.at("tensors").toGenericDict()) {
    m.shapes[kv.key().toStringRef()] = ints(kv.value().toGenericDict().at("shape"));
  }
  return m;
}

}  // namespace

Metadata readMetadata(const std::string& dir) { return summarize(openDir(dir)); }

Metadata load(const std::string& dirName, std::vector<Piece>& pieces) {
  auto o = openDir(dirName);
  auto tens = o.meta.at("tensors").toGenericDict();
  auto files = o.meta.at("files").toGenericDict();
  std::map<std::string, c10::Dict<std::string, at::Tensor>> cache;
  auto fileTensors = [&](const std::string& file) -> c10::Dict<std::string, at::Tensor>& {
    auto it = cache.find(file);
    if (it != cache.end()) return it->second;
    fs::path p = o.dir / file;
    TESSERA_CHECK(fs::exists(p), "checkpoint: {} is missing", p.string());
    auto bytes = readAll(p);
    auto f = files.at(file).toGenericDict();
    TESSERA_CHECK(static_cast<int64_t>(bytes.size()) == f.at("bytes").toInt(),
                  "checkpoint: {} is truncated or corrupted: {} bytes, the metadata says {}", p.string(), bytes.size(),
                  f.at("bytes").toInt());
    TESSERA_CHECK(static_cast<int64_t>(fnv1a(bytes)) == f.at("fnv1a64").toInt(),
                  "checkpoint: {} is corrupted: its checksum differs from the one saved", p.string());
    auto d = c10::impl::toTypedDict<std::string, at::Tensor>(unpickle(p, bytes).toGenericDict());
    return cache.emplace(file, std::move(d)).first->second;
  };

  for (auto& p : pieces) {
    checkPiece(p, "load");
    TESSERA_CHECK(tens.contains(p.name), "checkpoint load: {} holds no tensor '{}'", o.dir.string(), p.name);
    auto t = tens.at(p.name).toGenericDict();
    auto shape = ints(t.at("shape"));
    TESSERA_CHECK(shape == p.globalShape, "checkpoint load: tensor '{}' was saved with shape [{}], asked for [{}]",
                  p.name, fmt::join(shape, ","), fmt::join(p.globalShape, ","));
    std::string dtype = t.at("dtype").toStringRef();
    TESSERA_CHECK(dtype == c10::toString(p.local.scalar_type()),
                  "checkpoint load: tensor '{}' was saved as {}, asked for {}", p.name, dtype,
                  c10::toString(p.local.scalar_type()));
    int64_t covered = 0;
    for (const auto& ev : t.at("pieces").toListRef()) {
      auto e = ev.toGenericDict();
      auto off = ints(e.at("offset")), sz = ints(e.at("sizes"));
      std::vector<int64_t> lo(shape.size()), len(shape.size());
      bool overlap = true;
      int64_t vol = 1;
      for (size_t d = 0; d < shape.size(); ++d) {
        lo[d] = std::max(off[d], p.offset[d]);
        int64_t hi = std::min(off[d] + sz[d], p.offset[d] + p.local.size(d));
        len[d] = hi - lo[d];
        overlap = overlap && len[d] > 0;
        vol *= std::max<int64_t>(len[d], 0);
      }
      if (!overlap) continue;
      at::Tensor src = fileTensors(e.at("file").toStringRef()).at(e.at("key").toStringRef());
      at::Tensor dst = p.local;
      for (size_t d = 0; d < shape.size(); ++d) {
        src = src.narrow(d, lo[d] - off[d], len[d]);
        dst = dst.narrow(d, lo[d] - p.offset[d], len[d]);
      }
      at::NoGradGuard ng;
      dst.copy_(src);
      covered += vol;
    }
    TESSERA_CHECK(covered == p.local.numel(),
                  "checkpoint load: tensor '{}': the saved pieces cover {} of the {} elements asked for at offset [{}]",
                  p.name, covered, p.local.numel(), fmt::join(p.offset, ","));
  }
  return summarize(o);
}

}  // namespace tessera::checkpoint
