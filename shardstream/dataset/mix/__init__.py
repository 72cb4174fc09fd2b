"""A mix's parts: its weights, its remote sources fetched ahead, its batches put back in order."""
