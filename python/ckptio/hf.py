# SPDX-License-Identifier: Apache-2.0
"""ckptio.hf: Hugging Face Trainer and accelerate checkpoints through ckptio, one line each.

``ckptio.hf.install(trainer)`` makes the Trainer's checkpoints go through ckptio: the model's
``model.safetensors`` through ``ckptio.safetensors`` (stock ``from_pretrained`` and safetensors
read it), ``optimizer.pt``, ``scheduler.pt``, ``scaler.pt``, ``rng_state.pth`` and
``training_args.bin`` through ``ckptio.torch.save`` (stock ``torch.load`` reads them), and
``resume_from_checkpoint`` reads them back through ckptio. Each ``checkpoint-N`` directory is
written under a hidden temporary name and renamed into place once every file in it is durable,
so ``get_last_checkpoint`` and resume never see a half-written one.

``ckptio.hf.install_accelerate(accelerator)`` does the same for ``save_state``/``load_state``.
See doc/hf.md for what goes where and why this mechanism.

>>> import ckptio.hf  # doctest: +SKIP
>>> trainer = ckptio.hf.install(transformers.Trainer(model=model, args=args, ...))  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import MethodType
from typing import Any, TypeVar

from ._options import fsync_path

__all__ = ["install", "install_accelerate", "TEMP_SUFFIX"]

#: A checkpoint directory being written is ``.<name>`` + this suffix, beside its final name.
TEMP_SUFFIX = ".ckptio-tmp"
# The checkpoint being replaced, for the moment between the two renames of an overwrite.
_OLD_SUFFIX = ".ckptio-old"
_LEFTOVER = re.compile(r"^\..+\.ckptio-(tmp|old)$")

T = TypeVar("T")

# Routing: while a Trainer or accelerate checkpoint method that install() wrapped runs on this
# thread, the library calls those methods make (torch.save / torch.load, safetensors'
# save_file / load_file) go to ckptio's drop-ins. Everywhere else, and on every other thread,
# they are the originals, unchanged.
_local = threading.local()
_routes_lock = threading.Lock()
_routed = False


def _active() -> dict[str, Any] | None:
    """The io_options of the innermost scope on this thread, or None outside scopes (and
    inside a ckptio call, which may itself call the originals)."""
    stack: list[dict[str, Any]] | None = getattr(_local, "scopes", None)
    if not stack or getattr(_local, "inside", False):
        return None
    return stack[-1]


@contextlib.contextmanager
def _scope(io_options: dict[str, Any] | None) -> Iterator[None]:
    stack = getattr(_local, "scopes", None)
    if stack is None:
        stack = _local.scopes = []
    stack.append(dict(io_options or {}))
    try:
        yield
    finally:
        stack.pop()


def _is_path(f: Any) -> bool:
    return isinstance(f, (str, os.PathLike))


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], i: int, name: str) -> Any:
    return args[i] if len(args) > i else kwargs.get(name)


class _Dispatch:
    """Stands in for ``module.name`` (``original``), calling ``ours()`` instead inside a scope
    when the call names a file by path (file objects keep the original). ``ours`` is looked
    up at each call. It pickles as a reference to ``module.name``, as the function did."""

    def __init__(
        self,
        module: str,
        name: str,
        original: Callable[..., Any],
        ours: Callable[[], Callable[..., Any]],
        path_at: tuple[int, str],
    ) -> None:
        functools.update_wrapper(self, original)
        self.__ckptio_original__ = original
        self._where = (module, name)
        self._ours = ours
        self._path_at = path_at

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        opts = _active()
        if opts is None or not _is_path(_arg(args, kwargs, *self._path_at)):
            return self.__ckptio_original__(*args, **kwargs)
        _local.inside = True
        try:
            return self._ours()(*args, io_options=opts or None, **kwargs)
        finally:
            _local.inside = False

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return _lookup, self._where


def _lookup(module: str, name: str) -> Any:
    return getattr(importlib.import_module(module), name)


def _route(
    module: Any, name: str, ours: Callable[[], Callable[..., Any]], at: tuple[int, str]
) -> None:
    current = getattr(module, name, None)
    if current is not None and not hasattr(current, "__ckptio_original__"):
        setattr(module, name, _Dispatch(module.__name__, name, current, ours, at))


def _install_routes() -> None:
    """Puts the dispatchers in place, once per process."""
    global _routed
    with _routes_lock:
        if _routed:
            return
        import safetensors.torch
        import torch

        from . import safetensors as cst
        from . import torch as ct

        _route(torch, "save", lambda: ct.save, (1, "f"))
        _route(torch, "load", lambda: ct.load, (0, "f"))
        _route(safetensors.torch, "save_file", lambda: cst.save_file, (1, "filename"))
        _route(safetensors.torch, "load_file", lambda: cst.load_file, (0, "filename"))
        try:  # save_pretrained calls the name it imported: route that binding too
            import transformers.modeling_utils as mu
        except ImportError:
            pass
        else:
            _route(mu, "safe_save_file", lambda: cst.save_file, (1, "filename"))
        _routed = True


def _in_scope(method: Callable[..., T], io_options: dict[str, Any] | None) -> Callable[..., T]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> T:
        with _scope(io_options):
            return method(*args, **kwargs)

    return call


# ---- publishing a directory -------------------------------------------------------------


def _fsync_tree(path: str) -> None:
    """fsync every file and directory under ``path`` (files ckptio wrote are durable already;
    the JSON files and configs the Trainer writes itself are not)."""
    for root, _dirs, files in os.walk(path):
        for name in files:
            p = os.path.join(root, name)
            if os.path.islink(p):
                continue
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_path(root)


def _publish(tmp: str, final: str) -> None:
    """Make the complete directory ``tmp`` appear as ``final``, durably; an existing ``final``
    is replaced only once ``tmp`` is complete."""
    _fsync_tree(tmp)
    parent, name = os.path.split(final)
    old = os.path.join(parent, f".{name}{_OLD_SUFFIX}")
    replaced = os.path.isdir(final)
    if replaced:
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_path(parent or ".")
    if replaced:
        shutil.rmtree(old, ignore_errors=True)


def _sweep(parent: str) -> None:
    """Remove what saves killed earlier left under ``parent`` (hidden names only)."""
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return
    for n in names:
        if _LEFTOVER.match(n):
            shutil.rmtree(os.path.join(parent, n), ignore_errors=True)


def _temp_for(final: str) -> str:
    parent, name = os.path.split(final)
    return os.path.join(parent, f".{name}{TEMP_SUFFIX}")


def _redirecting(method: Callable[..., T], name: str, final: str, tmp: str) -> Callable[..., T]:
    """``method`` with its first argument (``name`` by keyword), when it is the directory
    ``final`` or a file in it, moved into ``tmp``."""

    def swap(p: Any) -> Any:
        if not _is_path(p):
            return p
        s = os.path.normpath(os.fspath(p))
        if s == final:
            return tmp
        if os.path.dirname(s) == final:
            return os.path.join(tmp, os.path.basename(s))
        return p

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> T:
        if args:
            args = (swap(args[0]), *args[1:])
        elif name in kwargs:
            kwargs[name] = swap(kwargs[name])
        return method(*args, **kwargs)

    return call


@contextlib.contextmanager
def _patched(obj: Any, replacements: dict[str, Callable[..., Any]]) -> Iterator[None]:
    """Set instance attributes for the duration, then put back what the instance had."""
    missing = object()
    saved = {k: obj.__dict__.get(k, missing) for k in replacements}
    for k, f in replacements.items():
        setattr(obj, k, f)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is missing:
                obj.__dict__.pop(k, None)
            else:
                obj.__dict__[k] = v


# ---- Trainer ----------------------------------------------------------------------------

# The Trainer methods install() needs (transformers 5.x): the checkpoint save, its parts,
# and the loads resume runs.
_TRAINER_SAVE_PARTS = (
    "save_model",
    "_save_optimizer_and_scheduler",
    "_save_scaler",
    "_save_rng_state",
)
_TRAINER_LOADS = (
    "_load_from_checkpoint",
    "_load_optimizer_and_scheduler",
    "_load_scaler",
    "_load_rng_state",
    "_load_best_model",
)


def _require(obj: Any, names: tuple[str, ...], fn: str, what: str) -> None:
    """TypeError naming the methods ``obj`` lacks, when it is not the object ``fn`` wraps."""
    missing = [n for n in names if not callable(getattr(obj, n, None))]
    if missing:
        raise TypeError(f"ckptio.hf.{fn}: {type(obj).__name__} lacks {', '.join(missing)}: not {what}")


def install(trainer: T, *, io_options: dict[str, Any] | None = None) -> T:
    """Route ``trainer``'s checkpoints through ckptio; returns ``trainer``.

    Call it once, after building the Trainer and before ``train()``:
    ``trainer = ckptio.hf.install(Trainer(...))``. Only this instance's methods change (the
    first call also puts dispatchers in place of ``torch.save``, ``torch.load`` and
    safetensors' ``save_file``/``load_file``, which call the originals except inside the
    methods wrapped here, on their thread: see doc/hf.md). Its
    checkpoints keep the stock layout and file names (``model.safetensors``, ``optimizer.pt``,
    ...), written by ckptio; each ``checkpoint-N`` is written as ``.checkpoint-N.ckptio-tmp``
    and renamed into place once complete and durable, so an interrupted save leaves the
    previous checkpoints as they were and ``get_last_checkpoint`` never returns a partial one.
    Resume (``train(resume_from_checkpoint=...)``) and ``load_best_model_at_end`` read
    through ckptio. ``io_options``: ckptio's I/O options for every file (doc/python.md).
    """
    needed = ("_save_checkpoint", "_get_output_dir", *_TRAINER_SAVE_PARTS, *_TRAINER_LOADS)
    _require(trainer, needed, "install", "a transformers 5.x Trainer")
    if getattr(trainer, "_ckptio_installed", False):
        return trainer
    _install_routes()
    opts = dict(io_options or {})
    t: Any = trainer
    stock_save = t._save_checkpoint
    for n in _TRAINER_LOADS:
        setattr(t, n, _in_scope(getattr(t, n), opts))
    # save_model alone (a user's final trainer.save_model()) writes through ckptio too.
    t.save_model = _in_scope(t.save_model, opts)

    def save_checkpoint(self: Any, model: Any, trial: Any = None) -> None:
        _save_checkpoint(self, stock_save, model, trial, opts)

    t._save_checkpoint = MethodType(save_checkpoint, t)
    t._ckptio_installed = True
    return trainer


def _save_checkpoint(
    t: Any, stock: Callable[..., None], model: Any, trial: Any, opts: dict[str, Any]
) -> None:
    """The stock checkpoint save with its files written into a temporary directory that is
    published as checkpoint-N once complete (on every rank: all of them call this)."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

    run_dir = t._get_output_dir(trial=trial)
    name = f"{PREFIX_CHECKPOINT_DIR}-{t.state.global_step}"
    final = os.path.normpath(os.path.join(run_dir, name))
    tmp = _temp_for(final)
    main = bool(t.args.should_save)
    many = t.args.world_size > 1
    if main:
        _sweep(run_dir)
    if many:
        t.accelerator.wait_for_everyone()
    # The stock save records the best checkpoint if its directory exists; the one being
    # saved exists only after the rename, so name it now, as the stock save would.
    if t.state.best_global_step and t.state.best_global_step == t.state.global_step:
        t.state.best_model_checkpoint = final
    parts = {n: _redirecting(getattr(t, n), "output_dir", final, tmp) for n in _TRAINER_SAVE_PARTS}
    # A Hub push uploads the folder in the background, under its name: it runs after the
    # rename, on checkpoint-N.
    pushes: list[object] = []
    parts["_push_from_checkpoint"] = lambda *a, **k: pushes.append(a or k)
    state = t.state
    to_json = {"save_to_json": _redirecting(state.save_to_json, "json_path", final, tmp)}
    with _patched(t, parts), _patched(state, to_json), _scope(opts):
        stock(model, trial)
    if many:
        t.accelerator.wait_for_everyone()
    if main:
        _publish(tmp, final)
    if pushes:
        t._push_from_checkpoint(final)
    if main:
        # The stock rotation ran before the new checkpoint existed (it kept one more): again.
        rotate_checkpoints(
            output_dir=run_dir,
            save_total_limit=t.args.save_total_limit,
            best_model_checkpoint=t.state.best_model_checkpoint,
            use_mtime=True,
        )
    if many:
        t.accelerator.wait_for_everyone()


