"""A KV-cache layer that decodes into preallocated buffers instead of growing by concatenation.

transformers' `DynamicLayer` appends each step's keys and values with `torch.cat`, which copies the layer's
whole cache every step. With 16 rows of ~330 positions and 30 layers that is ~240 MB copied per decode step,
as much time as the matrix multiplies on a 2-core CPU. `BufferedLayer` instead keeps keys and values in a
buffer with spare positions (`headroom`) and writes new positions in place; `keys` / `values` are views of
the filled part, so everything that reads a `DynamicLayer` (masks, `get_seq_length`, attention) works as is.

The buffer is rebuilt only when it runs out of positions (once per `headroom` steps) or when the batch
changes shape: rows joining go through `join`, rows leaving through `keep_rows`, which moves the few
surviving rows from the end of the batch into the freed slots instead of copying every row. Anyone may also
assign `keys` / `values` directly (as prefill does); the next `update` sees they are no longer views of the
buffer and adopts them into a fresh one.

Views handed out earlier stay valid: writes only ever go to positions past every earlier view's end, or to
rows that left the batch.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer


class BufferedLayer(DynamicLayer):
    """A full-attention `DynamicLayer` whose keys/values are views of a buffer with spare positions."""

    headroom = 64  # spare positions allocated whenever the buffer is (re)built

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._key_buf: torch.Tensor | None = None  # [rows capacity, H, positions capacity, D]
        self._value_buf: torch.Tensor | None = None
        self._heads_dim: tuple[int, int] = (0, 0)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        used = self.get_seq_length()
        total = used + key_states.shape[-2]
        if not self._owns_views() or self._key_buf is None or self._key_buf.shape[2] < total:
            self._rebuild(extra=key_states.shape[-2], batch=key_states.shape[0])
        assert self._key_buf is not None and self._value_buf is not None
        rows = key_states.shape[0]
        self._key_buf[:rows, :, used:total] = key_states
        self._value_buf[:rows, :, used:total] = value_states
        self.keys = self._key_buf[:rows, :, :total]
        self.values = self._value_buf[:rows, :, :total]
        return self.keys, self.values

    def join(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Append rows (their caches right-aligned with ours, shorter ones left-padded with masked zeros)."""
        old_k, old_v = self.keys, self.values
        assert old_k is not None and old_v is not None
        length = max(old_k.shape[2], keys.shape[2])
        rows = old_k.shape[0] + keys.shape[0]
        shape = (rows, old_k.shape[1], length + self.headroom, old_k.shape[3])
        key_buf = old_k.new_zeros(shape)
        value_buf = old_v.new_zeros(shape)
        first = old_k.shape[0]
        key_buf[:first, :, length - old_k.shape[2] : length] = old_k
        value_buf[:first, :, length - old_v.shape[2] : length] = old_v
        key_buf[first:, :, length - keys.shape[2] : length] = keys
        value_buf[first:, :, length - values.shape[2] : length] = values
        self._set(key_buf, value_buf, rows, length)

    def keep_rows(self, moves: list[tuple[int, int]], rows: int, drop_front: int) -> None:
        """Shrink the batch to its first `rows` rows after copying row `src` into row `dst` for each move,
        and drop the first `drop_front` positions (padding in every remaining row)."""
        assert self.keys is not None and self.values is not None
        used = self.keys.shape[2]
        if not self._owns_views():
            self._rebuild(extra=0, batch=self.keys.shape[0])
        assert self._key_buf is not None and self._value_buf is not None
        if moves:
            dst = torch.tensor([d for d, _ in moves], device=self._key_buf.device)
            src = torch.tensor([s for _, s in moves], device=self._key_buf.device)
            self._key_buf[dst, :, :used] = self._key_buf[src, :, :used]
            self._value_buf[dst, :, :used] = self._value_buf[src, :, :used]
        self._set(self._key_buf[:, :, drop_front:], self._value_buf[:, :, drop_front:], rows, used - drop_front)

    def _owns_views(self) -> bool:
        """Whether `keys`/`values` are still the views this layer made (not tensors assigned from outside)."""
        if self._key_buf is None or self.keys is None or self.values is None or self.keys.dim() != 4:
            return False
        return all(
            view.data_ptr() == buf.data_ptr() and view.stride() == buf.stride() and view.shape[0] <= buf.shape[0]
            for view, buf in ((self.keys, self._key_buf), (self.values, self._value_buf))
        )

    def _rebuild(self, *, extra: int, batch: int) -> None:
        """Copy the current keys/values into a fresh buffer with room for `extra` positions plus headroom."""
        keys, values = self.keys, self.values
        used = 0 if keys is None or keys.numel() == 0 else keys.shape[2]
        rows, heads, dim = (keys.shape[0], keys.shape[1], keys.shape[3]) if used else (batch, *self._heads_dim)
        shape = (rows, heads, used + extra + self.headroom, dim)
        key_buf = torch.empty(shape, dtype=self.dtype, device=self.device)
        value_buf = torch.empty(shape, dtype=self.dtype, device=self.device)
        if used:
            key_buf[:, :, :used] = keys
            value_buf[:, :, :used] = values
        self._set(key_buf, value_buf, rows, used)

    def _set(self, key_buf: torch.Tensor, value_buf: torch.Tensor, rows: int, used: int) -> None:
        self._key_buf, self._value_buf = key_buf, value_buf
        self.keys, self.values = key_buf[:rows, :, :used], value_buf[:rows, :, :used]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._heads_dim = (key_states.shape[1], key_states.shape[3])

    def reset(self) -> None:
        self._key_buf = self._value_buf = None
        super().reset()


def pad_left(t: torch.Tensor, length: int) -> torch.Tensor:
    """Left-pad a [B, L] mask or [B, H, L, D] cache tensor with zeros to `length` positions."""
    missing = length - (t.shape[1] if t.dim() == 2 else t.shape[2])
    if missing == 0:
        return t
    pad = (missing, 0) if t.dim() == 2 else (0, 0, missing, 0)
    return torch.nn.functional.pad(t, pad)
