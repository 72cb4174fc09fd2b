"""Text corpora and token files as documents: every kind gives the same texts in order; bad rows and
mismatched Megatron pairs are named."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstream.errors import SourceError
from shardstream.sources.text import open_text_source, read_megatron, write_megatron
from tests.token_corpus import texts, write_jsonl


def all_texts(path, **kw) -> list[str]:
    return [t for batch in open_text_source(str(path), **kw).texts(7) for t in batch]


def test_every_text_kind_gives_the_documents_in_order(tmp_path):
    docs = texts(40)
    write_jsonl(tmp_path / "j" / "b.jsonl", docs[20:])
    write_jsonl(tmp_path / "j" / "a.jsonl", docs[:20])  # files are read sorted by name
    table = pa.table({"id": list(range(40)), "body": docs})
    (tmp_path / "p").mkdir()
    pq.write_table(table, tmp_path / "p" / "x.parquet", row_group_size=9)
    (tmp_path / "r").mkdir()
    with pa.ipc.new_file(str(tmp_path / "r" / "x.arrow"), table.schema) as w:
        w.write_table(table, max_chunksize=11)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "x.txt").write_text("\n".join(docs) + "\n\n")
    assert all_texts(tmp_path / "j") == docs
    assert all_texts(tmp_path / "p", text_field="body") == docs
    assert all_texts(tmp_path / "r" / "x.arrow", text_field="body") == docs
    assert all_texts(tmp_path / "t") == docs
    assert all_texts(tmp_path / "t", per_file=True) == ["\n".join(docs) + "\n\n"]


def test_a_missing_text_field_names_the_file_and_row(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "a"}\n{"txt": "b"}\n')
    with pytest.raises(
        SourceError,
        match=rf"^{path}: line 2 has no 'text' field \(its keys: txt\); pass --text-field",
    ):
        all_texts(path)
    pq.write_table(pa.table({"body": ["a", None]}), tmp_path / "c.parquet")
    with pytest.raises(SourceError, match="c.parquet: no column 'text'"):
        all_texts(tmp_path / "c.parquet")
    with pytest.raises(SourceError, match="c.parquet: row 1 has no text in 'body'"):
        all_texts(tmp_path / "c.parquet", text_field="body")


def test_megatron_pairs_round_trip_and_a_mismatched_idx_is_refused(tmp_path):
    docs = [np.arange(n, dtype=np.uint16) + n for n in (5, 1, 17, 3)]
    write_megatron(str(tmp_path / "m"), docs)
    tokens, offsets = read_megatron(str(tmp_path / "m.bin"))
    assert offsets.tolist() == [0, 5, 6, 23, 26]
    assert tokens.tolist() == np.concatenate(docs).tolist()
    src = open_text_source(str(tmp_path))
    assert src.layout == "megatron" and src.files == [str(tmp_path / "m.bin")]
    with open(tmp_path / "m.bin", "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(
        SourceError,
        match=r"m\.idx does not match .*m\.bin \(54 bytes, the index describes 52 bytes\)",
    ):
        read_megatron(str(tmp_path / "m.bin"))


def test_flat_bin_files_need_a_dtype_and_split_at_eos(tmp_path):
    np.array([5, 6, 0, 7, 0, 8], np.uint16).tofile(tmp_path / "train.bin")
    with pytest.raises(SourceError, match="pass --dtype uint16"):
        open_text_source(str(tmp_path))
    src = open_text_source(str(tmp_path), dtype="uint16", eos_id=0)
    [(tokens, offsets, bound)] = list(src.token_chunks())
    assert offsets.tolist() == [0, 3, 5, 6] and bound == 9
    [(_, whole, _)] = list(open_text_source(str(tmp_path), dtype="uint16").token_chunks())
    assert whole.tolist() == [0, 6]


def test_mixed_or_unknown_files_are_refused(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", ["x"])
    (tmp_path / "b.csv").write_text("x\n")
    with pytest.raises(SourceError, match="files of one kind.*found .csv, .jsonl"):
        open_text_source(str(tmp_path))
