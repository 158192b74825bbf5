"""tessera.data from Python: files written here by an independent writer (struct, byte by byte
from the layouts in src/data/formats.h) read back exactly through the C++ readers; every rank
builds the same global batches, so dp ranks' rows make up the dp = 1 batch; the sampler's
position resumes exactly and refuses other data."""
import os
import struct

import pytest
import torch

import tessera
from conftest import gather_all

SEQS = [[1, 2, 3], [4], [60000, 0, 9, 8, 7], [11, 12]]


def write_megatron(prefix, seqs, code, doc_ends=None):
    fmt = {8: "H", 4: "i"}[code]
    size = struct.calcsize(fmt)
    with open(prefix + ".bin", "wb") as f:
        for s in seqs:
            f.write(struct.pack(f"<{len(s)}{fmt}", *s))
    doc_ends = doc_ends or list(range(1, len(seqs) + 1))
    pointers, at = [], 0
    for s in seqs:
        pointers.append(at)
        at += len(s) * size
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(seqs), len(doc_ends) + 1))
        f.write(struct.pack(f"<{len(seqs)}i", *[len(s) for s in seqs]))
        f.write(struct.pack(f"<{len(seqs)}q", *pointers))
        f.write(struct.pack(f"<{len(doc_ends) + 1}q", 0, *doc_ends))


def write_llmc(path, tokens, wide):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240801 if wide else 20240520, 7 if wide else 1, len(tokens), *[0] * 253))
        f.write(struct.pack(f"<{len(tokens)}{'I' if wide else 'H'}", *tokens))


@pytest.fixture
def tmp(tmp_path, ctx):
    return str(tmp_path)


@pytest.mark.parametrize("code", [8, 4])
def test_megatron_read_back(tmp, code):
    seqs = [list(s) for s in SEQS]
    if code == 4:
        seqs[2][0] = 2_000_000_000
    write_megatron(os.path.join(tmp, "m"), seqs, code, doc_ends=[1, 4])
    ds = tessera.data.IndexedDataset(os.path.join(tmp, "m"))
    assert len(ds) == 4
    assert ds.dtype == ("uint16" if code == 8 else "int32")
    for i, s in enumerate(seqs):
        assert ds[i].dtype == torch.int64
        assert ds[i].tolist() == s
    assert ds[-1].tolist() == seqs[-1]
    assert ds.document_indices.tolist() == [0, 1, 4]
    assert ds.sequence_lengths == [len(s) for s in seqs]
    assert ds.num_tokens == sum(map(len, seqs))
    with pytest.raises(IndexError):
        ds[4]


@pytest.mark.parametrize("wide", [False, True])
def test_llmc_shards_read_as_one_stream(tmp, wide):
    big = 100_000 if wide else 65535
    write_llmc(os.path.join(tmp, "s_000000.bin"), [5, 0, 6], wide)
    write_llmc(os.path.join(tmp, "s_000001.bin"), [big, 7, 0], wide)
    s = tessera.data.TokenShards(os.path.join(tmp, "s_*.bin"), eod_token=0)
    assert len(s) == 6
    assert s.dtype == ("uint32" if wide else "uint16")
    assert s.tokens(0, 6).tolist() == [5, 0, 6, big, 7, 0]
    assert s.num_documents == 2
    assert s.document(1).tolist() == [6, big, 7, 0]
    assert [os.path.basename(f) for f in s.files] == ["s_000000.bin", "s_000001.bin"]


def test_bad_files_raise_naming_the_file(tmp):
    write_megatron(os.path.join(tmp, "m"), SEQS, 8)
    with open(os.path.join(tmp, "m.idx"), "r+b") as f:
        f.seek(17)
        f.write(bytes([6]))
    with pytest.raises(tessera.Error, match=r"m\.idx'.*unsupported token dtype code 6 \(float64\)"):
        tessera.data.IndexedDataset(os.path.join(tmp, "m"))
    write_llmc(os.path.join(tmp, "s.bin"), [1, 2], False)
    with open(os.path.join(tmp, "s.bin"), "ab") as f:
        f.write(b"\x00")
    with pytest.raises(tessera.Error, match=r"s\.bin'.*trailing bytes"):
        tessera.data.TokenShards(os.path.join(tmp, "s.bin"))


def corpus(tmp, name="c", docs=50):
    """Megatron dataset whose token d*1000 + i + 1 is position i of document d."""
    g = torch.Generator().manual_seed(3)
    seqs = [[d * 1000 + i + 1 for i in range(int(torch.randint(5, 60, (1,), generator=g)))] for d in range(docs)]
    prefix = os.path.join(tmp, name)
    write_megatron(prefix, seqs, 4)
    return prefix


def test_dp_ranks_rows_make_the_global_batch(tmp, world):
    data = tessera.data.GptData(corpus(tmp), seq_len=16, seed=5, split="90,10")
    B = 8
    one = tessera.data.Sampler(data, B, vocab=100_000)
    mine = tessera.data.Sampler(data, B, dp_rank=world.rank, dp_size=world.size, vocab=100_000)
    for step in (0, 1, 9, 30):
        tokens, targets = mine.batch(step)
        assert tokens.shape == (B // world.size, 16)
        assert torch.equal(tokens[:, 1:], targets[:, :-1])
        glob_tokens, _ = one.batch(step)
        rows = gather_all(world, tokens)  # every rank's rows, in rank order
        assert torch.equal(rows.reshape(B, 16), glob_tokens)
    # Validation rows hold only the last 10 % of the documents (45..49) and repeat per index.
    vt, _ = mine.valid_batch(0)
    assert set((vt // 1000).flatten().tolist()) <= {45, 46, 47, 48, 49}
    assert torch.equal(vt, mine.valid_batch(0)[0])


def test_sampler_state_resumes_and_refuses_other_data(tmp, ctx):
    data = tessera.data.GptData(corpus(tmp), seq_len=8, seed=5)
    run = tessera.data.Sampler(data, 4, vocab=100_000)
    it = iter(run)
    straight = [next(it)[0] for _ in range(5)]
    run2 = tessera.data.Sampler(data, 4, vocab=100_000)
    it2 = iter(run2)
    for _ in range(2):
        next(it2)
    state = run2.state_dict()
    assert state["consumed_samples"] == 8
    resumed = tessera.data.Sampler(data, 4, dp_rank=1, dp_size=2, vocab=100_000)
    resumed.load_state_dict(state)
    got = next(iter(resumed))[0]
    assert torch.equal(got, straight[2][2:])
    other = tessera.data.GptData(corpus(tmp, "c2"), seq_len=8, seed=6)
    with pytest.raises(ValueError, match="other data"):
        tessera.data.Sampler(other, 4).load_state_dict(state)
    with pytest.raises(tessera.Error, match=r"outside the model's vocabulary \[0, 1000\).*sequence"):
        tessera.data.Sampler(data, 4, vocab=1000).batch(0)
