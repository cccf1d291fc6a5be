"""v1 compatibility: a schema may only grow within v1. Compares each event's schema with its
committed baseline and names every change that would break a v1 consumer or producer."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_TYPE_OF_PY = (
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
)
_LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
_UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")
_EXACT_CONSTRAINTS = ("pattern", "format", "multipleOf")
_DIFF_LINES = 20


def catalogue_breaking_changes(
    baselines: Mapping[str, Mapping[str, Any]], current: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Breaking changes across the catalogue: per-event schema breaks, and events that vanished."""
    problems = []
    for event in sorted(baselines):
        if event not in current:
            problems.append(f"{event}: event removed from the catalogue (it is in the v1 baseline)")
            continue
        problems.extend(breaking_changes(dict(baselines[event]), dict(current[event]), event=event))
    return problems


def breaking_changes(baseline: dict[str, Any], current: dict[str, Any], *, event: str) -> list[str]:
    """What in `current` breaks v1 consumers or producers coded against `baseline`, by JSON path.

    Breaking: a property removed (a rename is a removal), a new required property, a property
    that became required, a changed type (either way: a typed consumer decodes to the declared
    type, so a union gaining a member breaks it as surely as one losing a member), an enum or
    const value removed, a tightened constraint, additional properties forbidden, a changed
    subject. Not breaking: a new optional property, a new enum value, a description or default
    change, a loosened or removed constraint.
    """
    problems: list[str] = []
    subject_before, subject_now = baseline.get("x-subject"), current.get("x-subject")
    if subject_before is not None and subject_before != subject_now:
        problems.append(f"{event}: $: subject changed from {subject_before} to {subject_now}")
    _Comparison(baseline, current, event, problems).compare(baseline, current, "$")
    return problems


@dataclass(frozen=True)
class _Variant:
    node: dict[str, Any]
    ref: str | None


@dataclass
class _Comparison:
    base_root: dict[str, Any]
    cur_root: dict[str, Any]
    event: str
    problems: list[str]
    _active: set[tuple[str, str]] = field(default_factory=set)

    def _report(self, path: str, what: str) -> None:
        self.problems.append(f"{self.event}: {path}: {what}")

    def compare(self, base: Mapping[str, Any], cur: Mapping[str, Any], path: str) -> None:
        bvars = _variants(base, self.base_root)
        cvars = _variants(cur, self.cur_root)
        btypes, ctypes = _type_set(bvars), _type_set(cvars)
        if btypes != ctypes:
            self._report(path, f"type changed from {_show_types(btypes)} to {_show_types(ctypes)}")
        self._compare_values(bvars, cvars, path)
        for json_type in sorted(btypes & ctypes):
            bsame = [v for v in bvars if json_type in _types(v.node)]
            csame = [v for v in cvars if json_type in _types(v.node)]
            if json_type == "object":
                self._compare_objects(bsame, csame, path)
            elif len(bsame) == 1 and len(csame) == 1:
                self._compare_constraints(bsame[0].node, csame[0].node, path)
                if json_type == "array":
                    self._compare_array(bsame[0].node, csame[0].node, path)

    def _compare_values(self, bvars: list[_Variant], cvars: list[_Variant], path: str) -> None:
        cur_values: set[str] = set()
        open_types: set[str] = set()
        for v in cvars:
            values = _enumerated(v.node)
            if values is None:
                open_types |= _types(v.node)
            else:
                cur_values |= {_canonical(x) for x in values}
        if "number" in open_types:
            open_types.add("integer")
        for v in bvars:
            for value in _enumerated(v.node) or ():
                if _canonical(value) in cur_values or "any" in open_types or _json_type(value) in open_types:
                    continue
                self._report(path, f"enum value {_canonical(value)} removed")

    def _compare_objects(self, bvars: list[_Variant], cvars: list[_Variant], path: str) -> None:
        if len(bvars) == 1 and len(cvars) == 1:
            self._compare_object(bvars[0], cvars[0], path)
            return
        by_title = {v.node.get("title"): v for v in cvars}
        for b in bvars:
            match = by_title.get(b.node.get("title"))
            if match is None:
                self._report(path, f"union member {b.node.get('title', '(untitled object)')} removed")
            else:
                self._compare_object(b, match, path)

    def _compare_object(self, b: _Variant, c: _Variant, path: str) -> None:
        key = (b.ref or "", c.ref or "")
        if b.ref and c.ref:
            if key in self._active:
                return
            self._active.add(key)
        try:
            self._compare_object_body(b.node, c.node, path)
        finally:
            self._active.discard(key)

    def _compare_object_body(self, b: Mapping[str, Any], c: Mapping[str, Any], path: str) -> None:
        bprops: Mapping[str, Any] = b.get("properties", {})
        cprops: Mapping[str, Any] = c.get("properties", {})
        for name, schema in bprops.items():
            if name not in cprops:
                self._report(f"{path}.{name}", "property removed")
            else:
                self.compare(schema, cprops[name], f"{path}.{name}")
        before = set(b.get("required", ()))
        for name in c.get("required", ()):
            if name in before:
                continue
            if name in bprops:
                self._report(f"{path}.{name}", "property became required")
            else:
                self._report(f"{path}.{name}", "new required property")
        bextra, cextra = b.get("additionalProperties", True), c.get("additionalProperties", True)
        if cextra is False and bextra is not False:
            self._report(path, "additional properties no longer allowed")
        elif isinstance(bextra, Mapping) and isinstance(cextra, Mapping):
            self.compare(bextra, cextra, f"{path}.*")
        self._compare_constraints(b, c, path)

    def _compare_array(self, b: Mapping[str, Any], c: Mapping[str, Any], path: str) -> None:
        bitems, citems = b.get("items"), c.get("items")
        if isinstance(bitems, Mapping) and isinstance(citems, Mapping):
            self.compare(bitems, citems, f"{path}[]")
        for i, (bi, ci) in enumerate(zip(b.get("prefixItems", ()), c.get("prefixItems", ()), strict=False)):
            self.compare(bi, ci, f"{path}[{i}]")

    def _compare_constraints(self, b: Mapping[str, Any], c: Mapping[str, Any], path: str) -> None:
        for key in _LOWER_BOUNDS:
            if key in c and (key not in b or c[key] > b[key]):
                self._report(path, f"constraint tightened: {key} {b.get(key, '(none)')} -> {c[key]}")
        for key in _UPPER_BOUNDS:
            if key in c and (key not in b or c[key] < b[key]):
                self._report(path, f"constraint tightened: {key} {b.get(key, '(none)')} -> {c[key]}")
        for key in _EXACT_CONSTRAINTS:
            if key in c and b.get(key) != c[key]:
                self._report(path, f"constraint tightened: {key} {b.get(key, '(none)')!s} -> {c[key]}")
        if c.get("uniqueItems") and not b.get("uniqueItems"):
            self._report(path, "constraint tightened: uniqueItems")


