"""A second device on a CPU, for tests: `PhantomDevice` tags what the model computes as living on `cpu:0`
("the device") and every other tensor as the host's, then checks each torch call as CUDA would.

- A call mixing device tensors with host tensors of one or more dims raises a device mismatch (as CUDA does;
  0-dim host tensors are scalars and may join). Exceptions, as on CUDA: a host tensor indexing a device tensor
  and a basic-slice write of a host tensor into one are copied to the device (a blocking copy: counted).
- Host syncs are counted: reads of device values (`item`, `tolist`, `bool`/`float`/`int`/`index`, `cpu`,
  `numpy`, a blocking copy to the host), data-dependent shapes of device tensors (`nonzero`, boolean-mask
  indexing, `masked_select`, `unique`, ...) and blocking host-to-device copies (`.to(device)` without
  `non_blocking`, host indices of device tensors).

Device tensors are the seeds' (a model's parameters and buffers, or given tensors), what a factory makes with
`device=` the device, what `.to()` moves there, and every result of a call given a device tensor. A device
tensor's `.device` reads `cpu:0`, so code that follows `model.device` or `x.device` keeps to the device, and a
factory given no device makes a host tensor: the mistake a CPU run cannot otherwise see.
"""

from __future__ import annotations

import traceback
from collections import Counter
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

DEVICE = torch.device("cpu", 0)
READS = {"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu", "numpy"}
DATA_DEPENDENT = {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "nonzero_static"}
FACTORIES = {"arange", "zeros", "ones", "empty", "full", "tensor", "as_tensor", "eye", "linspace", "logspace",
             "rand", "randn", "randint", "randperm", "new_zeros", "new_ones", "new_empty", "new_full",
             "new_tensor", "zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like"}
INDEXING = {"__getitem__", "__setitem__", "index_put_", "index_put"}


class DeviceMismatch(RuntimeError):
    """What CUDA raises where a call mixes tensors of the device and of the host."""


class PhantomDevice(TorchFunctionMode):
    """Within it, `seeds` (modules or tensors) live on the device; `syncs` counts host syncs by kind and
    `sites` by (kind, the project's file:line that made it)."""

    def __init__(self, *seeds):
        super().__init__()
        self.on_device = WeakIdKeyDictionary()
        self.syncs: Counter = Counter()
        self.sites: Counter = Counter()
        for seed in seeds:
            tensors = [*seed.parameters(), *seed.buffers()] if isinstance(seed, torch.nn.Module) else [seed]
            for t in tensors:
                self.on_device[t] = True

    def total(self) -> int:
        return sum(self.syncs.values())

    def reset(self) -> None:
        self.syncs.clear()
        self.sites.clear()

    def device_tensor(self, t) -> bool:
        return isinstance(t, torch.Tensor) and t in self.on_device

    def _sync(self, kind: str) -> None:
        self.syncs[kind] += 1
        frames = [f for f in traceback.extract_stack()[:-2] if "site-packages" not in f.filename
                  and not f.filename.endswith("phantom.py")]
        where = f"{'/'.join(Path(frames[-1].filename).parts[-2:])}:{frames[-1].lineno}" if frames else "?"
        self.sites[(kind, where)] += 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "__get__":                                   # a property (.device, .T, .data, ...)
            out = func(*args, **kwargs)
            if not self.device_tensor(args[0]):
                return out
            if isinstance(out, torch.Tensor):
                self.on_device[out] = True
            return DEVICE if func.__self__.__name__ == "device" else out
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        on = [self.device_tensor(t) for t in tensors]
        target, non_blocking = self._moved(args, kwargs) if name == "to" else (self._made(name, kwargs), False)
        if any(on):
            self._check(name, args, kwargs, tensors, on, target is False and not non_blocking)
        elif target and name == "to" and not non_blocking and args[0].numel():
            self._sync("host_to_device")
        out = func(*args, **kwargs)
        if out is (args[0] if args else None) and (name == "cpu" or name == "to" and target is not None) and \
                bool(target) != bool(on[0]):
            out = out.clone()                                   # a move between them is a copy, as on CUDA
        if target or (target is None and any(on) and name not in READS):
            tree_map(lambda t: self.on_device.__setitem__(t, True) if isinstance(t, torch.Tensor) else None, out)
        return out

    def _moved(self, args, kwargs) -> tuple[bool | None, bool]:
        """`.to`'s target (True: the device, False: the host, None: where it is) and whether it is non-blocking."""
        if args[1:] and isinstance(args[1], torch.Tensor):
            return self.device_tensor(args[1]), bool(kwargs.get("non_blocking", args[2:3] == (True,)))
        device, _, non_blocking, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
        return (None if device is None else device == DEVICE), non_blocking

    @staticmethod
    def _made(name: str, kwargs) -> bool | None:
        """Whether a factory's result is on the device (None: as its inputs, for `new_*` and `*_like` given no
        device; a factory given none makes a host tensor)."""
        if name not in FACTORIES:
            return None
        if kwargs.get("device") is not None:
            return torch.device(kwargs["device"]) == DEVICE
        return None if name.endswith("_like") or name.startswith("new_") else False

    def _check(self, name: str, args, kwargs, tensors, on, to_host: bool) -> None:
        """Count the syncs of a call given a device tensor (to_host: a blocking `.to` the host); raise where CUDA
        would refuse it."""
        source = self.device_tensor(args[0]) if args else False
        if (name in READS or to_host) and source:
            self._sync(name if name in READS else "cpu")
            return
        if name in DATA_DEPENDENT or (name == "where" and len(args) == 1) or \
                (name == "repeat_interleave" and "output_size" not in kwargs):
            self._sync("data_dependent")
            return
        if name in INDEXING:
            self._indexing(name, args, source)
            return
        if name == "copy_" and source:
            if not self.device_tensor(args[1]) and not kwargs.get("non_blocking") and args[1].dim():
                self._sync("host_to_device")
            return
        mixed = [t for t, dev in zip(tensors, on) if not dev and t.dim()]
        if mixed and name != "to":
            raise DeviceMismatch(f"{name}: tensors on the device and on the host {tuple(mixed[0].shape)} in one "
                                 f"call (CUDA: expected all tensors to be on the same device)")

    def _indexing(self, name: str, args, source: bool) -> None:
        """t[index] and t[index] = value: host indices of a device tensor are copied to it (blocking), device
        boolean masks make a data-dependent shape; a host tensor is never indexed by device indices. A list index
        is a host tensor made from it."""
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        parts = [i for i in tree_flatten(index)[0] if isinstance(i, torch.Tensor)]
        if not source:
            if any(self.device_tensor(i) for i in parts):
                raise DeviceMismatch(f"{name}: a host tensor indexed by device indices")
            return
        if any(isinstance(i, list) for i in index) or any(not self.device_tensor(i) and i.dim() for i in parts):
            self._sync("host_to_device")
        if any(self.device_tensor(i) and i.dtype == torch.bool for i in parts):
            self._sync("data_dependent")
        value = args[2] if len(args) > 2 else None
        if isinstance(value, torch.Tensor) and not self.device_tensor(value) and value.dim():
            if parts:
                raise DeviceMismatch(f"{name}: a host value {tuple(value.shape)} written into a device tensor at "
                                     f"tensor indices (CUDA moves only 0-dim values)")
            self._sync("host_to_device")
