"""The token batches' one convention: every sequence that ``cu_seqlens`` names starts at position 0.

``position_ids`` are 0 at every row's start and after every document's end, and for every batch
``cu_seqlens[:-1]`` are exactly the flat indices where ``position_ids == 0``: what Hugging Face's
padding-free flash-attention path derives from ``position_ids`` alone (a flattened batch), and what
Megatron's ``reset_position_ids`` makes. Checked over whole epochs, shuffled or not, on 1 and 2 ranks
with 0 and 2 workers, resumed mid-epoch, for mixes of token datasets and for ``LengthBucketing``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shardstream import LengthBucketing, MixedDataset, ShardDataset, TokenDataset
from tests.sample_datasets import write_dataset
from tests.token_corpus import pack_positions

RNG = np.random.default_rng(7)
LENGTHS = RNG.integers(
    1, 40, 120
).tolist()  # 120 documents, as in the report that found the mismatch


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return pack_positions(tmp_path_factory.mktemp("positions"), LENGTHS, shard_size="2KB")


def as_numpy(batch: dict) -> dict:
    return {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


def check(batch: dict, offsets: np.ndarray) -> None:
    """The convention, and that positions count within the later of the row's and the document's start
    (token ids are places in the corpus, so each says where its document starts)."""
    b = as_numpy(batch)
    pos, ids = b["position_ids"], b["input_ids"]
    assert (pos[:, 0] == 0).all(), "a row that starts mid-document must start at position 0"
    zeros = np.flatnonzero(pos.ravel() == 0)
    assert b["cu_seqlens"].tolist() == zeros.tolist() + [ids.size]
    assert b["max_seqlen"] == int(np.diff(b["cu_seqlens"]).max())
    doc_start = offsets[np.searchsorted(offsets, ids, side="right") - 1]
    assert (pos == ids - np.maximum(doc_start, ids[:, :1])).all()


def test_the_reported_case_rows_that_start_mid_document_start_at_zero(corpus):
    url, offsets = corpus
    batch = next(iter(TokenDataset(url, 16, seed=1).loader(4, 0)))
    check(batch, offsets)
    flat = batch["position_ids"].reshape(-1)
    assert batch["cu_seqlens"][:-1].tolist() == torch.nonzero(flat == 0).flatten().tolist()


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("workers", [0, 2])
def test_every_batch_of_an_epoch_follows_the_convention(corpus, shuffle, world, workers):
    url, offsets = corpus
    seen = 0
    for rank in range(world):
        ds = TokenDataset(url, 16, shuffle=shuffle, seed=3, rank=rank, world_size=world)
        for batch in ds.loader(4, workers):
            check(batch, offsets)
            seen += len(batch["input_ids"])
    assert seen == len(TokenDataset(url, 16, rank=0, world_size=1)) // world * world


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_epoch_follows_the_convention(corpus, workers):
    url, offsets = corpus
    loader = TokenDataset(url, 12, seed=5).loader(3, workers)
    it = iter(loader)
    first = [next(it) for _ in range(4)]
    state = loader.state_dict()
    again = TokenDataset(url, 12, seed=5).loader(3, 2 - workers)
    again.load_state_dict(state)
    rest = list(again)
    assert rest, "the resumed epoch has batches left"
    for batch in first + rest:
        check(batch, offsets)
    rows = np.concatenate([b["input_ids"][:, 0].numpy() for b in first + rest])
    assert len(rows) == len(set(rows.tolist())) == len(TokenDataset(url, 12))


def test_single_windows_start_at_zero(corpus):
    url, offsets = corpus
    for n, sample in enumerate(TokenDataset(url, 9, seed=2)):
        batch = {k: v[None] for k, v in sample.items()}
        assert batch["position_ids"][0, 0] == 0
        ids = batch["input_ids"].numpy()
        doc_start = offsets[np.searchsorted(offsets, ids, side="right") - 1]
        assert (batch["position_ids"].numpy() == ids - np.maximum(doc_start, ids[:, :1])).all()
        if n == 30:
            break


def test_mixed_token_batches_follow_the_convention(corpus, tmp_path):
    url, offsets = corpus
    other, other_offsets = pack_positions(
        tmp_path, [7, 30, 2, 19, 11, 5, 40], shard_size="64B", name="other"
    )
    mix = MixedDataset(
        [TokenDataset(url, 8, seed=1), TokenDataset(other, 8, seed=2)],
        [0.6, 0.4],
        samples_per_epoch=90,
    )
    for workers in (0, 2):
        for batch in mix.loader(5, workers):
            pos = batch["position_ids"].numpy()
            assert (pos[:, 0] == 0).all()
            assert batch["cu_seqlens"].tolist() == np.flatnonzero(pos.ravel() == 0).tolist() + [
                pos.size
            ]
            for row, source in enumerate(batch["__source__"].tolist()):
                one = {k: batch[k][row : row + 1] for k in ("input_ids", "position_ids")}
                ids, p = one["input_ids"].numpy(), one["position_ids"].numpy()
                starts = offsets if source == 0 else other_offsets
                doc_start = starts[np.searchsorted(starts, ids, side="right") - 1]
                assert (p == ids - np.maximum(doc_start, ids[:, :1])).all()


def test_length_bucketing_batches_follow_the_convention(tmp_path):
    def sample(i: int) -> dict:
        return {"__key__": f"s{i:04d}", "npy": np.arange(1 + i * 5 % 17), "cls": i}

    url = write_dataset(tmp_path, [9, 8, 12], make=sample)
    buckets = LengthBucketing(
        ShardDataset(url, fields={"input_ids": "npy", "cls": "cls"}, seed=1), 40, window=8
    )
    batches = list(buckets)
    assert sum(len(b["cls"]) for b in batches) == 29
    for b in batches:
        mask = b["attention_mask"].bool()
        pos = b["position_ids"]
        assert (pos[:, 0] == 0).all()
        flat = pos[mask]  # the real tokens flattened, as a padding-free collator lays them out
        assert b["cu_seqlens"].tolist() == torch.nonzero(flat == 0).flatten().tolist() + [
            int(mask.sum())
        ]
        assert b["cu_seqlens"].tolist() == [0] + torch.cumsum(b["lengths"], 0).tolist()
        assert b["max_seqlen"] == int(b["lengths"].max())
        for row, length in enumerate(b["lengths"].tolist()):
            assert pos[row, :length].tolist() == list(range(length))


def test_hugging_face_derives_the_same_sequences_from_position_ids(corpus):
    """transformers' padding-free flash-attention path reads sequence starts off the flattened
    ``position_ids`` (installed without its dependencies beside torch, as ``make test`` does)."""
    fa = pytest.importorskip(
        "transformers.modeling_flash_attention_utils",
        reason="transformers is not installed (make test installs it with --no-deps)",
    )
    url, _ = corpus
    for n, batch in enumerate(TokenDataset(url, 16, seed=4).loader(4, 0)):
        flat = batch["position_ids"].reshape(1, -1)  # DataCollatorWithFlattening's layout: one row
        assert fa._is_packed_sequence(flat, batch_size=1)
        (cu_q, cu_k), (max_q, _) = fa.prepare_fa_kwargs_from_position_ids(flat)
        assert cu_q.tolist() == batch["cu_seqlens"].tolist() == cu_k.tolist()
        assert int(max_q) == batch["max_seqlen"]
        if n == 10:
            break
