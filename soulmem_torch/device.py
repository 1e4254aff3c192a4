"""Where tensors live: the one device resolver of the package.

Kernels never choose a device (they follow their inputs); every entry point — ``SoulMem``,
``MemoryBank``, the strategies' requests, ``MemoryGraph.to``, the ``--device`` of the
command line — resolves the device it is given with :func:`resolve_device`, so ``"cuda"``
means the same everywhere (and cache keys built from the device agree).
"""

from __future__ import annotations

import torch

from soulmem_torch.errors import DeviceResolutionError

__all__ = ["resolve_device"]

_EXPECTED = "None, 'auto', 'cpu', 'cuda', 'cuda:N', a CUDA index or a torch.device"


def resolve_device(
    device: torch.device | str | int | None, *, what: str = "device"
) -> torch.device:
    """The ``torch.device`` that ``device`` names.

    * ``None`` → CPU; ``"auto"`` → the current CUDA device when CUDA is available, else CPU.
    * ``"cuda"`` (no index) → ``cuda:<current device>``, so ``"cuda"`` and ``"cuda:0"`` are
      one device (and one cache key) when device 0 is current.
    * ``"cuda:N"`` / ``N`` / a ``torch.device`` → as given, after checking that CUDA is
      available and device ``N`` exists; other device types (``"cpu"``, ``"meta"``, …) as
      ``torch.device`` reads them.

    Args:
        device: what to resolve.
        what: the argument's name in error messages (``"--device"`` for the command line).

    Raises:
        DeviceResolutionError: not a device name (``"gpu"``, ``"cuda:x"``, ``1.5``), or a CUDA
            device on a machine without CUDA or with fewer devices; the message names
            ``what``, the accepted forms and the value found.

    Examples:
        >>> resolve_device(None)
        device(type='cpu')
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    if device is None:
        return torch.device("cpu")
    if isinstance(device, str) and device.strip() == "auto":
        return resolve_device("cuda" if torch.cuda.is_available() else "cpu", what=what)
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise DeviceResolutionError(
            f"{what}: expected {_EXPECTED}, found {device!r} ({type(device).__name__})"
        )
    try:
        if isinstance(device, int):  # a CUDA index (torch.device(int) needs a built-in accelerator)
            dev = torch.device("cuda", device)
        else:
            dev = torch.device(device.strip() if isinstance(device, str) else device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise DeviceResolutionError(
            f"{what}: expected {_EXPECTED}, found {device!r} ({exc})"
        ) from None
    if dev.type != "cuda":
        return dev
    if not torch.cuda.is_available():
        raise DeviceResolutionError(
            f"{what}: {device!r} asks for CUDA, but CUDA is not available on this machine "
            "(torch.cuda.is_available() is False); use 'cpu' or 'auto'"
        )
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if index >= count:
        raise DeviceResolutionError(
            f"{what}: {device!r} asks for CUDA device {index}, but there are only {count}"
        )
    return torch.device("cuda", index)
