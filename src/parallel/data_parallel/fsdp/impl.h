#pragma once
// Internal: FullyShardedDataParallel's state and its implementation (fsdp.cpp: construction,
// accessors, gradients; gather.cpp: forward; backward.cpp; embedding_rows.cpp; state_dict.cpp;
// grad_views.cpp; grad_sinks.cpp). The public class forwards to it (fsdp.h's contract).
#include <ATen/core/Tensor.h>

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessera/parallel/data_parallel/fsdp/fsdp.h"
#include "parallel/data_parallel/fsdp/unit_state.h"
#include "parallel/data_parallel/gathered_rows.h"

namespace tessera {

struct FullyShardedDataParallel::Impl {
  using Fn = FullyShardedDataParallel::Fn;
  using MultiFn = FullyShardedDataParallel::MultiFn;

  Impl(std::vector<FsdpUnitSpec> specs, CommPtr comm, FsdpOptions o);
  ~Impl();

  // The public methods (fsdp.h).
  std::vector<at::Tensor> runUnit(size_t unit, const std::vector<at::Tensor>& inputs, const MultiFn& fn);
  void reshardAll();
  void endKeep();  // KeepGathered's end: every unit resharded
  std::vector<int> leadingUnits() const;
  std::vector<int> reduceOrder() const;
  void gatherForNextForward(const std::vector<int>& units);
  void unshardAll();
  void zeroGrad();
  void setGradViews(size_t u, std::vector<std::pair<int64_t, at::Tensor>> views);
  at::Tensor clipGradNorm(double maxNorm);
  at::Tensor gradShard(size_t u) const;
  at::Tensor gatherFull(size_t u, const at::Tensor& shard) const;
  std::map<std::string, at::Tensor> fullStateDict();
  void loadFullStateDict(const std::map<std::string, at::Tensor>& sd);
  std::map<std::string, at::Tensor> shardedStateDict() const;
  void loadShardedStateDict(const std::map<std::string, at::Tensor>& sd);
  void resetStats();
  int shardRank() const { return shardComm_->rank(); }
  const std::string& unitName(size_t u) const { return units_.at(u)->name; }
  const fsdp::FlatLayout& layout(size_t u) const { return units_.at(u)->layout; }
  at::Tensor masterShard(size_t u) const { return units_.at(u)->master; }

  // Called by the autograd hooks (hooks.h).
  void onPreBackward(int u);
  void onGradReady(int u, int param);

  void gather(int u, bool prefetch);
  void waitGathered(int u);
  void reshard(int u);
  void keepOrReshard(int u);  // a unit done for now: kept gathered inside KeepGathered, else resharded
  void prefetchAfter(const std::vector<int>& order, int u);
  void beginBackward();
  void warnRepeatedRuns();
  void checkLoadable(const char* fn) const;
  void dropGatheredAhead();
  void processGrads(int u);
  void drainReduceScatters(int current);
  void releaseReduceInputs(size_t keep);
  void launchReady();
  void finalizeBackward();
  void resetPass();
  // A unit of `params` (checked), its flat buffer and master shard, its parameters views of it.
  std::unique_ptr<fsdp::Unit> makeUnit(const FsdpUnitSpec& spec,
                                       const std::vector<std::pair<std::string, at::Tensor>>& params, int u);
  // grad_sinks.cpp (accumulateGradInGemm).
  void installGradSinks();
  void removeGradSinks();
  // embedding_rows.cpp (gatherEmbeddingRows).
  void installRowSinks();
  void removeRowSinks();
  bool offerRows(int u, int entry, const at::Tensor& ids, const at::Tensor& rows);
  void addGatheredRows();
  void agreeReduceOrder();
  bool reshardsAfterForward(int u) const;

  CommPtr world_, shardComm_, replicaComm_;
  FsdpOptions opts_;
  std::vector<std::unique_ptr<fsdp::Unit>> units_;
  std::vector<size_t> unitBytes_;
  std::vector<bool> alive_;
  FsdpStats stats_;
  bool sync_ = true;
  bool keep_ = false;  // a KeepGathered scope is open: units stay gathered (marked `kept`)
  int running_ = -1;
  // Iteration bookkeeping: first-run order of this pass, the last finished pass's order.
  std::vector<int> passOrder_, plannedOrder_, backwardOrder_;
  bool passOpen_ = false, inBackward_ = false;
  size_t nextLaunch_ = 0;
  // Reduce-scatter inputs still in flight, oldest first, with their ops (releaseReduceInputs).
  std::deque<std::pair<at::Tensor, WorkPtr>> reduceIns_;
  // gatherEmbeddingRows: the rows gathered in this backward; the units in the order their gradients
  // were ready in this backward, and the reduce order agreed after the first synchronised one.
  struct EntryRows {
    int unit = 0, entry = 0;  // entry: index into the unit's layout entries
    GatheredRows gathered;
  };
  std::vector<EntryRows> gathered_;
  std::vector<int> readyOrder_, agreedOrder_;  // agreedOrder_: empty until agreed
};

}  // namespace tessera
