"""Errors of shardstream's own that a loader's workers raise reach the user as their one line.

torch sends an exception raised in a DataLoader worker to the main process as the text of its
traceback, and raises it again there as ``Caught X in DataLoader worker process N. Original
Traceback ...`` followed by the worker's whole traceback (and, with chained errors, each cause's),
under the main process's own: forty lines or more, with the message buried in the middle.

For a :class:`~shardstream.errors.ShardstreamError` (a corrupt shard, a sample that does not
decode, a setting that cannot work, a ``/dev/shm`` too small) that message is all the user needs,
so a :class:`~shardstream.loader.ShardLoader`'s workers send the exception itself and the loader
raises it again as the same type with the same message, its traceback cut at the loader: the
terminal shows a few lines ending with the message. The worker's traceback stays on the exception
as ``exc.worker_traceback`` (text), and ``ShardLoader(..., worker_tracebacks=True)`` prints it too,
above the message, for bug reports.

Errors from the user's own code keep torch's whole traceback, which is what it takes to fix them:
any exception that is not a ``ShardstreamError``, a
:class:`~shardstream.errors.TransformError`, and a ``ShardstreamError`` that passed through code
outside shardstream, the standard library and the installed packages (a decode function or a
dataset subclass of the user's, say).

How: the loader's ``worker_init_fn`` makes torch's worker loop wrap its exceptions with
:class:`WorkerError` (a subclass of torch's ``ExceptionWrapper``, whose ``reraise`` the main process
calls), in the worker processes only; where torch lacks the name, its own wrapper stays.
"""

from __future__ import annotations

import os
import pickle
import site
import sys
import sysconfig
import traceback
import types
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from ..errors import ShardstreamError, TransformError
from .torch_adapter import ExceptionWrapper, wrap_worker_errors

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class WorkerError(ExceptionWrapper):
    """torch's wrapper of an exception raised in a worker, which also carries a ``ShardstreamError``
    of shardstream's own (pickled: type, arguments, attributes; not its traceback or causes)."""

    def __init__(self, exc_info: Any = None, where: str = "in background"):
        if exc_info is None:
            exc_info = sys.exc_info()
        super().__init__(exc_info, where)
        self.pickled = _portable(exc_info[1]) if is_ours(exc_info[1]) else None

    def reraise(self) -> None:
        exc = None
        if self.pickled is not None:
            try:
                exc = pickle.loads(self.pickled)
            except Exception:  # a class the main process cannot import: torch's way
                exc = None
        # a user's error (or one that cannot travel): torch's, in full
        if not isinstance(exc, ShardstreamError):
            try:
                super().reraise()
            except BaseException as full:
                exc = full
            if isinstance(exc, ShardstreamError):
                exc.shown_in_full = True
        else:
            exc.worker_traceback = self.text()
        # raised from here, without torch's frame that holds it (exception -> traceback -> frame -> exception:
        # a cycle that leaves the loader to the garbage collector, whose order of finalizers makes each worker
        # wait for torch's 5 s join timeout), and not kept in this frame either
        try:
            raise exc.with_traceback(None)
        finally:
            exc = None

    def text(self) -> str:
        """Where the error was raised and its traceback there, as torch formats it."""
        return f"{self.where[:1].upper()}{self.where[1:]}:\n{self.exc_msg}"


def install() -> None:
    """In a worker process: torch's worker loop wraps the exceptions it sends with :class:`WorkerError`."""
    wrap_worker_errors(WorkerError)


def worker_init(token_init: Any, worker_id: int) -> None:
    """A ShardLoader's ``worker_init_fn``: :func:`install`, then the loader's own (which runs the user's)."""
    install()
    token_init(worker_id)


def cut(exc: ShardstreamError, full: bool) -> bool:
    """For ``exc``, which reached the loader in the main process: whether to raise it anew (``raise exc``),
    its traceback cut so that the loader's frame and its callers' are all that is printed above the message,
    and no causes (the whole traceback stays as text in ``exc.worker_traceback``), or as it is (``raise``):
    a user's error, one torch has shown in full already, or any with ``full``, where a worker's traceback
    is printed as the cause."""
    if getattr(exc, "shown_in_full", False):
        return False
    from_worker = getattr(exc, "worker_traceback", None) is not None
    if not from_worker and not is_ours(exc):
        return False
    if full:
        if from_worker:  # the worker's traceback printed above the message
            exc.__cause__ = WorkerTraceback(exc.worker_traceback)
        return False
    if not from_worker:  # raised in the main process (num_workers=0, the first batch's checks)
        exc.worker_traceback = "".join(traceback.format_exception(exc))
    exc.__cause__ = None
    exc.__suppress_context__ = True
    exc.with_traceback(None)
    return True


class WorkerTraceback(Exception):
    """The traceback of an error in a loader's worker, as text (``worker_tracebacks=True`` shows it as
    the error's cause)."""

    def __str__(self) -> str:
        return str(self.args[0]).rstrip("\n") if self.args else ""


def is_ours(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a ShardstreamError of shardstream's own: not a TransformError, and neither it
    nor what it was raised from or while handling went through code of the user's."""
    if not isinstance(exc, ShardstreamError):
        return False
    for e in _chain(exc):
        if isinstance(e, TransformError):
            return False
        if any(_users(frame.f_code.co_filename) for frame, _ in traceback.walk_tb(e.__traceback__)):
            return False
    return True


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]


@lru_cache(maxsize=4096)
def _users(filename: str) -> bool:
    """Whether code from ``filename`` is the user's: not shardstream's, the standard library's or an
    installed package's."""
    if filename.startswith("<frozen"):
        return False
    path = os.path.abspath(filename)
    return not any(path == root or path.startswith(root + os.sep) for root in _library_roots())


@lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    roots = {_PACKAGE}
    for scheme_vars in ({}, {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}):
        paths = sysconfig.get_paths(vars=scheme_vars) if scheme_vars else sysconfig.get_paths()
        roots.update(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths)
    try:
        roots.update(site.getsitepackages())
        roots.add(site.getusersitepackages())
    except AttributeError:  # pragma: no cover - a virtualenv's old site module
        pass
    # where they are installed by other means (PYTHONPATH, a build tree)
    for name in (
        "torch",
        "numpy",
    ):
        module = sys.modules.get(name)
        if isinstance(module, types.ModuleType) and getattr(module, "__file__", None):
            roots.add(os.path.dirname(os.path.abspath(module.__file__)))
    return tuple(os.path.abspath(r) for r in roots if r)


def _portable(exc: BaseException | None) -> bytes | None:
    """``exc`` pickled so that the main process gets the same type, message and attributes, or None."""
    if exc is None:
        return None
    try:
        data = pickle.dumps(exc)
        if type(pickle.loads(data)) is type(exc):
            return data
    except Exception:  # arguments its __init__ does not take again, attributes that do not pickle
        pass
    for cls in type(exc).__mro__:  # the nearest class that takes the message alone
        if not (isinstance(cls, type) and issubclass(cls, ShardstreamError)):
            continue
        try:
            return pickle.dumps(cls(str(exc)))
        except Exception:
            continue
    return None
