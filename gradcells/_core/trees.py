"""Nested results as trees: the one flatten, unflatten and map of gradcells (the interop
layer, the dask routing, the PyTorch and JAX adapters, the oracle and the test helpers all
walk their nested arguments and results with these).

A **node** is a tuple, a list, a dict or a NamedTuple (a result that records its
``settings`` included); anything else is a **leaf**: an array, None, a number, a string, an
object. A node's children are keyed by field name (a NamedTuple), index (a tuple or a list)
or key (a dict); a leaf's **path** is the keys from the root, which ``label`` spells as the
messages do: ``("seq", "h")`` is ``seq.h``, ``("weights", 1, "layer_norm", "gamma_x")`` is
``weights[1].layer_norm.gamma_x``.

Rebuilding a node keeps its type: a NamedTuple by its fields, with the settings record a
result carries (``gradcells._core.types.record_settings``) unless told otherwise; a tuple or
a list as one (a subclass that is no NamedTuple, such as ``gc.layouts.ConvertedStack``, as
its base type, which takes its items); a dict as a dict, its keys in order.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any

from .types import record_settings

Path = tuple[Hashable, ...]
"""The keys from the root to a node or leaf: field names, indices, dict keys."""

IsLeaf = Callable[[Any], bool]


def is_node(value: Any) -> bool:
    """Whether ``value`` is a node (a tuple, a list, a dict, a NamedTuple)."""
    return isinstance(value, (tuple, list, dict))


def is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def children(node: Any) -> list[tuple[Hashable, Any]]:
    """``(key, child)`` for each child of ``node``, in order."""
    if isinstance(node, dict):
        return list(node.items())
    if is_namedtuple(node):
        return list(zip(node._fields, node, strict=True))
    return list(enumerate(node))


def rebuilt(node: Any, values: Iterable[Any], *, settings: bool = True) -> Any:
    """A node of ``node``'s type holding ``values`` (one per child, in order); a
    NamedTuple keeps ``node``'s recorded settings unless ``settings`` is False."""
    if isinstance(node, dict):
        return dict(zip(node, values, strict=True))
    if is_namedtuple(node):
        out = type(node)(*values)
        recorded = getattr(node, "settings", None) if settings else None
        return out if recorded is None else record_settings(out, recorded)
    kind = type(node) if type(node) in (tuple, list) else (
        list if isinstance(node, list) else tuple)
    return kind(values)


def _stops(value: Any, is_leaf: IsLeaf | None) -> bool:
    return not is_node(value) or (is_leaf is not None and is_leaf(value))


def map_leaves(function: Callable[[Any], Any], tree: Any, *,
               is_leaf: IsLeaf | None = None) -> Any:
    """``tree`` with each leaf replaced by ``function(leaf)``; ``is_leaf`` marks nodes to
    treat as leaves (passed to ``function`` whole)."""
    if _stops(tree, is_leaf):
        return function(tree)
    return rebuilt(tree, [map_leaves(function, child, is_leaf=is_leaf)
                          for _, child in children(tree)])


def map_with_path(function: Callable[[Any, Path], Any], tree: Any, path: Path = (), *,
                  is_leaf: IsLeaf | None = None) -> Any:
    """As ``map_leaves``, ``function`` called as ``function(leaf, path)``, the paths
    starting with ``path``."""
    if _stops(tree, is_leaf):
        return function(tree, path)
    return rebuilt(tree, [map_with_path(function, child, (*path, key), is_leaf=is_leaf)
                          for key, child in children(tree)])


def leaves_with_path(tree: Any, path: Path = (), *,
                     is_leaf: IsLeaf | None = None) -> Iterator[tuple[Path, Any]]:
    """``(path, leaf)`` for each leaf of ``tree``, in order."""
    if _stops(tree, is_leaf):
        yield path, tree
        return
    for key, child in children(tree):
        yield from leaves_with_path(child, (*path, key), is_leaf=is_leaf)


def leaves(tree: Any, *, is_leaf: IsLeaf | None = None) -> list[Any]:
    """Every leaf of ``tree``, in order (None leaves included)."""
    return [leaf for _, leaf in leaves_with_path(tree, is_leaf=is_leaf)]


def label(path: Path) -> str:
    """A path as the messages spell it: ``seq.h``, ``weights[1].w``, ``[0]``."""
    text = ""
    for k, key in enumerate(path):
        text += f"[{key}]" if isinstance(key, int) else f".{key}" if k else str(key)
    return text


def named_leaves(tree: Any, prefix: Path = ()) -> Iterator[tuple[str, Any]]:
    """``(label, leaf)`` for each leaf of ``tree``, the paths starting with ``prefix``."""
    for path, leaf in leaves_with_path(tree, prefix):
        yield label(path), leaf


def at(tree: Any, path: Path) -> Any:
    """The node or leaf of ``tree`` at ``path``."""
    for key in path:
        tree = getattr(tree, key) if is_namedtuple(tree) and isinstance(key, str) else tree[key]
    return tree


class TreeDef:
    """A tree's structure without its leaves (what ``flatten`` returns and ``unflatten``
    fills): a plain object, so that a framework's own tree handling (``torch.func``'s
    pytrees) passes it through as it is."""

    __slots__ = ("skeleton",)

    def __init__(self, tree: Any):
        self.skeleton = map_leaves(lambda _: None, tree)

    def __repr__(self) -> str:
        return f"TreeDef({self.skeleton!r})"


def flatten(tree: Any) -> tuple[list[Any], TreeDef]:
    """``(leaves, treedef)``: ``unflatten(treedef, leaves)`` is ``tree`` again."""
    return leaves(tree), TreeDef(tree)


def unflatten(treedef: TreeDef, values: Iterable[Any]) -> Any:
    """The tree of ``treedef`` holding ``values`` as its leaves, in order."""
    items = iter(values)
    tree = map_leaves(lambda _: next(items), treedef.skeleton)
    if next(items, _END) is not _END:
        raise ValueError("unflatten: more values than the tree has leaves")
    return tree


_END = object()


def leaves_like(like: Any, tree: Any) -> list[Any]:
    """``tree``'s leaves in the order of ``like`` (a tree or a ``TreeDef`` of the same
    structure); a None where ``like`` has a subtree gives None for each of its leaves."""
    like = like.skeleton if isinstance(like, TreeDef) else like
    if not is_node(like):
        return [tree]
    nodes = children(like)
    items = [None] * len(nodes) if tree is None else [child for _, child in children(tree)]
    return [leaf for (_, node), item in zip(nodes, items, strict=True)
            for leaf in leaves_like(node, item)]
