// tessera._C.data: the token-dataset readers and the training sample stream (src/data), so a
// Python loop reads the very batches train_gpt reads. Local: no communication.
#include <ATen/ATen.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "tessera/data/batch.h"
#include "tessera/data/dataset.h"
#include "data/megatron.h"
#include "data/token_stream.h"

namespace tessera::py {

namespace {
int64_t wrapIndex(int64_t i, int64_t n, const char* what) {
  if (i < 0) i += n;
  if (i < 0 || i >= n) throw pb::index_error(fmt::format("{} index out of range [0, {})", what, n));
  return i;
}
}  // namespace

void bindData(pb::module_& m) {
  auto d = m.def_submodule("data", "tessera's token datasets (see tessera.data)");
  using data::IndexedDataset;
  using data::TokenStream;
  pb::class_<IndexedDataset, std::shared_ptr<IndexedDataset>>(d, "IndexedDataset")
      .def(pb::init<std::string>(), pb::arg("prefix"))
      .def("__len__", &IndexedDataset::numSequences)
      .def("__getitem__",
           [](const IndexedDataset& ds, int64_t i) { return ds.sequence(wrapIndex(i, ds.numSequences(), "sequence")); })
      .def_property_readonly("document_indices", &IndexedDataset::documentIndices)
      .def_property_readonly("sequence_lengths",
                             [](const IndexedDataset& ds) {
                               std::vector<int64_t> out(ds.numSequences());
                               for (int64_t i = 0; i < ds.numSequences(); ++i) out[i] = ds.sequenceLength(i);
                               return out;
                             })
      .def_property_readonly("dtype", [](const IndexedDataset& ds) { return data::tokenTypeName(ds.tokenType()); })
      .def_property_readonly("num_tokens", &IndexedDataset::numTokens)
      .def_property_readonly("fingerprint", &IndexedDataset::fingerprint)
      .def("__repr__", &IndexedDataset::describe);

  pb::class_<TokenStream, std::shared_ptr<TokenStream>>(d, "TokenStream")
      .def(pb::init([](const std::string& pattern, const std::string& format, int64_t eod) {
             return std::make_shared<TokenStream>(pattern, data::parseFormat(format), eod);
           }),
           pb::arg("pattern"), pb::arg("format") = "llmc", pb::arg("eod_token") = -1)
      .def("__len__", &TokenStream::numTokens)
      .def("tokens", &TokenStream::tokens, pb::arg("start"), pb::arg("count"))
      .def("document",
           [](const TokenStream& s, int64_t i) {
             i = wrapIndex(i, s.numDocuments(), "document");
             const int64_t n = s.documentLength(i);
             auto t = at::empty({n}, at::kLong);
             s.read(i, 0, n, t.data_ptr<int64_t>());
             return t;
           })
      .def_property_readonly("num_documents", &TokenStream::numDocuments)
      .def_property_readonly("files", &TokenStream::files)
      .def_property_readonly("dtype", [](const TokenStream& s) { return data::tokenTypeName(s.tokenType()); })
      .def_property_readonly("fingerprint", &TokenStream::fingerprint)
      .def("__repr__", &TokenStream::describe);

  pb::class_<data::GptData, std::shared_ptr<data::GptData>>(d, "GptData")
      .def(pb::init([](const std::string& train, int64_t seqLen, uint64_t seed, const std::string& split,
                       const std::string& valid, const std::string& format, int64_t eod) {
             data::DataOptions o;
             o.train = train;
             o.valid = valid;
             o.split = split;
             o.format = data::parseFormat(format);
             o.seqLen = seqLen;
             o.seed = seed;
             o.eodToken = eod;
             return std::make_shared<data::GptData>(o);
           }),
           pb::arg("train"), pb::arg("seq_len"), pb::arg("seed") = 1234, pb::arg("split") = "100",
           pb::arg("valid") = "", pb::arg("format") = "auto", pb::arg("eod_token") = -1)
      .def_property_readonly("seq_len", &data::GptData::seqLen)
      .def_property_readonly("fingerprint", &data::GptData::fingerprint)
      .def_property_readonly("has_valid", [](const data::GptData& g) { return g.valid() != nullptr; })
      .def(
          "samples",
          [](const data::GptData& g, int64_t first, int64_t count, int64_t vocab, bool valid) {
            TESSERA_CHECK(!valid || g.valid(), "tessera data: this data has no validation share");
            pb::gil_scoped_release nogil;
            return data::readSamples(valid ? *g.valid() : g.train(), first, count, vocab);
          },
          pb::arg("first"), pb::arg("count"), pb::arg("vocab") = INT64_MAX, pb::arg("valid") = false)
      .def("__repr__", &data::GptData::describe);
}

}  // namespace tessera::py
