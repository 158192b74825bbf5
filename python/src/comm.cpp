// tessera._C: Communicator, Work, init()/Context (ProcessMesh: mesh.cpp).
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <optional>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "bindings.h"
#include "tessera/comm/bootstrap/init.h"
#include "comm/watchdog/board.h"

namespace tessera::py {

ReduceOp toReduceOp(const pb::handle& op) {
  if (pb::isinstance<ReduceOp>(op)) return op.cast<ReduceOp>();
  if (pb::isinstance<pb::str>(op)) {
    auto s = op.cast<std::string>();
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    if (s == "sum") return ReduceOp::Sum;
    if (s == "avg" || s == "mean") return ReduceOp::Avg;
    if (s == "max") return ReduceOp::Max;
    if (s == "min") return ReduceOp::Min;
    throw Error("tessera: reduce op '" + op.cast<std::string>() + "' is not one of sum, avg, max, min");
  }
  throw Error("tessera: reduce op must be a string (sum, avg, max, min) or a tessera.ReduceOp, got " +
              pb::str(pb::type::handle_of(op)).cast<std::string>());
}

namespace {

// async_op=False: wait (GIL released) and return None, as torch.distributed does; else the Work.
pb::object finish(WorkPtr w, bool async) {
  if (async) return pb::cast(std::move(w));
  {
    pb::gil_scoped_release nogil;
    w->wait();
  }
  return pb::none();
}

// Issues `op` with the GIL released (a backend may block while enqueueing).
template <class F>
pb::object issue(bool async, F&& op) {
  WorkPtr w;
  {
    pb::gil_scoped_release nogil;
    w = op();
  }
  return finish(std::move(w), async);
}

std::optional<Backend> toBackend(const std::optional<std::string>& b) {
  if (!b) return std::nullopt;
  if (*b == "gloo") return Backend::Gloo;
  if (*b == "nccl") return Backend::Nccl;
  throw Error("tessera.init: backend '" + *b + "' is not one of gloo, nccl");
}

// A torch.distributed Store object as the C++ c10d::Store it wraps: possible when torch's
// bindings and ours share pybind11's type registry (same pybind11 internals version and C++ ABI;
// verified with Debian's torch 1.13 and its pybind11-dev). None when they do not.
StorePtr torchStore(const pb::object& o) {
  try {
    return o.cast<c10::intrusive_ptr<c10d::Store>>();
  } catch (const pb::cast_error&) {
    return {};
  }
}

}  // namespace

namespace {

// ReduceOp, Work.
void bindWork(pb::module_& m) {
  pb::enum_<ReduceOp>(m, "ReduceOp")
      .value("SUM", ReduceOp::Sum)
      .value("AVG", ReduceOp::Avg)
      .value("MAX", ReduceOp::Max)
      .value("MIN", ReduceOp::Min);

  pb::class_<Work, WorkPtr>(m, "Work", "Handle of one asynchronous op (see src/comm/work.h)")
      .def("wait", &Work::wait, pb::call_guard<pb::gil_scoped_release>(),
           "CPU: block until done (raises tessera.CommError on failure/timeout). CUDA: the current "
           "stream waits on the op; returns at once.")
      .def("synchronize", &Work::synchronize, pb::call_guard<pb::gil_scoped_release>(),
           "Block the host until the op has finished (both backends).")
      .def("is_completed", &Work::completed, "Non-blocking poll.")
      .def_property_readonly("op", [](const Work& w) { return w.info().op; })
      .def("__repr__", [](const Work& w) { return "<tessera.Work " + w.info().describe() + ">"; });
}

void bindCommunicator(pb::module_& m) {
  const char* asyncDoc = "async_op=False waits and returns None; True returns a Work.";
  pb::class_<Communicator, CommPtr>(m, "Communicator",
                                    "A group of ranks; every op is collective over it except send/recv "
                                    "(see src/comm/communicator.h)")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("name", &Communicator::name)
      .def_property_readonly("backend", [](const Communicator& c) { return std::string(toString(c.backend())); })
      .def_property(
          "timeout", [](const Communicator& c) { return c.timeout().count() / 1000.0; },
          [](Communicator& c, double s) { c.setTimeout(std::chrono::milliseconds(static_cast<int64_t>(s * 1000))); },
          "Per-op timeout in seconds.")
      .def(
          "all_reduce",
          [](Communicator& c, const at::Tensor& t, const pb::object& op, bool async) {
            ReduceOp r = toReduceOp(op);
            return issue(async, [&] { return c.allReduce(t, r); });
          },
          pb::arg("tensor"), pb::arg("op") = "sum", pb::arg("async_op") = false, asyncDoc)
      .def(
          "broadcast",
          [](Communicator& c, const at::Tensor& t, int root, bool async) {
            return issue(async, [&] { return c.broadcast(t, root); });
          },
          pb::arg("tensor"), pb::arg("root") = 0, pb::arg("async_op") = false)
      .def(
          "reduce",
          [](Communicator& c, const at::Tensor& t, int root, const pb::object& op, bool async) {
            ReduceOp r = toReduceOp(op);
            return issue(async, [&] { return c.reduce(t, root, r); });
          },
          pb::arg("tensor"), pb::arg("root") = 0, pb::arg("op") = "sum", pb::arg("async_op") = false)
      .def(
          "all_gather",
          [](Communicator& c, const at::Tensor& out, const at::Tensor& in, bool async) {
            return issue(async, [&] { return c.allGather(out, in); });
          },
          pb::arg("output"), pb::arg("input"), pb::arg("async_op") = false,
          "output.numel() == size * input.numel(): rank 0's input, then rank 1's, ...")
      .def(
          "reduce_scatter",
          [](Communicator& c, const at::Tensor& out, const at::Tensor& in, const pb::object& op, bool async) {
            ReduceOp r = toReduceOp(op);
            return issue(async, [&] { return c.reduceScatter(out, in, r); });
          },
          pb::arg("output"), pb::arg("input"), pb::arg("op") = "sum", pb::arg("async_op") = false,
          "input.numel() == size * output.numel(): rank r gets the reduction of chunk r")
      .def(
          "all_to_all",
          [](Communicator& c, const at::Tensor& out, const at::Tensor& in, bool async) {
            return issue(async, [&] { return c.allToAll(out, in); });
          },
          pb::arg("output"), pb::arg("input"), pb::arg("async_op") = false)
      .def(
          "send",
          [](Communicator& c, const at::Tensor& t, int peer, bool async) {
            return issue(async, [&] { return c.send(t, peer); });
          },
          pb::arg("tensor"), pb::arg("peer"), pb::arg("async_op") = false)
      .def(
          "recv",
          [](Communicator& c, const at::Tensor& t, int peer, bool async) {
            return issue(async, [&] { return c.recv(t, peer); });
          },
          pb::arg("tensor"), pb::arg("peer"), pb::arg("async_op") = false)
      .def(
          "barrier", [](Communicator& c, bool async) { return issue(async, [&] { return c.barrier(); }); },
          pb::arg("async_op") = false)
      .def("split", &Communicator::split, pb::arg("color"), pb::arg("key"), pb::arg("name"),
           pb::call_guard<pb::gil_scoped_release>(),
           "Collective: ranks with the same color >= 0 form a new communicator ordered by (key, rank); "
           "color < 0 gives None.")
      .def("abort", &Communicator::abort, pb::arg("reason"), "Local: fail all pending and future ops.")
      .def("__repr__", [](const Communicator& c) {
        return "<tessera.Communicator '" + c.name() + "' rank " + std::to_string(c.rank()) + " of " +
               std::to_string(c.size()) + " (" + toString(c.backend()) + ")>";
      });
}

// init(), Context, the error board's publisher.
void bindInit(pb::module_& m) {
  pb::class_<Context, std::shared_ptr<Context>>(m, "Context", "What tessera.init() found (see init.h)")
      .def_readonly("world", &Context::world)
      .def_property_readonly("rank", [](const Context& c) { return c.launch.rank; })
      .def_property_readonly("world_size", [](const Context& c) { return c.launch.worldSize; })
      .def_property_readonly("local_rank", [](const Context& c) { return c.launch.localRank; })
      .def_property_readonly("local_world_size", [](const Context& c) { return c.launch.localWorldSize; })
      .def_property_readonly("launcher", [](const Context& c) { return c.launch.launcher; })
      .def_property_readonly("store_prefix", [](const Context& c) { return c.launch.storePrefix; })
      .def_property_readonly("store_host", [](const Context& c) { return c.launch.storeHost; })
      .def_property_readonly("store_port", [](const Context& c) { return c.launch.storePort; })
      .def_property_readonly("hosts_store", [](const Context& c) { return c.launch.hostsStore; },
                             "This process runs the TCPStore server (multi-tenant: shared in-process)")
      .def_property_readonly("given_store", [](const Context& c) { return bool(c.launch.store) && !c.launch.storeName.empty(); },
                             "The store was given (tessera.init(store=...) or torch.distributed's)")
      .def_property_readonly("store_description", [](const Context& c) { return describeStore(c.launch); })
      .def_readonly("hostname", &Context::hostname)
      .def_readonly("device", &Context::device)
      .def_readonly("device_description", &Context::deviceDescription)
      .def("__repr__", [](const Context& c) {
        return "<tessera.Context launcher=" + c.launch.launcher + " rank " + std::to_string(c.launch.rank) + " of " +
               std::to_string(c.launch.worldSize) + " on " + c.deviceDescription + ">";
      });

  m.def(
      "init",
      [](std::optional<int> rank, std::optional<int> worldSize, std::optional<int> localRank,
         std::optional<int> localWorldSize, const std::string& storeHost, std::optional<int> storePort,
         bool rank0HostsStore, std::optional<std::string> backend, std::optional<double> timeoutS,
         const pb::object& store, const std::string& storePrefix, const std::string& launcher,
         const std::string& storeName) {
        InitOptions o;
        if (!store.is_none()) {
          o.store = torchStore(store);
          TESSERA_CHECK(o.store, "tessera.init: the store given ({}) is not a torch.distributed Store this build can "
                                 "use (tessera._C and torch must share pybind11's type registry)",
                        std::string(pb::str(store.get_type())));
          o.storeName = storeName;
        }
        o.storePrefix = storePrefix;
        o.launcher = launcher;
        o.rank = rank;
        o.worldSize = worldSize;
        o.localRank = localRank;
        o.localWorldSize = localWorldSize;
        o.storeHost = storeHost;
        if (storePort) o.storePort = static_cast<uint16_t>(*storePort);
        o.rank0HostsStore = rank0HostsStore;
        o.backend = toBackend(backend);
        if (timeoutS) o.timeout = std::chrono::milliseconds(static_cast<int64_t>(*timeoutS * 1000));
        pb::gil_scoped_release nogil;
        return std::make_shared<Context>(init(o));
      },
      pb::arg("rank") = pb::none(), pb::arg("world_size") = pb::none(), pb::arg("local_rank") = pb::none(),
      pb::arg("local_world_size") = pb::none(), pb::arg("store_host") = "127.0.0.1",
      pb::arg("store_port") = pb::none(), pb::arg("rank0_hosts_store") = true, pb::arg("backend") = pb::none(),
      pb::arg("timeout") = pb::none(), pb::arg("store") = pb::none(), pb::arg("store_prefix") = "tessera",
      pb::arg("launcher") = "explicit", pb::arg("store_name") = "");
  m.def(
      "_publish_fatal",
      [](const std::string& message, bool commFailure) {
        pb::gil_scoped_release nogil;
        board::publishError(message, commFailure);
      },
      pb::arg("message"), pb::arg("comm_failure"),
      "The job's error board (comm/watchdog/board.h): this process dies of `message`; the other ranks name it as "
      "the cause. tessera.init()'s excepthook calls it. Bounded; never raises.");
  m.def(
      "can_use_torch_store", [](const pb::object& s) { return bool(torchStore(s)); }, pb::arg("store"),
      "Whether a torch.distributed Store object can be handed to tessera.init(store=...) by this build");
}

}  // namespace

void bindComm(pb::module_& m) {
  bindWork(m);
  bindCommunicator(m);
  bindInit(m);
}

}  // namespace tessera::py
