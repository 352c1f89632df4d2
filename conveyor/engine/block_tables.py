"""The step's block tables as a tensor kept where the attention reads it, updated by what changed.

Rebuilding a step's padded [rows, width] table from Python lists costs the host ~3.6 ms at batch
128 and 8k-token contexts (512 blocks a row; docs/engine.md), every step, while a decode step on a
GPU lasts ~15-25 ms. Here each sequence keeps a row of one persistent table (on the GPU on CUDA,
as vLLM v1's block table): a step compares each sequence's list with what its row holds (a C-level
list comparison), writes only the differences (a decode step adds one block a sequence every
`block_size` tokens) in one scatter, and gathers the step's rows on the device.

A row is keyed by the identity of the sequence's block-table list, which the block manager mutates
in place for the sequence's whole life. The key only saves work: a row's content is always
compared with the list, so a key reused by another list after its sequence ended costs a rewrite,
never a wrong table. Past its list's length a row holds `pad` (never read: every kernel stops at
its context); rows of sequences that left the batch are reused, the least recently used first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from conveyor.engine.staging import to_device


@dataclass(slots=True)
class _Row:
    key: int  # id() of the sequence's block-table list
    known: list[int]  # what the device row holds up to its length (the rest is pad)
    used_at: int  # the step that last used it


class BlockTables:
    def __init__(self, pad: int, device: torch.device, rows: int = 64, width: int = 64) -> None:
        self.pad = pad
        self.device = device
        self.table = torch.full((rows, width), pad, dtype=torch.int32, device=device)
        self._rows: list[_Row | None] = [None] * rows
        self._row_of: dict[int, int] = {}
        self._step = 0
        self.cells_written = 0  # entries written since start: the work this saves is countable

    def rows(self, tables: list[list[int]]) -> list[int]:
        """The row of each list, brought up to date in one scatter; these rows are this step's."""
        self._step += 1
        longest = max((len(t) for t in tables), default=0)
        if longest > self.table.shape[1]:
            self._grow(self.table.shape[0], max(longest, 2 * self.table.shape[1]))
        for table in tables:  # first mark this step's known rows, so a new sequence takes none of them
            if (index := self._row_of.get(id(table))) is not None:
                self._rows[index].used_at = self._step  # type: ignore[union-attr]
        rows: list[int] = []
        writes: list[tuple[int, int, list[int]]] = []  # (row, first column, values)
        for table in tables:
            index, row = self._row(id(table))
            rows.append(index)
            if table == row.known:
                continue
            k = len(row.known)
            start = k if len(table) >= k and table[:k] == row.known else 0  # grown at the end, or changed
            values = table[start:] + [self.pad] * (k - len(table))  # a shorter list: pad what it dropped
            writes.append((index, start, values))
            row.known = list(table)
        self._write(writes)
        return rows

    def gather(self, rows: list[int], width: int) -> torch.Tensor:
        """[len(rows), width] int32, contiguous: the rows' first `width` blocks, in this order."""
        index = to_device(rows, torch.long, self.device)
        return torch.index_select(self.table[:, :width], 0, index)

    def _row(self, key: int) -> tuple[int, _Row]:
        """The key's row; a new one takes a free row, else the least recently used row no sequence
        of this step holds (its content stays `known`: the comparison overwrites what differs), else
        the table doubles."""
        index = self._row_of.get(key)
        if index is not None:
            return index, self._rows[index]  # type: ignore[return-value]
        known: list[int] = []
        free = [i for i, r in enumerate(self._rows) if r is None or r.used_at < self._step]
        if not free:  # every row serves this step
            free = [len(self._rows)]
            self._grow(2 * len(self._rows), self.table.shape[1])
        index = min(free, key=lambda i: -1 if self._rows[i] is None else self._rows[i].used_at)  # type: ignore[union-attr]
        old = self._rows[index]
        if old is not None:
            del self._row_of[old.key]
            known = old.known
        row = self._rows[index] = _Row(key, known, self._step)
        self._row_of[key] = index
        return index, row

    def _grow(self, rows: int, width: int) -> None:
        table = torch.full((rows, width), self.pad, dtype=torch.int32, device=self.device)
        old_rows, old_width = self.table.shape
        table[:old_rows, :old_width] = self.table
        self.table = table
        self._rows += [None] * (rows - old_rows)

    def _write(self, writes: list[tuple[int, int, list[int]]]) -> None:
        cells = [(r, start + j, v) for r, start, values in writes for j, v in enumerate(values)]
        if not cells:
            return
        self.cells_written += len(cells)
        packed = to_device(cells, torch.long, self.device)  # one copy: [cells, 3]
        self.table.index_put_((packed[:, 0], packed[:, 1]), packed[:, 2].to(torch.int32))
