"""The checksums of Arrow values are the same whichever thread computes them first, and whatever a null's
slot holds: packs are byte-identical and reads never see a value differ that did not change."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa

from shardstream.formats import arrow_checksums


def test_the_first_checksums_of_a_process_computed_in_several_threads_at_once_agree(monkeypatch):
    values = pa.array([f"value {i}" for i in range(500)])  # short strings: the polynomial path
    expected = arrow_checksums.cell_checksums(values)
    for _ in range(
        5
    ):  # each round as the first use in a process: the tables made while threads race
        monkeypatch.setattr(arrow_checksums, "_POWERS", None)
        start = threading.Barrier(8)
        got: list[np.ndarray] = []

        def one(start: threading.Barrier = start, got: list[np.ndarray] = got) -> None:
            start.wait()
            got.append(arrow_checksums.cell_checksums(values))

        threads = [threading.Thread(target=one) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 8 and all(np.array_equal(g, expected) for g in got)


def test_what_a_null_slot_holds_does_not_change_the_column_checksum():
    valid = np.array([1, 0, 1, 1], dtype=np.uint8)
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
    one, other = (
        pa.Array.from_buffers(pa.int64(), 4, [bitmap, pa.py_buffer(np.array(v, "<i8").tobytes())])
        for v in ([7, 123, 9, 10], [7, -5, 9, 10])  # the same values; slot 1 (null) differs
    )
    assert one.to_pylist() == other.to_pylist() == [7, None, 9, 10]
    assert arrow_checksums.column_checksum(one) == arrow_checksums.column_checksum(other)
    assert list(arrow_checksums.cell_checksums(one)) == list(arrow_checksums.cell_checksums(other))
    changed = pa.array([7, None, 8, 10], pa.int64())
    assert arrow_checksums.column_checksum(changed) != arrow_checksums.column_checksum(one)
