"""A paged KV pool shaped like a real server's.

Layout (HND, as TensorRT-LLM's paged pool and FlashInfer's "HND" layout): one tensor

    kv[layer, block, kv, head, token, dim]   shape [L, NB, 2, H, B, D]

so that ``kv[l]`` is layer ``l``'s pool ``[num_blocks, 2 (K, V), num_kv_heads, block_size,
head_dim]``, and within a block each head's tokens are consecutive rows of ``head_dim``
values (one token of one head = ``head_dim * elem_bytes`` contiguous bytes). A block id
spans all layers: one block table per request, as in vLLM / TensorRT-LLM. Strides are passed
to the kernels explicitly, so a per-layer list of tensors with the same inner layout would
work the same way.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}


@dataclass
class PagedKVPool:
    """GPU (or CPU) paged KV pool with a free list and per-request block tables.

    Args: num_layers L, num_blocks NB, num_kv_heads H, block_size B (tokens per block),
    head_dim D, dtype ("bf16" | "fp16" | "fp8" or a torch dtype), device.
    ``with_positions=True`` adds ``positions`` ([NB, B] int32), the per-slot position index
    that hole-filling compaction needs (order is lost there).
    """

    num_layers: int
    num_blocks: int
    num_kv_heads: int
    block_size: int
    head_dim: int
    dtype: object = "bf16"
    device: str = "cuda"
    with_positions: bool = False
    seed: int = 0
    kv: torch.Tensor = field(init=False, repr=False)
    positions: torch.Tensor | None = field(init=False, default=None, repr=False)
    block_tables: dict = field(init=False, default_factory=dict, repr=False)

    def __post_init__(self):
        dt = DTYPES.get(self.dtype, self.dtype)
        self.dtype = dt
        shape = (self.num_layers, self.num_blocks, 2, self.num_kv_heads, self.block_size, self.head_dim)
        g = torch.Generator(device=self.device).manual_seed(self.seed)
        if dt == torch.float8_e4m3fn:
            self.kv = torch.randn(shape, generator=g, device=self.device, dtype=torch.bfloat16).to(dt)
        else:
            self.kv = torch.randn(shape, generator=g, device=self.device, dtype=dt)
        if self.with_positions:
            self.positions = torch.full((self.num_blocks, self.block_size), -1, dtype=torch.int32, device=self.device)
        self._free = list(range(self.num_blocks - 1, -1, -1))

    # ------------------------------------------------------------------ sizes
    @property
    def elem_bytes(self) -> int:
        return self.kv.element_size()

    @property
    def block_bytes(self) -> int:
        """Bytes of one block (page) over all layers, K and V."""
        return self.num_layers * 2 * self.num_kv_heads * self.block_size * self.head_dim * self.elem_bytes

    @property
    def token_bytes(self) -> int:
        """Bytes of one token slot over all layers, heads, K and V."""
        return self.block_bytes // self.block_size

    def layer(self, l: int) -> torch.Tensor:
        """Layer ``l``'s pool view, [num_blocks, 2, H, B, D]."""
        return self.kv[l]

    @property
    def blocks_in_use(self) -> int:
        return self.num_blocks - len(self._free)

    # ------------------------------------------------------------------ allocation
    def allocate(self, request_id, num_tokens: int) -> list[int]:
        """Give request ``request_id`` ceil(num_tokens / B) blocks (appending to its table);
        fills ``positions`` with 0..num_tokens-1. Raises MemoryError when the pool is short."""
        bt = self.block_tables.setdefault(request_id, [])
        need = -(-num_tokens // self.block_size) - len(bt)
        if need > len(self._free):
            raise MemoryError(f"need {need} blocks, {len(self._free)} free")
        for _ in range(max(need, 0)):
            bt.append(self._free.pop())
        if self.positions is not None:
            pos = torch.arange(len(bt) * self.block_size, dtype=torch.int32, device=self.device)
            self.positions[torch.tensor(bt, device=self.device)] = pos.view(len(bt), self.block_size)
        return bt

    def free_blocks(self, request_id, blocks) -> None:
        """Return ``blocks`` (ids) of ``request_id`` to the free list (e.g. after compaction)."""
        bt = self.block_tables[request_id]
        for b in blocks:
            bt.remove(int(b))
            self._free.append(int(b))

    def release(self, request_id) -> None:
        """Free every block of ``request_id``."""
        for b in self.block_tables.pop(request_id, []):
            self._free.append(b)

    def block_table_tensor(self, request_ids, width: int | None = None) -> torch.Tensor:
        """int32 [R, width] block table of ``request_ids``, padded with 0 (never read past
        a request's length)."""
        rows = [self.block_tables[r] for r in request_ids]
        width = width or max(len(r) for r in rows)
        t = torch.zeros((len(rows), width), dtype=torch.int32)
        for i, r in enumerate(rows):
            t[i, :len(r)] = torch.tensor(r, dtype=torch.int32)
        return t.to(self.device)
