"""TokenDataset: every token is a label exactly once per epoch (minus the stated tails), position ids
and cu_seqlens follow the documents, and the plan's guarantees hold for windows (workers, resume on
another world size)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream import TokenDataset
from shardstream.dataset.tokens import IGNORE_INDEX, token_window_positions
from shardstream.errors import UsageError
from tests.token_corpus import pack_positions

LENGTHS = [5, 1, 30, 12, 7, 3, 44, 9, 2, 18, 25, 6, 11, 4, 20]  # 197 tokens in 15 documents


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    # several shards
    return pack_positions(tmp_path_factory.mktemp("tok"), LENGTHS, shard_size="160B")


def shard_streams(url: str) -> list[np.ndarray]:
    from shardstream.manifest.token_stats import shard_tokens

    ds = TokenDataset(url, 1)
    ends = np.cumsum(shard_tokens(ds.manifest))
    return [np.arange(a, b) for a, b in zip(np.concatenate([[0], ends[:-1]]), ends)]


def batches(loader) -> list[dict]:
    return [{k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in b.items()} for b in loader]


def doc_position(offsets: np.ndarray, token: np.ndarray) -> np.ndarray:
    """Each token's position as rows of ``token`` (ids = places in the corpus) say it: counted from the
    later of its document's start and its row's start."""
    token = np.atleast_2d(token)
    doc_start = offsets[np.searchsorted(offsets, token, side="right") - 1]
    return token - np.maximum(doc_start, token[:, :1])


@settings(max_examples=8, deadline=None, derandomize=True)
@given(
    seq_len=st.integers(1, 9),
    batch=st.integers(1, 5),
    seed=st.integers(0, 3),
    workers=st.sampled_from([0, 2]),
)
def test_every_token_is_a_label_once_per_epoch_minus_the_stated_tails(
    dataset, seq_len, batch, seed, workers
):
    url, offsets = dataset
    ds = TokenDataset(url, seq_len, seed=seed)
    got = batches(ds.loader(batch, workers))
    labels = np.concatenate([b["labels"].ravel() for b in got])
    expected = np.concatenate(
        [s[1 : 1 + (len(s) - 1) // seq_len * seq_len] for s in shard_streams(url)]
    )
    assert sorted(labels.tolist()) == expected.tolist()  # each once; no other token
    assert len(labels) == len(ds) * seq_len and ds.tail_tokens == offsets[-1] - len(labels)
    for b in got:  # ids are positions in the corpus: inputs precede labels by one; positions follow the documents
        assert (b["labels"] == b["input_ids"] + 1).all()
        assert (b["position_ids"] == doc_position(offsets, b["input_ids"])).all()
        assert (b["position_ids"][:, 0] == 0).all()  # every row is a sequence of its own
        zeros = np.flatnonzero(b["position_ids"].ravel() == 0)
        assert b["cu_seqlens"].tolist() == np.append(zeros, b["input_ids"].size).tolist()
        assert (
            b["cu_seqlens"].dtype == np.int32 and b["max_seqlen"] == np.diff(b["cu_seqlens"]).max()
        )


def test_the_order_is_the_same_for_any_number_of_workers(dataset):
    url, _ = dataset
    orders = [
        np.concatenate([b["input_ids"] for b in batches(TokenDataset(url, 4, seed=5).loader(3, w))])
        for w in (0, 1, 2)
    ]
    assert (orders[0] == orders[1]).all() and (orders[0] == orders[2]).all()
    assert not (
        orders[0]
        == np.concatenate(
            [b["input_ids"] for b in batches(TokenDataset(url, 4, seed=6).loader(3, 0))]
        )
    ).all()


def test_mask_across_documents_hides_the_targets_that_start_a_document(dataset):
    url, offsets = dataset
    b = next(iter(TokenDataset(url, 8, mask_across_documents=True, shuffle=False).loader(20, 0)))
    labels, inputs = b["labels"].numpy(), b["input_ids"].numpy()
    starts = np.isin(inputs + 1, offsets)
    assert (labels[starts] == IGNORE_INDEX).all() and (labels[~starts] == inputs[~starts] + 1).all()
    assert starts.any()


def test_samples_without_a_loader_are_single_windows(dataset):
    url, offsets = dataset
    sample = next(iter(TokenDataset(url, 6, shuffle=False)))
    assert sample["input_ids"].tolist() == list(range(6)) and sample["labels"].tolist() == list(
        range(1, 7)
    )
    assert sample["position_ids"].tolist() == doc_position(offsets, np.arange(6))[0].tolist()


def test_window_positions_restart_at_the_row_and_at_each_document():
    offsets = np.array([0, 3, 3, 4, 10])
    assert token_window_positions(offsets, 2, 6).tolist() == [
        0,
        0,
        0,
        1,
        2,
        3,
    ]  # the row starts mid-document
    assert token_window_positions(offsets, 0, 3).tolist() == [0, 1, 2]
    assert token_window_positions(offsets, 5, 4).tolist() == [0, 1, 2, 3]
    assert token_window_positions(offsets, 3, 3).tolist() == [0, 0, 1]


def run_ranks(url, world, k, state=None, workers=0):
    got, states = [], []
    for rank in range(world):
        loader = TokenDataset(url, 3, seed=2, rank=rank, world_size=world).loader(2, workers)
        if state is not None:
            loader.load_state_dict(state)
        read = []
        for b in loader:
            read.append(b["input_ids"][:, 0].numpy())
            if len(read) == k:
                break
        got.append(np.concatenate(read) if read else np.zeros(0, np.int64))
        states.append(loader.state_dict())
    return got, states


def test_resume_on_another_world_size_reads_each_window_once(dataset):
    url, _ = dataset
    whole = TokenDataset(url, 3, seed=2, drop_last=False)
    first, states = run_ranks(url, 2, k=3)
    assert all(s == states[0] for s in states)
    second, _ = run_ranks(url, 3, k=None, state=json.loads(json.dumps(states[0])), workers=1)
    read = Counter(np.concatenate(first + second).tolist())
    windows = len(whole)  # on one rank: every window
    # drop_last leaves out fewer than 3 (world size)
    assert max(read.values()) == 1 and windows - len(read) < 3
    with pytest.raises(Exception, match="num_samples|fingerprint"):
        # windows of another length
        TokenDataset(url, 4, seed=2).loader(2, 0).load_state_dict(states[0])


def test_errors_name_the_dataset_and_the_fix(dataset, tmp_path):
    url, _ = dataset
    with pytest.raises(
        UsageError, match=r"seq_len 500 is larger than every shard \(the largest holds \d+ tokens\)"
    ):
        TokenDataset(url, 500)
    with pytest.raises(ValueError, match="seq_len must be"):
        TokenDataset(url, 0)


def test_shards_too_short_for_a_window_give_none(tmp_path):
    url, _ = pack_positions(tmp_path, [2, 40, 1, 40, 2], shard_size="1B")  # a shard per document
    ds = TokenDataset(url, 10, seed=3)
    assert ds.sample_set.per_shard.tolist() == [0, 3, 0, 3, 0] and len(ds) == 6
    labels = np.concatenate([b["labels"].ravel() for b in batches(ds.loader(2, 2))])
    assert sorted(labels.tolist()) == list(range(3, 33)) + list(range(44, 74))


def test_samples_at_reads_plan_samples_for_a_mix(dataset):
    url, _ = dataset
    ds = TokenDataset(url, 5)
    b = ds.samples_at(np.array([1, 0]), np.array([0, 2]))
    assert b["input_ids"][1].tolist() == list(range(10, 15)) and ds.tokens_per_sample == 5
    assert b["cu_seqlens"][-1] == 10
