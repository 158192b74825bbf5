"""Token datasets and the training sample stream, as the C++ trainer reads them.

Readers (memory-mapped; nothing is read into memory until asked for)::

    ds = tessera.data.IndexedDataset("data/brown/brown_sp4096_text_document")  # Megatron .bin/.idx
    len(ds), ds[0], ds.document_indices        # sequences, sequence 0 (int64 tensor), doc index
    shards = tessera.data.TokenShards("fineweb_train_*.bin")   # llm.c shards as one stream
    raw = tessera.data.TokenShards("train.bin", format="raw-uint16")  # nanoGPT's files

The samples and batches (:class:`Sampler`) are ``train_gpt``'s: step ``s``'s global batch is
samples ``[s*B, (s+1)*B)`` of the training blend (Megatron's GPTDataset packing, an epoch-wise
shuffle from the seed), data-parallel rank ``r`` of ``dp`` reads rows ``[r*B/dp, (r+1)*B/dp)``.
So a Python loop under torchrun trains on exactly the tokens the C++ trainer would, and its
position (``state_dict``) resumes exactly, under any dp.
"""

from ._C import data as _data

IndexedDataset = _data.IndexedDataset
GptData = _data.GptData


def TokenShards(pattern, format="llmc", eod_token=-1):  # noqa: N802 (a class to its users)
    """llm.c shards (a glob, read in sorted order as one stream) or raw token files
    (``format="raw-uint16"`` / ``"raw-uint32"``). ``len()`` is the token count; ``tokens(start,
    count)`` a slice; with ``eod_token`` the stream is cut into documents after each such token
    (``num_documents``, ``document(i)``)."""
    return _data.TokenStream(pattern, format, eod_token)


class Sampler:
    """This data-parallel rank's batches of a :class:`GptData`, step by step.

    ``batch(step)`` returns ``(tokens, targets)``: int64 ``[B/dp, seq_len]`` tensors, targets the
    next tokens. Token ids must be below ``vocab`` (an error names the file, document and
    position otherwise). ``state_dict()`` / ``load_state_dict()`` carry the position (samples
    consumed) and the data's fingerprint; loading the state of other data raises.
    """

    def __init__(self, data, global_batch, dp_rank=0, dp_size=1, vocab=2**62):
        if global_batch % dp_size:
            raise ValueError(f"global batch {global_batch} is not divisible by dp {dp_size}")
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp rank {dp_rank} is not in [0, {dp_size})")
        self.data, self.global_batch, self.vocab = data, global_batch, vocab
        self.rows = global_batch // dp_size
        self.row_begin = dp_rank * self.rows
        self.consumed = 0  # samples of the global batches taken so far

    def batch(self, step):
        """Step ``step``'s rows for this rank (a pure function of the data options and step)."""
        first = step * self.global_batch + self.row_begin
        s = self.data.samples(first, self.rows, self.vocab)
        return s[:, :-1].contiguous(), s[:, 1:].contiguous()

    def valid_batch(self, index):
        """Validation batch ``index`` (the same for every call), this rank's rows."""
        s = self.data.samples(index * self.global_batch + self.row_begin, self.rows, self.vocab, valid=True)
        return s[:, :-1].contiguous(), s[:, 1:].contiguous()

    def __iter__(self):
        """Batches from the current position on; each one taken counts as consumed."""
        while True:
            step = self.consumed // self.global_batch
            b = self.batch(step)
            self.consumed = (step + 1) * self.global_batch
            yield b

    def state_dict(self):
        return {"consumed_samples": self.consumed, "fingerprint": self.data.fingerprint}

    def load_state_dict(self, state):
        if state["fingerprint"] != self.data.fingerprint:
            raise ValueError("the saved data position is of other data (datasets, blend, split, seed or "
                             f"sequence length differ): {self.data!r}")
        if state["consumed_samples"] % self.global_batch:
            raise ValueError(f"{state['consumed_samples']} samples consumed is not a whole number of global "
                             f"batches of {self.global_batch}")
        self.consumed = state["consumed_samples"]
