"""Containers: the docker/ files checked offline, and (with an engine) built and run."""
