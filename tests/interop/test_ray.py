"""Ray Data reads exactly the samples of tar packs (``read_webdataset`` of the shard list and of the
folder) and the rows of a Hub-like Parquet folder indexed in place (``read_parquet``); shardstream still
reads each after. One local Ray (1 CPU) for the module."""

from __future__ import annotations

import pytest

from tests.interop.clients import check_ours, check_samples, shards_of
from tests.interop.conftest import PARQUET_FIELDS

ray = pytest.importorskip("ray", reason="ray is not installed (the test extras)")
pytest.importorskip("ray.data", reason="ray[data] is not installed (the test extras)")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
        ignore_reinit_error=True,
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


@pytest.mark.parametrize("pack", ["tar_pack", "tar_shards"])
def test_read_webdataset_of_the_shards_and_of_the_folder(pack, images, request, local_ray):
    folder = request.getfixturevalue(pack)
    check_samples(ray.data.read_webdataset(shards_of(folder), decoder=None).take_all(), images[1])
    check_samples(ray.data.read_webdataset(str(folder), decoder=None).take_all(), images[1])
    check_ours(folder, images[1])


def test_read_parquet_of_the_folder_after_index(parquet_hub, images, local_ray):
    for folder in (parquet_hub / "data", parquet_hub):
        check_samples(ray.data.read_parquet(str(folder)).take_all(), images[1], **PARQUET_FIELDS)
    check_ours(parquet_hub / "data", images[1], **PARQUET_FIELDS)
