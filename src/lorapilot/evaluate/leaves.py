"""Nested extraction targets compared leaf by leaf (pure, no I/O).

A target such as `{"intent": "book", "slots": {"city": "Oslo"}, "line_items": [{...}]}` is
scored the way slot filling and invoice extraction are scored elsewhere: as (path, value)
leaves, after the spec's normalisation. Paths name where a leaf sits: `slots.city` (map
keys become path segments), `entities[]` (a list of scalars), `line_items[].amount` (a
field of the objects of a list). Lists of scalars are multisets (a duplicated item is one
extra prediction), or sequences when the spec says `ordered`; lists of objects are aligned
by the best one-to-one matching (most leaves in common) before their leaves are compared.

`compare` returns, per path, [true positives, gold leaves, predicted leaves]; summed over
examples they give micro precision/recall/F1, overall and per path. A value the spec does
not type (a list without `items`, a map without `values`, a key the object does not
declare) is one leaf compared whole.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from lorapilot.evaluate.values import canonical
from lorapilot.spec import EvalNormalize, FieldSpec, TaskSpec, ValueSpec

Counts = dict[str, list[int]]  # path -> [tp, gold, predicted]
_STRUCTURED = ("object", "map", "list")


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def root_spec(task: TaskSpec) -> ValueSpec | None:
    """The target's type: an object of task.fields, else derived from task.json_schema."""
    if task.fields:
        return ValueSpec(type="object", fields=list(task.fields))
    return from_schema(task.json_schema) if task.json_schema else None


def from_schema(schema: Any) -> ValueSpec | None:
    """A JSON schema's shape as a ValueSpec: objects with `properties`, arrays with `items`,
    objects with only `additionalProperties` as maps; None where the schema says no more."""
    if not isinstance(schema, dict):
        return None
    typ = schema.get("type")
    if isinstance(typ, list):
        typ = next((t for t in typ if t != "null"), None)
    props = schema.get("properties")
    if (typ == "object" or typ is None) and isinstance(props, dict) and props:
        required = set(schema.get("required") or [])
        fields = []
        for name, sub in props.items():
            child = from_schema(sub) or ValueSpec(type="string")
            fields.append(FieldSpec(name=name, required=name in required, **_shape_of(child)))
        return ValueSpec(type="object", fields=fields)
    if typ == "object" and isinstance(schema.get("additionalProperties"), dict):
        return ValueSpec(type="map", values=from_schema(schema["additionalProperties"]))
    if typ == "array":
        return ValueSpec(type="list", items=from_schema(schema.get("items")))
    if typ in ("string", "number", "integer", "boolean"):
        return ValueSpec(type=typ)
    return None


def _shape_of(spec: ValueSpec) -> dict:
    keys = ("type", "fields", "items", "values", "ordered", "or_list")
    return {k: getattr(spec, k) for k in keys}


def _add(out: Counts, path: str, tp: int, gold: int, pred: int) -> None:
    cell = out.setdefault(path, [0, 0, 0])
    cell[0] += tp
    cell[1] += gold
    cell[2] += pred


def compare(gold: Any, pred: Any, spec: ValueSpec | None, norm: EvalNormalize) -> Counts:
    """Leaf counts of one prediction against its gold value: path -> [tp, gold, predicted]."""
    out: Counts = {}
    _compare(gold, pred, spec, norm, "", out)
    return out


def _compare(
    gold: Any, pred: Any, spec: ValueSpec | None, norm: EvalNormalize, path: str, out: Counts
) -> None:
    kind = spec.type if spec is not None else None
    if spec is not None and spec.or_list:  # `string | list`: one value is a list of one
        g_list = gold if isinstance(gold, list) else [] if gold is None else [gold]
        p_list = pred if isinstance(pred, list) else [] if pred is None else [pred]
        _add(out, path, *_multiset(g_list, p_list, norm))
        return
    if kind == "list" and spec is not None and spec.items is None:
        kind = None  # untyped list: one leaf
    if kind not in _STRUCTURED:
        g = gold is not None
        p = pred is not None
        _add(out, path, int(g and p and canonical(gold, norm) == canonical(pred, norm)), g, p)
        return
    assert spec is not None
    want = list if kind == "list" else dict
    if gold is not None and not isinstance(gold, want):
        raise ValueError(f"gold value at {path or 'the target'} is not a {kind}")
    if pred is not None and not isinstance(pred, want):
        _compare(gold, None, spec, norm, path, out)  # every gold leaf missed
        _add(out, path, 0, 0, 1)  # and the wrong-typed value is one wrong prediction
        return
    if kind == "object":
        g_obj, p_obj = gold or {}, pred or {}
        for f in spec.fields or []:
            _compare(g_obj.get(f.name), p_obj.get(f.name), f, norm, join(path, f.name), out)
        declared = {f.name for f in spec.fields or []}
        for key, value in p_obj.items():  # keys the spec does not declare: wrong predictions
            if key not in declared and value is not None:
                _add(out, join(path, key), 0, 0, 1)
        return
    if kind == "map":
        g_map, p_map = gold or {}, pred or {}
        for key in [*g_map, *(k for k in p_map if k not in g_map)]:
            _compare(g_map.get(key), p_map.get(key), spec.values, norm, join(path, key), out)
        return
    _compare_list(gold or [], pred or [], spec, norm, path + "[]", out)


