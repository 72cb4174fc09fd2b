"""The loader stage: the DataLoader that moves the dataset's batches to the training loop.

``ShardLoader`` (``shard_loader``: defaults, resumable ``state_dict``), the transport that
hands batches from workers to the main process through reused shared memory (``transport``),
and the checks that turn the classic DataLoader traps into one clear error before the workers
start (``guards``: ``/dev/shm``, pickling for spawn workers, tensors on the wrong device), and
errors of shardstream's own from workers raised again as their one line (``worker_errors``).
"""

from .guards import SharedMemoryError, WorkerDeviceError, WorkerPickleError
from .shard_loader import ShardLoader, default_num_workers

__all__ = [
    "SharedMemoryError",
    "ShardLoader",
    "WorkerDeviceError",
    "WorkerPickleError",
    "default_num_workers",
]
