"""What the KV budget reads off an accelerator: its memory as PyTorch and the driver see it, and one forward's
activation peak.

The driver's `total - free` counts PyTorch's cached, unallocated blocks (warm-ups, earlier work in the
process) as used, and so would give a second engine in a process nothing. The budget reads instead:
- the driver's total, and its `total - free`, less what PyTorch has reserved: the memory outside torch
  (the CUDA context, NCCL, other processes);
- what PyTorch has *allocated*, less this model's weights and less the spare KV pools a closed engine
  left for the next one (batch_cache.spare_bytes; they are reused or freed before a new pool is made):
  other tensors that stay (another model, a live engine's pool).
Reserved-but-unallocated memory is then free, as it is to the allocator.

`CudaMemory` reads a CUDA device; tests hand the runner a stand-in with the same three methods.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from lookahead.model.kv_memory import DeviceMemory


@dataclass(frozen=True)
class Reading:
    """One device's memory now, in bytes."""

    total: int  # the driver's
    free: int  # the driver's: neither this process's allocator nor anyone else holds it
    reserved: int  # PyTorch's caching allocator holds this much from the driver (allocated or cached)
    allocated: int  # PyTorch's live tensors


class CudaMemory:
    def accelerated(self, device: torch.device) -> bool:
        return device.type == "cuda"

    def read(self, device: torch.device) -> Reading:
        torch.cuda.synchronize(device)
        free, total = torch.cuda.mem_get_info(device)
        return Reading(total, free, torch.cuda.memory_reserved(device), torch.cuda.memory_allocated(device))

    def peak_during(self, devices: list[torch.device], fn: Callable[[], object]) -> int:
        """The most `fn` allocated on any of `devices` above what was allocated there when it started."""
        base = {}
        for d in devices:
            torch.cuda.synchronize(d)
            torch.cuda.reset_peak_memory_stats(d)
            base[d] = torch.cuda.memory_allocated(d)
        fn()
        for d in devices:
            torch.cuda.synchronize(d)
        return max(torch.cuda.max_memory_allocated(d) - base[d] for d in devices)


def budget_terms(r: Reading, weights: int, spare: int, activation_peak: int) -> DeviceMemory:
    outside_torch = max(0, (r.total - r.free) - r.reserved)
    other_tensors = max(0, r.allocated - weights - spare)
    return DeviceMemory(r.total, weights, outside_torch + other_tensors, activation_peak)
