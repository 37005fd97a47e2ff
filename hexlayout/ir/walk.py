"""The one walker of the tile IR: every op of a block or kernel in pre-order.

``walk(root)`` yields each op, then (depth first) the ops of its nested blocks
(``Op.blocks()``: a ``For`` body, an ``If``'s then and else branches), in program order.
``walk_with_context(root)`` yields the same ops as ``Visit`` records that also carry the
enclosing ops (``parents``, outermost first), the enclosing loops (``loops``), the block
that holds the op and its position there, for passes that need loop depth or the branch
an op runs in. ``root`` is a ``Block``, a ``TileKernel`` (its body) or a single ``Op``
(the op itself, then its nested ops).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .tile import Block, For, Op, TileKernel

__all__ = ["Visit", "walk", "walk_with_context"]


@dataclass(frozen=True)
class Visit:
    """One op with its place in the program."""

    op: Op
    parents: tuple[Op, ...]     # the enclosing ops with blocks (For / If), outermost first
    block: Block                # the block holding ``op``
    index: int                  # ``block.ops[index] is op``

    @property
    def loops(self) -> tuple[For, ...]:
        """The enclosing ``For`` loops, outermost first."""
        return tuple(p for p in self.parents if isinstance(p, For))

    @property
    def loop_depth(self) -> int:
        """How many ``For`` loops enclose the op."""
        return sum(1 for p in self.parents if isinstance(p, For))


def _root_block(root: Block | TileKernel | Op) -> Block:
    if isinstance(root, TileKernel):
        return root.body
    if isinstance(root, Block):
        return root
    return Block([root])


def walk(root: Block | TileKernel | Op) -> Iterator[Op]:
    """Every op under ``root`` in pre-order (an op before the ops of its nested blocks)."""
    return _root_block(root).walk()


def walk_with_context(root: Block | TileKernel | Op) -> Iterator[Visit]:
    """``walk(root)`` as ``Visit`` records (enclosing ops, block and index of each op)."""

    def visit(block: Block, parents: tuple[Op, ...]) -> Iterator[Visit]:
        for i, op in enumerate(block.ops):
            yield Visit(op, parents, block, i)
            if op.BLOCKS:
                inner = parents + (op,)
                for b in op.blocks():
                    yield from visit(b, inner)

    yield from visit(_root_block(root), ())
