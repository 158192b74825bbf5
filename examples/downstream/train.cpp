// downstream_train: a program outside tessera's tree that links the installed package
// (find_package(tessera) gives tessera::tessera). It trains a small MLP on a synthetic
// regression with tessera's DDP, each rank on its share of the batch, and checks on every rank
// that the result is the single-process training of the same model on the whole batch and that
// the loss fell.
//
//   downstream_train                               # under torchrun, srun --mpi=pmix, mpirun
//   downstream_train --rank R --world W --port P   # explicit: rank 0 hosts the store on port P
//
// Exit status 0 when both checks pass on this rank, 1 otherwise (the message says why).
#include <tessera/tessera.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <string>

namespace {

struct MlpImpl : torch::nn::Module {
  MlpImpl() : fc1(register_module("fc1", torch::nn::Linear(8, 32))), fc2(register_module("fc2", torch::nn::Linear(32, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Mlp);

tessera::InitOptions parseArgs(int argc, char** argv) {
  tessera::InitOptions o;
  TESSERA_CHECK(argc % 2 == 1, "downstream_train: flags come in pairs (--rank R --world W --port P)");
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    const int v = std::stoi(argv[i + 1]);
    if (flag == "--rank") {
      o.rank = v;
    } else if (flag == "--world") {
      o.worldSize = v;
    } else if (flag == "--port") {
      o.storePort = static_cast<uint16_t>(v);
    } else {
      throw tessera::Error("downstream_train: unknown flag " + flag + " (--rank R --world W --port P)");
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  int rank = -1;
  try {
    auto ctx = tessera::init(parseArgs(argc, argv));
    rank = ctx.world->rank();
    const int world = ctx.world->size();
    constexpr int64_t kRows = 64;
    constexpr int kSteps = 40;
    TESSERA_CHECK(kRows % world == 0, "downstream_train: {} rows do not split over {} ranks", kRows, world);

    torch::manual_seed(1);  // the same data on every rank; each trains on its rows
    const auto x = torch::randn({kRows, 8});
    const auto y = torch::sin(x.matmul(torch::randn({8, 1})) / std::sqrt(8.0));  // arguments of unit variance
    const int64_t per = kRows / world;
    const auto xs = x.narrow(0, rank * per, per), ys = y.narrow(0, rank * per, per);

    torch::manual_seed(2);
    Mlp model;
    torch::manual_seed(2);
    Mlp reference;  // the same initial weights, trained on the whole batch in this process
    tessera::DistributedDataParallel::Named named;
    for (const auto& p : model->named_parameters()) named.emplace_back(p.key(), p.value());
    tessera::DistributedDataParallel ddp(named, {}, ctx.world);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.2));
    torch::optim::SGD refOpt(reference->parameters(), torch::optim::SGDOptions(0.2));

    double first = 0, last = 0, refLast = 0;
    for (int s = 0; s < kSteps; ++s) {
      ddp.zeroGrad();
      auto loss = torch::mse_loss(model->forward(xs), ys);
      loss.backward();  // DDP averages the gradients over the ranks: the whole batch's gradient
      opt.step();
      auto global = loss.detach().reshape({1}).clone();
      ctx.world->allReduce(global, tessera::ReduceOp::Avg)->wait();
      (s == 0 ? first : last) = global.item<double>();

      refOpt.zero_grad();
      auto refLoss = torch::mse_loss(reference->forward(x), y);
      refLoss.backward();
      refOpt.step();
      refLast = refLoss.item<double>();
    }
    double maxDiff = 0;
    const auto mine = model->parameters(), ref = reference->parameters();
    for (size_t i = 0; i < mine.size(); ++i) maxDiff = std::max(maxDiff, (mine[i] - ref[i]).abs().max().item<double>());

    const bool matches = maxDiff < 1e-5, learned = last < 0.5 * first;
    if (rank == 0) {
      fmt::print("downstream_train: {} ranks ({}), loss {:.4f} -> {:.4f} (single process: {:.4f}), max |ddp - single| "
                 "= {:.2e}: {}\n",
                 world, ctx.launch.launcher, first, last, refLast, maxDiff, matches && learned ? "OK" : "FAILED");
    }
    TESSERA_CHECK(matches, "rank {}: DDP's parameters differ from the single-process run's by {:.3e}", rank, maxDiff);
    TESSERA_CHECK(learned, "rank {}: the loss fell only from {:.4f} to {:.4f}", rank, first, last);
    ctx.world->barrier()->wait();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "downstream_train: rank %d: error: %s\n", rank, e.what());
    tessera::publishFatal(e);  // the other ranks name this rank and its error as the cause
    return 1;
  }
}
