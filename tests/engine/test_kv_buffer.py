"""The in-place KV-cache layer: joins, rebuilds and row moves give what concatenation gives."""

from __future__ import annotations

import torch

from toolschool.engine.kv_buffer import BufferedLayer


def test_buffered_layer_joins_rows_in_place_after_one_rebuild() -> None:
    torch.manual_seed(0)
    layer = BufferedLayer()
    layer.headroom = 4
    first = torch.randn(2, 2, 6, 8)
    layer.update(first, -first)
    second = torch.randn(1, 2, 3, 8)
    layer.join(second, -second, max_rows=8)  # no spare rows yet: rebuilt with room for as many rows again
    buffer = layer._key_buf
    assert buffer is not None and buffer.shape[0] == 6
    longer = torch.randn(2, 2, 9, 8)  # longer than the batch: the view grows to the left, in place
    layer.join(longer, -longer, max_rows=8)
    assert layer._key_buf is buffer and layer.keys.shape == (5, 2, 9, 8)
    zeros = torch.zeros
    assert torch.equal(layer.keys[:2, :, :3], zeros(2, 2, 3, 8)) and torch.equal(layer.keys[:2, :, 3:], first)
    assert torch.equal(layer.keys[2, :, :6], zeros(2, 6, 8)) and torch.equal(layer.keys[2, :, 6:], second[0])
    assert torch.equal(layer.keys[3:], longer) and torch.equal(layer.values[3:], -longer)
    step = torch.randn(5, 2, 1, 8)
    keys, _ = layer.update(step, -step)
    assert layer._key_buf is buffer and torch.equal(keys[:, :, -1:], step) and torch.equal(keys[3:, :, :-1], longer)
    for _ in range(4):  # past the spare positions on the right: rebuilt, keeping the spare rows
        keys, _ = layer.update(step, -step)
    assert layer._key_buf is not buffer and layer._key_buf.shape[0] == 6 and torch.equal(keys[3:, :, :9], longer)
    buffer = layer._key_buf
    layer.join(torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), max_rows=8)
    assert layer._key_buf is buffer and layer.keys.shape == (6, 2, 14, 8)
    layer.keep_rows([], rows=5, drop_front=0)
    layer.join(torch.randn(2, 2, 20, 8), torch.randn(2, 2, 20, 8), max_rows=8)  # too long for the spare: rebuilt
    assert layer._key_buf is not buffer and layer.keys.shape == (7, 2, 20, 8)
    assert torch.equal(layer.keys[3:5, :, -14:-5], longer) and not layer.keys.isnan().any()


def test_buffered_layer_matches_concatenation() -> None:
    torch.manual_seed(0)
    layer = BufferedLayer()
    layer.headroom = 3
    steps = [torch.randn(4, 2, n, 8) for n in (5, 1, 1, 1, 1, 1)]  # crosses the capacity boundary twice
    for chunk in steps:
        keys, values = layer.update(chunk, -chunk)
    expected = torch.cat(steps, dim=2)
    assert torch.equal(keys, expected) and torch.equal(values, -expected)
    earlier = keys.clone()
    # Rows 0 and 2 leave: row 3 moves into slot 0, and the first position is dropped.
    layer.keep_rows([(0, 3)], rows=2, drop_front=1)
    assert torch.equal(layer.keys, earlier[[3, 1], :, 1:])
    newcomer = torch.randn(1, 2, 4, 8)
    layer.join(newcomer, -newcomer)
    assert layer.keys.shape == (3, 2, 9, 8)
    assert torch.equal(layer.keys[:2], earlier[[3, 1], :, 1:])
    assert torch.equal(layer.keys[2, :, :5], torch.zeros(2, 5, 8)) and torch.equal(layer.keys[2:, :, 5:], newcomer)
    step = torch.randn(3, 2, 1, 8)
    keys, values = layer.update(step, -step)
    assert torch.equal(keys[:, :, -1:], step) and torch.equal(values[:2, :, :-1], -earlier[[3, 1], :, 1:])
    # Keys assigned from outside (as prefill does) are adopted into a fresh buffer on the next update.
    layer.keys, layer.values = keys[:1].clone(), values[:1].clone()
    more, _ = layer.update(step[:1], step[:1])
    assert torch.equal(more[:, :, :-1], keys[:1]) and torch.equal(more[:, :, -1:], step[:1])
