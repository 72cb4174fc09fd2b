"""Read a prepared dataset with Megatron-Energon's loader and print each sample as a JSON line:
``{"__key__", "jpg", "cls"}`` (the raw bytes in base64). Run in a process of its own (Energon registers
fork hooks at import)::

    python tests/interop/energon_read.py DATASET
"""

from __future__ import annotations

import base64
import json
import sys


def main(path: str) -> None:
    from megatron.energon import (
        Cooker,
        DefaultTaskEncoder,
        ImageClassificationSample,
        WorkerConfig,
        basic_sample_keys,
        get_loader,
        get_val_dataset,
        stateless,
    )

    @stateless
    def cook(sample):  # the crude sample's bytes as they are, not decoded
        return ImageClassificationSample(
            **basic_sample_keys(sample), image=sample["jpg"], label=sample["cls"]
        )

    class Raw(DefaultTaskEncoder):
        cookers = [Cooker(cook)]

    encoder = Raw()
    encoder.decoder = None
    config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    dataset = get_val_dataset(
        path, split_part="train", worker_config=config, batch_size=1, task_encoder=encoder
    )
    for batch in get_loader(dataset):
        (key,), (image,), (label,) = batch.__key__, batch.image, batch.label
        line = {
            "__key__": key,
            "jpg": base64.b64encode(bytes(image)).decode(),
            "cls": base64.b64encode(bytes(label)).decode(),
        }
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
