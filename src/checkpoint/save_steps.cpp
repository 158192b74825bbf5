#include "checkpoint/save_steps.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cstdio>
#include <filesystem>
#include <set>

#include "checkpoint/files.h"
#include "tessera/comm/settings.h"
#include "tessera/common/error.h"
#include "tessera/common/log.h"

namespace tessera::checkpoint::detail {
namespace fs = std::filesystem;
using namespace files;

namespace {

c10::impl::GenericDict newDict() { return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()); }

std::string keyOf(const Piece& p) {
  return fmt::format("{}@[{}]+[{}]", p.name, fmt::join(p.offset, ","), fmt::join(p.local.sizes(), ","));
}

// For each of my pieces: true when no lower rank holds the same box (that rank writes it).
std::vector<bool> ownedPieces(const std::vector<Piece>& pieces, Communicator& comm) {
  auto dev = comm.scratchOptions().device();
  auto opts = at::TensorOptions().dtype(at::kLong);
  auto n = at::full({1}, static_cast<int64_t>(pieces.size()), opts).to(dev);
  auto counts = at::empty({comm.size()}, opts.device(dev));
  comm.allGather(counts, n)->synchronize();
  int64_t most = counts.max().item<int64_t>();
  std::vector<int64_t> mine(std::max<int64_t>(most, 1), -1);
  for (size_t k = 0; k < pieces.size(); ++k) {
    mine[k] = static_cast<int64_t>(std::hash<std::string>{}(keyOf(pieces[k])) & 0x7fffffffffffffffull);
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

// Fault injection for the tests: a save killed at each file of the protocol.
void faultPoint(const char* point, int rank) { injectFault(settings(), point, rank, "checkpoint"); }

std::string shardFile(int r) { return fmt::format("rank-{}.pt", r); }
std::string indexFile(int r) { return fmt::format("rank-{}.index.pt", r); }

}  // namespace

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

ShardPlan plan(const std::string& dir, const std::vector<Piece>& pieces, Communicator& comm) {
  for (const auto& p : pieces) checkPiece(p, "save");
  const fs::path tmp(dir + ".tmp");
  if (comm.rank() == 0) {
    removeTree(tmp);
    fs::create_directories(tmp);
  }
  comm.barrier()->synchronize();
  ShardPlan out{dir, comm.rank(), comm.size(), {}};
  const auto owned = ownedPieces(pieces, comm);
  std::set<std::string> keys;
  for (size_t k = 0; k < pieces.size(); ++k) {
    if (!owned[k]) continue;
    TESSERA_CHECK(keys.insert(keyOf(pieces[k])).second, "checkpoint save: rank {} gives the piece {} twice",
                  comm.rank(), keyOf(pieces[k]));
    out.owned.push_back(pieces[k]);
  }
  return out;
}

void writeShard(const ShardPlan& p, const std::vector<at::Tensor>& host) {
  TESSERA_CHECK(host.size() == p.owned.size(), "checkpoint save: {} host tensors for {} pieces", host.size(),
                p.owned.size());
  const fs::path tmp(p.dir + ".tmp");
  c10::Dict<std::string, at::Tensor> tensors;
  auto index = c10::impl::GenericList(c10::AnyType::get());
  for (size_t k = 0; k < p.owned.size(); ++k) {
    const auto& piece = p.owned[k];
    const std::string key = keyOf(piece);
    tensors.insert(key, host[k]);
    auto e = newDict();
    e.insert("name", piece.name);
    e.insert("key", key);
    e.insert("shape", piece.globalShape);
    e.insert("offset", piece.offset);
    e.insert("sizes", piece.local.sizes().vec());
    e.insert("dtype", std::string(c10::toString(piece.local.scalar_type())));
    index.push_back(e);
  }
  auto bytes = torch::jit::pickle_save(tensors);
  writeDurably(tmp / shardFile(p.rank), bytes);
  auto idx = newDict();
  idx.insert("pieces", index);
  idx.insert("bytes", static_cast<int64_t>(bytes.size()));
  idx.insert("fnv1a64", static_cast<int64_t>(fnv1a(bytes)));
  writeDurably(tmp / indexFile(p.rank), torch::jit::pickle_save(idx));
  faultPoint("checkpoint-after-write", p.rank);
}

void publish(const std::string& dirName, int world, int64_t step, const std::map<std::string, std::string>& extra,
             const std::map<std::string, std::string>& files, int shardFiles) {
  const fs::path dir(dirName), tmp(dirName + ".tmp"), old(dirName + ".old");
  auto tens = newDict();  // name -> {shape, dtype, pieces}
  auto fileTable = newDict();
  for (int r = 0; r < (shardFiles > 0 ? shardFiles : world); ++r) {
    fs::path ip = tmp / indexFile(r);
    auto in = unpickle(ip, readAll(ip)).toGenericDict();
    auto f = newDict();
    f.insert("bytes", in.at("bytes"));
    f.insert("fnv1a64", in.at("fnv1a64"));
    fileTable.insert(shardFile(r), f);
    for (const auto& ev : in.at("pieces").toListRef()) {
      auto e = ev.toGenericDict();
      std::string name = e.at("name").toStringRef();
      if (!tens.contains(name)) {
        auto t = newDict();
        t.insert("shape", e.at("shape"));
        t.insert("dtype", e.at("dtype"));
        t.insert("pieces", c10::impl::GenericList(c10::AnyType::get()));
        tens.insert(name, t);
      }
      auto t = tens.at(name).toGenericDict();
      TESSERA_CHECK(ints(t.at("shape")) == ints(e.at("shape")) &&
                        t.at("dtype").toStringRef() == e.at("dtype").toStringRef(),
                    "checkpoint save: ranks disagree on the global shape or dtype of '{}' ([{}] {} vs [{}] {})", name,
                    fmt::join(ints(t.at("shape")), ","), t.at("dtype").toStringRef(),
                    fmt::join(ints(e.at("shape")), ","), e.at("dtype").toStringRef());
      auto pe = newDict();
      pe.insert("file", shardFile(r));
      pe.insert("key", e.at("key"));
      pe.insert("offset", e.at("offset"));
      pe.insert("sizes", e.at("sizes"));
      t.at("pieces").toList().push_back(pe);
    }
    fs::remove(ip);
  }
  auto ex = newDict();
  for (const auto& [k, v] : extra) ex.insert(k, v);
  auto meta = newDict();
  meta.insert("version", static_cast<int64_t>(1));
  meta.insert("world", static_cast<int64_t>(world));
  meta.insert("step", step);
  meta.insert("tensors", tens);
  meta.insert("files", fileTable);
  meta.insert("extra", ex);
  meta.insert("checksummed", true);  // metadata.sum must be beside it
  const auto metaBytes = torch::jit::pickle_save(meta);
  writeDurably(tmp / "metadata.pt", metaBytes);
  const auto sum = sumLine(metaBytes);
  writeDurably(tmp / "metadata.sum", std::vector<char>(sum.begin(), sum.end()));
  for (const auto& [name, text] : files) {
    TESSERA_CHECK(!name.empty() && name.find('/') == std::string::npos && name != "metadata.pt" &&
                      name != "metadata.sum" && name.rfind("rank-", 0) != 0,
                  "checkpoint save: '{}' cannot be a file of the checkpoint", name);
    writeDurably(tmp / name, std::vector<char>(text.begin(), text.end()));
  }
  syncDir(tmp);
  faultPoint("checkpoint-after-metadata", 0);
  // A complete checkpoint stays at <dir> or <dir>.old at every instant. <dir> exists only as a
  // renamed complete <dir>.tmp; when it is missing, <dir>.old (an interrupted earlier save's
  // previous checkpoint) is kept until the new one is in place.
  if (fs::exists(dir)) {
    removeTree(old);
    fs::rename(dir, old);
    faultPoint("checkpoint-between-renames", 0);
  }
  fs::rename(tmp, dir);
  syncDir(dir.parent_path().empty() ? fs::path(".") : dir.parent_path());
  faultPoint("checkpoint-before-cleanup", 0);
  removeTree(old);
  log::info("checkpoint: saved step {} to {} ({} ranks{})", step, dir.string(), world,
            shardFiles > 0 ? fmt::format(", {} files", shardFiles) : "");
}

void discard(const std::string& dir) {
  std::error_code ec;
  fs::remove_all(dir + ".tmp", ec);
}

}  // namespace tessera::checkpoint::detail