def _compare_list(
    gold: list, pred: list, spec: ValueSpec, norm: EvalNormalize, path: str, out: Counts
) -> None:
    items = spec.items
    gold = [g for g in gold if g is not None]
    pred = [p for p in pred if p is not None]
    if items is None or items.type not in _STRUCTURED:
        if spec.ordered:
            tp = sum(
                canonical(g, norm) == canonical(p, norm) for g, p in zip(gold, pred, strict=False)
            )
            _add(out, path, tp, len(gold), len(pred))
        else:  # a multiset: a duplicated item is one extra prediction
            _add(out, path, *_multiset(gold, pred, norm))
        return
    if spec.ordered:
        pairs = [(i, i) for i in range(min(len(gold), len(pred)))]
    else:
        score = [[_tp(compare(g, p, items, norm)) for p in pred] for g in gold]
        pairs = best_matching(score)
    matched_g = {i for i, _ in pairs}
    matched_p = {j for _, j in pairs}
    for i, j in pairs:
        _compare(gold[i], pred[j], items, norm, path, out)
    for i, g in enumerate(gold):
        if i not in matched_g:
            _compare(g, None, items, norm, path, out)
    for j, p in enumerate(pred):
        if j not in matched_p:
            _compare(None, p, items, norm, path, out)


def _multiset(gold: list, pred: list, norm: EvalNormalize) -> tuple[int, int, int]:
    """(true positives, gold, predicted) of two lists of scalars compared as multisets."""
    gold = [g for g in gold if g is not None]
    pred = [p for p in pred if p is not None]
    g_count = Counter(canonical(g, norm) for g in gold)
    p_count = Counter(canonical(p, norm) for p in pred)
    return sum((g_count & p_count).values()), len(gold), len(pred)


def _tp(counts: Counts) -> int:
    return sum(c[0] for c in counts.values())


def best_matching(score: list[list[int]]) -> list[tuple[int, int]]:
    """The one-to-one pairs (row, column) with the largest total score (Hungarian method,
    O(n^3)); rows or columns left over stay unmatched. Pairs of score 0 are dropped: an item
    that shares nothing with any other is simply missed (or invented)."""
    n = len(score)
    m = len(score[0]) if n else 0
    if not n or not m:
        return []
    transpose = n > m
    if transpose:
        score = [list(col) for col in zip(*score, strict=True)]
        n, m = m, n
    big = max(max(row) for row in score)
    cost = [[big - s for s in row] for row in score]  # minimise cost = maximise score
    inf = float("inf")
    u, v = [0.0] * (n + 1), [0.0] * (m + 1)
    match = [0] * (m + 1)  # match[j] = row (1-based) assigned to column j
    way = [0] * (m + 1)
    for i in range(1, n + 1):
        match[0] = i
        j0 = 0
        minv = [inf] * (m + 1)
        used = [False] * (m + 1)
        while True:
            used[j0] = True
            i0, delta, j1 = match[j0], inf, 0
            for j in range(1, m + 1):
                if not used[j]:
                    cur = cost[i0 - 1][j - 1] - u[i0] - v[j]
                    if cur < minv[j]:
                        minv[j], way[j] = cur, j0
                    if minv[j] < delta:
                        delta, j1 = minv[j], j
            for j in range(m + 1):
                if used[j]:
                    u[match[j]] += delta
                    v[j] -= delta
                else:
                    minv[j] -= delta
            j0 = j1
            if match[j0] == 0:
                break
        while j0:
            j1 = way[j0]
            match[j0] = match[j1]
            j0 = j1
    pairs = [(match[j] - 1, j - 1) for j in range(1, m + 1) if match[j]]
    if transpose:
        pairs = [(j, i) for i, j in pairs]
    return sorted((i, j) for i, j in pairs if (score[j][i] if transpose else score[i][j]) > 0)