# ---- accelerate -------------------------------------------------------------------------


def install_accelerate(accelerator: T, *, io_options: dict[str, Any] | None = None) -> T:
    """Route ``accelerator.save_state`` / ``load_state`` through ckptio; returns it.

    The models' weights go through ``ckptio.safetensors`` by accelerate's own hooks
    (``register_save_state_pre_hook`` / ``register_load_state_pre_hook``): ``model.safetensors``
    (``model_1.safetensors``, ...), read by stock safetensors. The optimizers, schedulers,
    sampler, scaler and RNG files keep accelerate's names and go through ``ckptio.torch``.
    ``save_state(output_dir)`` writes into ``.<dir>.ckptio-tmp`` beside ``output_dir`` and
    renames it into place once complete (an existing ``output_dir`` is replaced only then);
    with ``automatic_checkpoint_naming`` accelerate picks the directory itself and the
    files are written in it directly (each file still atomic).
    """
    a: Any = accelerator
    hooks = ("register_save_state_pre_hook", "register_load_state_pre_hook")
    _require(a, ("save_state", "load_state", *hooks), "install_accelerate", "an Accelerator")
    if getattr(a, "_ckptio_installed", False):
        return accelerator
    _install_routes()
    opts = dict(io_options or {})
    from . import safetensors as cst

    def names(models: list[Any]) -> list[str]:
        return [f"model{f'_{i}' if i else ''}.safetensors" for i in range(len(models))]

    def save_hook(models: list[Any], weights: list[dict[str, Any]], output_dir: str) -> None:
        if a.is_main_process or a.project_configuration.save_on_each_node:
            for name, sd in zip(names(weights), weights):
                cst.save_file(
                    {k: v.detach() for k, v in sd.items()},
                    os.path.join(output_dir, name),
                    metadata={"format": "pt"},
                    io_options=opts or None,
                )
        weights.clear()  # written: accelerate's own save skips them

    # load_state's keywords for the models' load_state_dict (strict=...), for the load hook.
    model_kwargs: dict[str, Any] = {}

    def load_hook(models: list[Any], input_dir: str) -> None:
        files = [os.path.join(input_dir, n) for n in names(models)]
        if not all(os.path.isfile(f) for f in files):
            return  # not saved this way (a .bin save): accelerate loads them
        strict = model_kwargs.get("strict", True)
        for model, f in zip(models, files):
            model.load_state_dict(cst.load_file(f, io_options=opts or None), strict=strict)
        models.clear()  # loaded: accelerate's own load skips them

    a.register_save_state_pre_hook(save_hook)
    a.register_load_state_pre_hook(load_hook)
    stock_save, stock_load = a.save_state, a.load_state

    @functools.wraps(stock_load)
    def load_state(input_dir: Any = None, *args: Any, **kwargs: Any) -> Any:
        model_kwargs.clear()
        model_kwargs.update(kwargs)
        with _scope(opts):
            return stock_load(input_dir, *args, **kwargs)

    @functools.wraps(stock_save)
    def save_state(output_dir: Any = None, *args: Any, **kwargs: Any) -> Any:
        if output_dir is None or a.project_configuration.automatic_checkpoint_naming:
            with _scope(opts):
                return stock_save(output_dir, *args, **kwargs)
        final = os.path.normpath(os.path.expanduser(os.fspath(output_dir)))
        tmp = _temp_for(final)
        if a.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        a.wait_for_everyone()
        with _scope(opts):
            stock_save(tmp, *args, **kwargs)
        a.wait_for_everyone()
        if a.is_main_process:
            _publish(tmp, final)
        a.wait_for_everyone()
        return Path(final)  # as accelerate returns it

    a.save_state, a.load_state = save_state, load_state
    a._ckptio_installed = True
    return accelerator