def _pointer(root: Mapping[str, Any], ref: str) -> dict[str, Any]:
    if not ref.startswith("#"):
        raise ValueError(f"only local $refs are supported, not {ref!r}")
    node: Any = root
    for token in ref.removeprefix("#").strip("/").split("/"):
        if token:
            node = node[token.replace("~1", "/").replace("~0", "~")]
    return node


def _resolve(node: Mapping[str, Any], root: Mapping[str, Any]) -> _Variant:
    """Follow $ref (and single-member allOf) chains; sibling keywords of a $ref win."""
    resolved: dict[str, Any] = dict(node)
    last_ref = None
    for _ in range(64):
        if isinstance(resolved.get("$ref"), str):
            last_ref = resolved.pop("$ref")
            resolved = {**_pointer(root, last_ref), **resolved}
        elif isinstance(resolved.get("allOf"), list) and len(resolved["allOf"]) == 1:
            (only,) = resolved.pop("allOf")
            resolved = {**only, **resolved}
        else:
            return _Variant(resolved, last_ref)
    raise ValueError(f"$ref chain too long at {last_ref}")


def _variants(node: Mapping[str, Any], root: Mapping[str, Any]) -> list[_Variant]:
    """The alternatives a node allows: anyOf/oneOf flattened, every $ref resolved."""
    resolved = _resolve(node, root)
    for key in ("anyOf", "oneOf"):
        if isinstance(resolved.node.get(key), list):
            return [v for member in resolved.node[key] for v in _variants(member, root)]
    return [resolved]


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    for py_type, name in _TYPE_OF_PY:
        if isinstance(value, py_type):
            return name
    return "any"


def _enumerated(node: Mapping[str, Any]) -> list[Any] | None:
    if "const" in node:
        return [node["const"]]
    if isinstance(node.get("enum"), list):
        return list(node["enum"])
    return None


def _types(node: Mapping[str, Any]) -> set[str]:
    declared = node.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return set(declared)
    values = _enumerated(node)
    if values is not None:
        return {_json_type(v) for v in values}
    if "properties" in node or "additionalProperties" in node:
        return {"object"}
    if "items" in node or "prefixItems" in node:
        return {"array"}
    return {"any"}


def _type_set(variants: Sequence[_Variant]) -> set[str]:
    return {t for v in variants for t in _types(v.node)}


def _show_types(types: set[str]) -> str:
    return " | ".join(sorted(types))


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
