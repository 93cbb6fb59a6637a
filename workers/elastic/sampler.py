"""The elastic sampler: which samples each worker trains on at each mini-batch.

Data progress is one number, the global step. Step ``s`` belongs to epoch
``s // steps_per_epoch``; the epoch's permutation is seeded by ``(seed,
epoch)``; the step's global batch is the next ``global_batch`` indices of that
permutation, and the current members split it into contiguous shards by rank.
So whatever happens to the membership between two steps, a step's global
batch is the same, every sample is used exactly once per epoch, and the leader
hands over nothing but the step count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ElasticSampler:
    """Deterministic, membership-independent sharding of an epoch into global batches."""

    num_samples: int
    global_batch: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_samples < 1 or self.global_batch < 1:
            raise ValueError("num_samples and global_batch must be >= 1")

    @property
    def steps_per_epoch(self) -> int:
        """Mini-batches per epoch; the last one is short when the batch does not divide."""
        return -(-self.num_samples // self.global_batch)

    def epoch_of(self, step: int) -> int:
        return step // self.steps_per_epoch

    def permutation(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, epoch])
        return rng.permutation(self.num_samples)

    def global_indices(self, step: int) -> np.ndarray:
        """All sample indices of global step ``step``."""
        epoch, offset = divmod(step, self.steps_per_epoch)
        start = offset * self.global_batch
        return self.permutation(epoch)[start : start + self.global_batch]

    def local_indices(self, step: int, rank: int, world: int) -> np.ndarray:
        """The shard of step ``step`` for ``rank`` of ``world`` (may be empty)."""
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside world {world}")
        return shard(self.global_indices(step), rank, world)


def shard(indices: np.ndarray, rank: int, world: int) -> np.ndarray:
    """Contiguous split of ``indices`` into ``world`` parts that differ by at most one."""
    base, extra = divmod(len(indices), world)
    start = rank * base + min(rank, extra)
    return indices[start : start + base + (1 if rank < extra else 0)]
