"""The dataset stage: execute the plan in each DataLoader worker and turn shards into batches.

``ShardDataset`` (``shard_dataset``; its loader configures it through ``setup``) reads the
shards the plan gives its rank and worker (``readers``: indexed tar and Arrow shards, opened
once), decodes (``decode``), transforms and collates them (``collate``: batches as few large
tensors; ``samples``: the three ways to a batch), reseeding the worker's generators per batch
(``seeding``). ``TokenDataset`` (``tokens``) reads token shards as windows of tokens, and
``LengthBucketing`` (``lengths``) batches variable-length samples within a token budget;
``SequencePacking`` (``packed``) packs them into rows and ``Bucketed`` (``bucketed``) batches
samples of one bucket, both shaping each window of samples (``windowed``); ``Bucketed`` plans
the whole epoch instead where image sizes were recorded at pack time (``bucket_plan``).
``ShardMap`` (``shard_map``; remote samples by ranged reads in ``sparse``) reads any sample by
its index or key, for any ``Sampler``. ``MixedDataset`` (``mixed``; batches put together in ``mix_batches``) reads several datasets as
one by weight, on the order :mod:`shardstream.plan.mix` gives. All of them are
``PlannedDataset`` objects (``base``: planning, resume, the loader's configuration, written once), and
what a loader may ask of any of them is the ``Readable`` protocol (``contract``).
A dataset's position in the epoch and the resume state made from it live in ``state``;
``ranks`` says which rank it is, and ``parallel`` which data-parallel group under model parallelism. Everything here runs where the batches are made: in the
workers, or in the main process without workers.
"""

from .base import PlannedDataset
from .batches.bucketed import Bucketed
from .batches.collate import FieldCollate, MappedBytes, RaggedBytes, pad_sequences
from .batches.lengths import LengthBucketing
from .batches.sequence_packing import SequencePacking
from .contract import PassStart, Readable, WorkerSlot
from .mixed import MixedDataset
from .parallel import Parallel
from .ranks import resolve_rank
from .samples.decode import DecodeError, Decoder
from .setup import LoaderSetup
from .shard_dataset import ShardDataset
from .shard_map import ShardMap
from .tokens import TokenDataset, token_collate

__all__ = [
    "Bucketed",
    "DecodeError",
    "Decoder",
    "FieldCollate",
    "LengthBucketing",
    "LoaderSetup",
    "MappedBytes",
    "MixedDataset",
    "Parallel",
    "PassStart",
    "PlannedDataset",
    "RaggedBytes",
    "Readable",
    "SequencePacking",
    "ShardDataset",
    "ShardMap",
    "TokenDataset",
    "WorkerSlot",
    "pad_sequences",
    "resolve_rank",
    "token_collate",
]
