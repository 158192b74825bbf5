#include "tessera/checkpoint/checkpoint.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

#include "checkpoint/files.h"
#include "checkpoint/opened.h"
#include "checkpoint/save_steps.h"
#include "tessera/checkpoint/series.h"
#include "tessera/common/error.h"
#include "tessera/common/log.h"

namespace tessera::checkpoint {
namespace fs = std::filesystem;
using namespace files;
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

void save(const std::string& dir, const std::vector<Piece>& pieces, Communicator& comm, int64_t step,
          const std::map<std::string, std::string>& extra, const std::map<std::string, std::string>& files) {
  auto p = detail::plan(dir, pieces, comm);
  std::vector<at::Tensor> host;
  for (const auto& piece : p.owned) host.push_back(piece.local.detach().to(at::kCPU).contiguous().clone());
  try {
    detail::writeShard(p, host);
  } catch (...) {
    detail::discard(dir);  // a full disk keeps no partial <dir>.tmp
    throw;
  }
  comm.barrier()->synchronize();
  if (comm.rank() == 0) {
    try {
      detail::publish(dir, comm.size(), step, extra, files);
    } catch (...) {
      detail::discard(dir);
      throw;
    }
  }
  comm.barrier()->synchronize();
}

std::optional<std::string> locate(const std::string& dir) {
  const auto found = find(dir);
  return found ? std::optional<std::string>(found->dir) : std::nullopt;
}

namespace detail {

Opened openExact(const fs::path& dir) {
  const fs::path mp = dir / "metadata.pt", sp = dir / "metadata.sum";
  const auto bytes = readAll(mp);
  const bool hasSum = fs::exists(sp);
  if (hasSum) {
    const auto sum = readAll(sp);
    checkSum(mp, bytes, sp, std::string(sum.begin(), sum.end()));
  }
  Opened o{dir, unpickle(mp, bytes).toGenericDict()};
  TESSERA_CHECK(o.meta.contains("version") && o.meta.at("version").isInt() && o.meta.at("version").toInt() == 1,
                "checkpoint: {} has an unknown format version", mp.string());
  // Saved with a checksum: its sum file must be there (checkpoints of older tessera have neither).
  TESSERA_CHECK(hasSum || !o.meta.contains("checksummed"),
                "checkpoint: {} is missing (it holds metadata.pt's checksum)", sp.string());
  for (const char* key : {"step", "world", "tensors", "files", "extra"}) {
    TESSERA_CHECK(o.meta.contains(key), "checkpoint: {} is corrupted: it has no '{}'", mp.string(), key);
  }
  return o;
}

}  // namespace detail

namespace {
using detail::Opened;

// The checkpoint to read for `dirName` (series.h's find), said when it is not the newest.
Opened openDir(const std::string& dirName) {
  const auto found = find(dirName);
  TESSERA_CHECK(found, "checkpoint: no checkpoint at {} (no metadata.pt there, in a step-<N> directory, nor in {}.old)",
                dirName, dirName);
  if (!found->note.empty()) log::warn("checkpoint: {}", found->note);
  return detail::openExact(found->dir);
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

struct Reader::Impl {
  Opened o;
  std::string dirString;
  Metadata meta;
  c10::impl::GenericDict tens = c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
  c10::impl::GenericDict files = c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
  std::map<std::string, c10::Dict<std::string, at::Tensor>> mapped;  // shard file -> {key: tensor over the mapping}

  c10::Dict<std::string, at::Tensor>& fileTensors(const std::string& file) {
    auto it = mapped.find(file);
    if (it != mapped.end()) return it->second;
    TESSERA_CHECK(files.contains(file), "checkpoint: {} names a file {} it does not list",
                  (o.dir / "metadata.pt").string(), file);
    auto f = files.at(file).toGenericDict();
    auto d = mapShard(o.dir / file, f.at("bytes").toInt(), f.at("fnv1a64").toInt());
    return mapped.emplace(file, c10::impl::toTypedDict<std::string, at::Tensor>(d.toGenericDict())).first->second;
  }
};

Reader::Reader(const std::string& dir) : impl_(std::make_unique<Impl>()) {
  impl_->o = openDir(dir);
  impl_->dirString = impl_->o.dir.string();
  impl_->meta = summarize(impl_->o);
  impl_->tens = impl_->o.meta.at("tensors").toGenericDict();
  impl_->files = impl_->o.meta.at("files").toGenericDict();
}
Reader::~Reader() = default;

const Metadata& Reader::metadata() const { return impl_->meta; }
const std::string& Reader::dir() const { return impl_->dirString; }
bool Reader::contains(const std::string& name) const { return impl_->tens.contains(name); }

at::Tensor Reader::read(const std::string& name) {
  TESSERA_CHECK(contains(name), "checkpoint load: {} holds no tensor '{}'", impl_->o.dir.string(), name);
  auto t = impl_->tens.at(name).toGenericDict();
  const auto shape = ints(t.at("shape"));
  const std::string dtype = t.at("dtype").toStringRef();
  at::ScalarType type = at::kFloat;
  bool known = false;
  for (auto s : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kLong, at::kInt, at::kShort, at::kChar,
                 at::kByte, at::kBool}) {
    if (dtype == c10::toString(s)) type = s, known = true;
  }
  TESSERA_CHECK(known, "checkpoint load: tensor '{}' was saved as {}, which tessera does not read", name, dtype);
  std::vector<Piece> one{{name, shape, std::vector<int64_t>(shape.size(), 0), at::empty(shape, type)}};
  load(one);
  return one[0].local;
}

Metadata load(const std::string& dirName, std::vector<Piece>& pieces) {
  Reader r(dirName);
  r.load(pieces);
  return r.metadata();
}

void Reader::load(std::vector<Piece>& pieces) {
  auto& tens = impl_->tens;
  const auto& dirName = impl_->o.dir;
  for (auto& p : pieces) {
    detail::checkPiece(p, "load");
    TESSERA_CHECK(tens.contains(p.name), "checkpoint load: {} holds no tensor '{}'", dirName.string(), p.name);
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
      at::Tensor src = impl_->fileTensors(e.at("file").toStringRef()).at(e.at("key").toStringRef());
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
}

}  // namespace tessera::checkpoint
