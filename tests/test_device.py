"""``soulmem_torch.device.resolve_device``: the one device resolver of the package."""

from __future__ import annotations

import pytest
import torch

from soulmem_torch.device import resolve_device
from soulmem_torch.errors import DeviceResolutionError, SoulMemError


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine with two CUDA devices, device 1 current (no GPU is touched)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.mark.parametrize("value", [None, "cpu", " cpu ", torch.device("cpu")])
def test_cpu(value: object) -> None:
    assert resolve_device(value) == torch.device("cpu")


def test_auto_without_cuda_is_the_cpu(no_gpu: None) -> None:
    assert resolve_device("auto") == torch.device("cpu")


def test_auto_with_cuda_is_the_current_device(two_gpus: None) -> None:
    assert resolve_device("auto") == torch.device("cuda", 1)


@pytest.mark.parametrize(
    ("value", "index"),
    [("cuda", 1), ("cuda:0", 0), ("cuda:1", 1), (0, 0), (1, 1), (torch.device("cuda"), 1)],
)
def test_cuda_forms_name_one_indexed_device(two_gpus: None, value: object, index: int) -> None:
    # "cuda" and the current device's index are one device (and one cache key)
    assert resolve_device(value) == torch.device("cuda", index)


@pytest.mark.parametrize("value", ["cuda", "cuda:0", 0, "auto"])
def test_cuda_without_cuda(no_gpu: None, value: object) -> None:
    if value == "auto":
        assert resolve_device(value).type == "cpu"
        return
    with pytest.raises(DeviceResolutionError, match="CUDA is not available"):
        resolve_device(value)


@pytest.mark.parametrize("value", ["cuda:2", "cuda:7", 5])
def test_a_cuda_index_past_the_device_count(two_gpus: None, value: object) -> None:
    with pytest.raises(DeviceResolutionError, match="there are only 2"):
        resolve_device(value)


@pytest.mark.parametrize("value", ["gpu", "cuda:x", "tpu:banana", "", -1, 1.5, True, [0], object()])
def test_bad_values_name_the_argument_and_the_forms(value: object) -> None:
    with pytest.raises(DeviceResolutionError) as info:
        resolve_device(value, what="--device")
    message = str(info.value)
    assert message.startswith("--device: expected None, 'auto', 'cpu', 'cuda', 'cuda:N'")
    assert repr(value) in message
    assert isinstance(info.value, (SoulMemError, ValueError))


def test_every_entry_point_uses_it(two_gpus: None) -> None:
    """The bank and the strategies' requests resolve through the same function: ``"cuda"``
    is the current device's index, a bad name the same error."""
    from soulmem_torch.bank import MemoryBank

    assert MemoryBank(device="cuda").device == torch.device("cuda", 1)
    with pytest.raises(DeviceResolutionError, match="there are only 2"):
        MemoryBank(device="cuda:3")


def test_the_command_line_names_its_flag(no_gpu: None) -> None:
    from soulmem_torch.cli._memory import _resolve_device

    assert _resolve_device(None) == torch.device("cpu")
    with pytest.raises(DeviceResolutionError, match=r"^--device: 'cuda' asks for CUDA"):
        _resolve_device("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_real_gpu() -> None:
    current = torch.cuda.current_device()
    assert resolve_device("cuda") == torch.device("cuda", current)
    assert resolve_device("auto") == torch.device("cuda", current)
    assert torch.zeros(1, device=resolve_device("cuda:0")).device == torch.device("cuda", 0)
    with pytest.raises(DeviceResolutionError, match="there are only"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")


def test_soulmem_resolves_at_construction(no_gpu: None) -> None:
    from soulmem_torch import SoulMem

    assert SoulMem(device="auto").device == torch.device("cpu")
    with pytest.raises(DeviceResolutionError, match="CUDA is not available"):
        SoulMem(device="cuda")
