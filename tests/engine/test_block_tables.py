"""The persistent block table (conveyor/engine/block_tables.py), pure: after any sequence of what the
block manager does to tables (grow, copy-on-write, truncate, fork, end, new sequences reusing the
ids of ended ones), every step's gathered table equals the one built from the lists, and a decode
step writes only its new blocks."""

from __future__ import annotations

import random

import torch

from conveyor.engine.block_tables import BlockTables

PAD = 999


def built(tables: list[list[int]], width: int) -> torch.Tensor:
    """The table as the backends built it from the lists before: each list's blocks, then pad."""
    return torch.tensor([(t + [PAD] * width)[:width] for t in tables], dtype=torch.int32)


def check(bt: BlockTables, tables: list[list[int]]) -> None:
    rows = bt.rows(tables)
    width = max(len(t) for t in tables)
    assert torch.equal(bt.gather(rows, width), built(tables, width))
    half = rows[len(rows) // 2 :]  # a part of the step (the CPU backend gathers decode and prefill apart)
    narrow = max(1, width // 2)
    assert torch.equal(bt.gather(half, narrow), built(tables[len(rows) // 2 :], narrow))


def test_random_mutations_always_gather_what_the_lists_say() -> None:
    rng = random.Random(7)
    bt = BlockTables(pad=PAD, device=torch.device("cpu"), rows=2, width=2)  # both grow
    live: list[list[int]] = [[rng.randrange(500)] for _ in range(3)]
    for _step in range(400):
        op = rng.random()
        seq = rng.choice(live)
        if op < 0.35:
            seq.extend(rng.randrange(500) for _ in range(rng.randint(1, 3)))  # decode or a prefill chunk
        elif op < 0.45 and seq:
            seq[rng.randrange(len(seq))] = rng.randrange(500)  # copy-on-write of a shared block
        elif op < 0.55:
            del seq[rng.randint(1, max(1, len(seq))) :]  # rejected draft blocks, preemption
        elif op < 0.65:
            live.append(list(seq))  # a fork (n, best_of): the child copies the parent's table
        elif op < 0.75 and len(live) > 1:
            live.remove(seq)  # ended: its list may be freed and its id reused by the next new list
        elif op < 0.85 and len(live) < 40:
            live.append([rng.randrange(500) for _ in range(rng.randint(1, 8))])
        step = rng.sample(live, rng.randint(1, len(live)))
        step += [step[0]] * rng.randint(0, 2)  # a speculative step lists a sequence once per draft row
        if all(step_table for step_table in step):
            check(bt, step)


def test_a_decode_step_writes_only_the_blocks_it_added() -> None:
    bt = BlockTables(pad=PAD, device=torch.device("cpu"))
    tables = [list(range(i * 512, (i + 1) * 512)) for i in range(128)]  # batch 128, 8k tokens each
    bt.rows(tables)
    assert bt.cells_written == 128 * 512
    for t in tables[:8]:
        t.append(len(t) + 100_000)  # 8 sequences crossed a block boundary this step
    check(bt, tables)
    assert bt.cells_written == 128 * 512 + 8
    bt.rows(tables)  # nothing changed: nothing written
    assert bt.cells_written == 128 * 512 + 8


def test_a_sequence_that_left_the_batch_gives_its_row_to_a_new_one() -> None:
    bt = BlockTables(pad=PAD, device=torch.device("cpu"), rows=2)
    a, b, c = [1, 2, 3], [4, 5], [6]
    bt.rows([a, b])
    check(bt, [c, a])  # b left: its row is c's now, its stale blocks padded
    assert bt.table.shape[0] == 2
    check(bt, [a, b, c])  # three at once: the table grows
    assert bt.table.shape[0] == 4
