"""A KV-cache layer that decodes into preallocated buffers instead of growing by concatenation.

transformers' `DynamicLayer` appends each step's keys and values with `torch.cat`, which copies the layer's
whole cache every step. With 16 rows of ~330 positions and 30 layers that is ~240 MB copied per decode step,
as much time as the matrix multiplies on a 2-core CPU. `BufferedLayer` instead keeps keys and values in a
buffer with spare positions (`headroom`) and writes new positions in place; `keys` / `values` are views of
the filled part, so everything that reads a `DynamicLayer` (masks, `get_seq_length`, attention) works as is.

Rows are right-aligned: every row's newest position is the view's last one. Rows joining the batch (`join`)
are written into spare row slots, and a joining cache longer than the batch's grows the view to the left
into spare positions there, so a join copies only the new rows; rows leaving (`keep_rows`) move the few
surviving rows from the end of the batch into the freed slots instead of copying every row. The buffer is
rebuilt (everything copied once) only when it runs out of positions or rows; a rebuild for a join leaves
room for as many rows again and spare positions on both sides (`_spare`). (Rebuilding the whole batch on every
join cost 18% of the generation worker's time in 16-episode exploration, where a new turn joins after
almost every prefill.) Anyone may also assign `keys` / `values` directly (as prefill does); the next `update`
sees they are no longer views of the buffer and adopts them into a fresh one.

Views handed out earlier stay valid: writes only ever go to positions outside every earlier view (past its
end, or before its start), or to rows that left the batch. Positions a view exposes that no row wrote are
zeroed, not left uninitialised: they are masked out, but a NaN there would still poison the attention sum.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer


class BufferedLayer(DynamicLayer):
    """A full-attention `DynamicLayer` whose keys/values are views of a buffer with spare positions and rows."""

    headroom = 64  # least spare positions allocated whenever the buffer is (re)built

    def _spare(self, used: int) -> int:
        """Spare positions for a rebuild of `used` positions: a quarter of them (at least `headroom`), so rebuilds
        of a long batch (each copies all of it) come rarer as it grows and their cost per decode step stays flat;
        with a fixed 64, 16 exploration episodes of ~2,000 positions rebuilt every few dozen steps, 0.3 s each."""
        return max(self.headroom, used // 4)

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._key_buf: torch.Tensor | None = None  # [rows capacity, H, positions capacity, D]
        self._value_buf: torch.Tensor | None = None
        self._start = 0  # buffer position of the views' first position
        self._heads_dim: tuple[int, int] = (0, 0)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        used = self.get_seq_length()
        new = key_states.shape[-2]
        owned = self._owns_views()
        if not owned or self._start + used + new > self._key_buf.shape[2]:  # type: ignore[union-attr]
            # out of positions: keep the spare rows, so the next join does not have to rebuild again
            spare_rows = self._key_buf.shape[0] if owned else 0  # type: ignore[union-attr]
            self._rebuild(extra=new, batch=key_states.shape[0], rows_capacity=spare_rows)
        assert self._key_buf is not None and self._value_buf is not None
        rows, end = key_states.shape[0], self._start + used
        self._key_buf[:rows, :, end : end + new] = key_states
        self._value_buf[:rows, :, end : end + new] = value_states
        self._view(rows, end + new)
        return self.keys, self.values  # type: ignore[return-value]

    def preload(self, prefixes: list[list[tuple[torch.Tensor, torch.Tensor]]], length: int, extra: int) -> None:
        """Start from one row per prefix, given as consecutive (keys, values) pieces ([1, H, r, D] each),
        right-aligned and left-padded with zeros to `length` positions, in a buffer with room for `extra` more
        positions plus headroom: the prefill that follows writes its suffix in place (assigning concatenated
        tensors instead would be copied again into a fresh buffer by the first `update`)."""
        first_keys, first_values = prefixes[0][0]
        self.lazy_initialization(first_keys, first_values)
        rows, heads, dim = len(prefixes), first_keys.shape[1], first_keys.shape[3]
        shape = (rows, heads, length + extra + self.headroom, dim)
        self._key_buf = torch.empty(shape, dtype=first_keys.dtype, device=first_keys.device)
        self._value_buf = torch.empty(shape, dtype=first_values.dtype, device=first_values.device)
        self._start = 0
        for row, pieces in enumerate(prefixes):
            at = length - sum(keys.shape[2] for keys, _ in pieces)
            self._key_buf[row, :, :at] = 0
            self._value_buf[row, :, :at] = 0
            for keys, values in pieces:
                size = keys.shape[2]
                self._key_buf[row, :, at : at + size] = keys[0]
                self._value_buf[row, :, at : at + size] = values[0]
                at += size
        self._view(rows, length)

    def join(self, keys: torch.Tensor, values: torch.Tensor, max_rows: int | None = None) -> None:
        """Append rows (their caches right-aligned with ours, shorter ones left-padded with masked zeros).

        `max_rows` caps the spare rows a rebuild allocates (the batch never grows past it)."""
        assert self.keys is not None and self.values is not None
        old_rows, old_len = self.keys.shape[0], self.keys.shape[2]
        new_len = keys.shape[2]
        rows, length = old_rows + keys.shape[0], max(old_len, new_len)
        grow = length - old_len  # positions the batch gains on the left
        if not self._owns_views() or self._key_buf is None or rows > self._key_buf.shape[0] or grow > self._start:
            spare_rows = max(rows, min(2 * rows, max_rows or 2 * rows))
            self._rebuild(extra=0, batch=old_rows, rows_capacity=spare_rows, left=grow + self._spare(length))
        assert self._key_buf is not None and self._value_buf is not None
        end = self._start + old_len
        start = end - length
        for buf, new in ((self._key_buf, keys), (self._value_buf, values)):
            buf[:old_rows, :, start : self._start] = 0  # newly exposed to the old rows
            buf[old_rows:rows, :, start : end - new_len] = 0  # the new rows' left padding
            buf[old_rows:rows, :, end - new_len : end] = new
        self._start = start
        self._view(rows, end)

    def keep_rows(self, moves: list[tuple[int, int]], rows: int, drop_front: int) -> None:
        """Shrink the batch to its first `rows` rows after copying row `src` into row `dst` for each move,
        and drop the first `drop_front` positions (padding in every remaining row)."""
        assert self.keys is not None and self.values is not None
        used = self.keys.shape[2]
        if not self._owns_views():
            self._rebuild(extra=0, batch=self.keys.shape[0])
        assert self._key_buf is not None and self._value_buf is not None
        begin, end = self._start, self._start + used
        # one slice copy per moved row: 4x faster than one index_put of all of them (few rows move at a time, and
        # no row is both a source and a destination: sources are past `rows`, destinations before)
        for dst, src in moves:
            self._key_buf[dst, :, begin:end].copy_(self._key_buf[src, :, begin:end])
            self._value_buf[dst, :, begin:end].copy_(self._value_buf[src, :, begin:end])
        self._start = begin + drop_front
        self._view(rows, end)

    def _owns_views(self) -> bool:
        """Whether `keys`/`values` are still the views this layer made (not tensors assigned from outside)."""
        if self._key_buf is None or self.keys is None or self.values is None or self.keys.dim() != 4:
            return False
        return all(
            view.data_ptr() == buf[:, :, self._start :].data_ptr()
            and view.stride() == buf.stride()
            and view.shape[0] <= buf.shape[0]
            and self._start + view.shape[2] <= buf.shape[2]
            for view, buf in ((self.keys, self._key_buf), (self.values, self._value_buf))
        )

    def _rebuild(self, *, extra: int, batch: int, rows_capacity: int = 0, left: int = 0) -> None:
        """Copy the current keys/values into a fresh buffer with `left` spare positions before them and room for
        `extra` positions plus headroom after them, and at least `rows_capacity` rows."""
        keys, values = self.keys, self.values
        used = 0 if keys is None or keys.numel() == 0 else keys.shape[2]
        rows, heads, dim = (keys.shape[0], keys.shape[1], keys.shape[3]) if used else (batch, *self._heads_dim)
        shape = (max(rows, rows_capacity), heads, left + used + extra + self._spare(used + extra), dim)
        key_buf = torch.empty(shape, dtype=self.dtype, device=self.device)
        value_buf = torch.empty(shape, dtype=self.dtype, device=self.device)
        if used:
            key_buf[:rows, :, left : left + used] = keys
            value_buf[:rows, :, left : left + used] = values
        self._key_buf, self._value_buf, self._start = key_buf, value_buf, left
        self._view(rows, left + used)

    def _view(self, rows: int, end: int) -> None:
        """Point `keys`/`values` at the first `rows` rows, positions from the start up to buffer position `end`."""
        assert self._key_buf is not None and self._value_buf is not None
        self.keys = self._key_buf[:rows, :, self._start : end]
        self.values = self._value_buf[:rows, :, self._start : end]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._heads_dim = (key_states.shape[1], key_states.shape[3])

    def reset(self) -> None:
        self._key_buf = self._value_buf = None
        self._start = 0
        super().reset()


def pad_left(t: torch.Tensor, length: int) -> torch.Tensor:
    """Left-pad a [B, L] mask or [B, H, L, D] cache tensor with zeros to `length` positions."""
    missing = length - (t.shape[1] if t.dim() == 2 else t.shape[2])
    if missing == 0:
        return t
    pad = (missing, 0) if t.dim() == 2 else (0, 0, missing, 0)
    return torch.nn.functional.pad(t, pad)
