"""Words as bash expands them: quoting, word splitting, `"$@"` and arrays, `${V...}` with its defaults, slices,
pattern removal and substitution, case changes; each field keeps where it was written and the variables it read."""

from __future__ import annotations

import fnmatch
import os
import re
from typing import Any

from rlprobe_patch.launch.shell.fields import BREAK, SPLIT, Field, Seg, Var
from rlprobe_patch.launch.shell.grammar import is_at, opaque
from rlprobe_patch.launch.shell.state import Evaluation


class Words(Evaluation):
    """Expansions."""

    def words_of(self, group: list[Any]) -> list[Field]:
        """One element's fields; the grammar's split of `[0]*$N+[1]` (two nodes, one bash word) is kept
        as written and reported unresolved, never read as two words."""
        if len(group) == 1:
            return self.word(group[0])
        text = self.source[group[0].start_byte : group[-1].end_byte].decode("utf-8", "replace")
        what = f"{self.here(group[0])}: `{text[:60]}` not understood by the reader"
        self.note(group[0], f"`{text[:60]}` not understood by the reader")
        return [Field(text, self.file, self.line(group[0]), (what,))]

    def word(self, node: Any) -> list[Field]:
        """The fields a word expands to (word splitting and "${A[@]}" included)."""
        segs = self.segs(node, quoted=False)
        fields: list[Field] = []
        text: list[str] = []
        started = False
        origin: Field | None = None
        unresolved: list[str] = []
        via: list[str] = []

        def flush() -> None:
            nonlocal text, started, origin, unresolved, via
            if started:
                where = origin or Field("", self.file, self.line(node))
                fields.append(Field("".join(text), where.file, where.line, tuple(unresolved), tuple(via)))
            text, started, origin, unresolved, via = [], False, None, [], []

        for seg in segs:
            if seg is BREAK:
                flush()
                continue
            pieces = SPLIT.split(seg.text) if seg.split else [seg.text]
            for index, piece in enumerate(pieces):
                if index:
                    flush()
                if piece or not seg.split:
                    text.append(piece)
                    started = True
                    origin = origin or seg.origin
                    unresolved.extend(seg.unresolved)
                    via.extend(seg.via)
        flush()
        return fields

    def join(self, node: Any) -> Field:
        """A word read as one string, as in an assignment or `case` (no splitting)."""
        segs = [s for s in self.segs(node, quoted=True) if s is not BREAK]
        origin = next((s.origin for s in segs if s.origin), None) or Field("", self.file, self.line(node))
        return Field(
            "".join(s.text for s in segs),
            origin.file,
            origin.line,
            tuple(u for s in segs for u in s.unresolved),
            tuple(v for s in segs for v in s.via),
        )

    def segs(self, node: Any, quoted: bool) -> list[Seg]:
        kind = node.type
        if kind in ("word", "number", "extglob_pattern", "regex", "variable_name"):  # a name: `${V:-a=b}`'s `a`
            text = node.text.decode()
            if not quoted:
                text = re.sub(r"\\(.)", r"\1", text, flags=re.S)
                if text.startswith("~") and (len(text) == 1 or text[1] == "/"):
                    text = os.path.expanduser("~") + text[1:]
            return [Seg(text)]
        if kind == "string_content":
            text = node.text.decode().replace("\\\n", "")  # a continued line inside "..."
            return [Seg(re.sub(r"\\([$`\"\\])", r"\1", text))]
        if kind == "raw_string":
            return [Seg(node.text.decode()[1:-1])]
        if kind == "ansi_c_string":
            body = node.text.decode()[2:-1]
            try:
                return [Seg(body.encode("latin-1", "backslashreplace").decode("unicode_escape"))]
            except UnicodeDecodeError:
                return [Seg(body)]
        if kind == "string":
            inner = [c for c in node.children if c.is_named]
            if len(inner) == 1 and is_at(inner[0]):
                return self.segs(inner[0], quoted=True)
            out: list[Seg] = [Seg("")]
            for child in inner:
                out.extend(self.segs(child, quoted=True))
            return out
        if kind == "concatenation":
            return [s for c in node.children for s in self.segs(c, quoted)]
        if kind in ("simple_expansion", "expansion"):
            return self.expansion(node, quoted)
        if kind == "command_substitution":
            return [self.substitution(node)]
        if kind == "arithmetic_expansion":
            return [self.arithmetic(node)]
        if kind == "array":
            return [s for c in node.children if c.is_named for s in ([*self.segs(c, quoted), BREAK])]
        text = node.text.decode()
        return [Seg(opaque(text), unresolved=(f"{self.here(node)}: `{text[:60]}` not evaluated",))]

    def lookup(self, name: str) -> Var | None:
        if name.isdigit():
            index = int(name)
            if index == 0:
                return Var((Field(str(self.script), self.script, 0),))
            if index <= len(self.positional):
                return Var((self.positional[index - 1],))
            return None
        if name in ("@", "*"):
            return Var(tuple(self.positional), array=True)
        if name == "#":
            return Var((Field(str(len(self.positional)), self.file, 0),))
        if name == "BASH_SOURCE" and name not in self.vars:  # the file being read, then the ones sourcing it
            return Var(tuple(Field(str(p), p, 0) for p in reversed(self.stack)), array=True)
        return self.vars.get(name)

    def expansion(self, node: Any, quoted: bool) -> list[Seg]:
        children = [c for c in node.children if c.type not in ("$", "${", "}")]
        if not children:
            return [Seg("$")]
        length = children[0].type == "#" and len(children) > 1
        if length:
            children = children[1:]
        head = children[0]
        if head.type == "!":
            return [Seg(node.text.decode(), unresolved=(f"{self.here(node)}: indirect `{node.text.decode()}`",))]
        index: str | None = None
        if head.type == "subscript":
            name_node = head.child_by_field_name("name")
            index_node = head.child_by_field_name("index")
            name = name_node.text.decode() if name_node else ""
            index = self.join(index_node).text if index_node is not None else None
        else:
            name = head.text.decode()
        var = self.lookup(name)
        rest = children[1:]
        op = rest[0].text.decode() if rest and not rest[0].is_named else None
        operand = rest[1:] if op is not None else rest
        via = (f"{name} ({var.origin})",) if var is not None and var.origin else ()
        unresolved: tuple[str, ...] = ()
        if var is not None and var.alternatives:
            unresolved = (f"{self.here(node)}: ${name} differs between branches ({' | '.join(var.alternatives)})",)
        if var is not None and any(not f.exact for f in var.items):
            unresolved += tuple(u for f in var.items for u in f.unresolved)

        items: list[Field]
        if var is None:
            items = []
        elif index is None or (index == "0" and not var.array):
            items = list(var.items[:1]) if var.array and name not in ("@", "*") else list(var.items)
        elif index in ("@", "*"):
            items = list(var.items)
        elif index.isdigit():
            items = [var.items[int(index)]] if int(index) < len(var.items) else []
        else:
            items = []
        is_set = var is not None and (not var.array or bool(items) or index is not None)
        value = " ".join(f.text for f in items)
        if length:
            return [Seg(str(len(items) if index in ("@", "*") else len(value)), via=via)]
        at = (index in ("@", "*") or name in ("@", "*")) and (index == "@" or name == "@" or not quoted)

        if op in (":-", "-", ":=", "=", ":?", "?", ":+", "+"):
            empty = not value if op.startswith(":") else not is_set
            if op in (":+", "+"):
                return self.operand(operand, quoted, via) if not empty else [Seg("", via=via)]
            if empty:
                if op in (":=", "="):
                    default = self.operand_field(operand)
                    self.vars[name] = Var((default,), origin=self.here(node))
                return self.operand(operand, quoted, via)
            op = None
        if op in ("%", "%%", "#", "##", "/", "//", "/#", "/%", ",", ",,", "^", "^^"):
            value = self.transform(op, value, operand)
            return [Seg(value, split=not quoted, unresolved=unresolved, via=via)]
        if op == ":":  # ${V:offset:length}, ${@:offset:length}, ${A[@]:offset:length}
            bounds = self.slice_bounds(operand)
            if bounds is not None:
                if at or (var is not None and var.array and index in ("@", "*")) or name in ("@", "*"):
                    if name in ("@", "*"):  # positional slices count $0 as the first: ${@:2} starts at $2
                        zero = self.lookup("0")
                        items = sliced(list(zero.items[:1] if zero is not None else ()) + items, *bounds)
                    else:
                        items = sliced(items, *bounds)
                    value = " ".join(f.text for f in items)
                else:
                    value = "".join(sliced(list(value), *bounds))
                    return [Seg(value, split=not quoted, unresolved=unresolved, via=via)]
                op = None
        if op is not None:
            return [Seg(node.text.decode(), unresolved=(f"{self.here(node)}: `{node.text.decode()}` not evaluated",))]
        if at and len(items) != 1:
            out: list[Seg] = []
            for i, item in enumerate(items):
                if i:
                    out.append(BREAK)
                out.append(
                    Seg(item.text, split=not quoted, origin=item, unresolved=item.unresolved, via=item.via + via)
                )
            return out
        whole_word = node.parent is not None and node.parent.type not in ("concatenation", "string")
        origin = items[0] if len(items) == 1 and var is not None and (var.array or whole_word) else None
        return [Seg(value, split=not quoted, origin=origin, unresolved=unresolved, via=via)]

    def slice_bounds(self, nodes: list[Any]) -> tuple[int, int | None] | None:
        """The offset and length of a `${V:offset:length}` slice, when both are plain numbers."""
        texts = [self.join(n).text.strip() for n in nodes if n.is_named]
        try:
            numbers = [int(text) for text in texts]
        except ValueError:
            return None
        if not 1 <= len(numbers) <= 2:
            return None
        return numbers[0], numbers[1] if len(numbers) == 2 else None

    def operand(self, nodes: list[Any], quoted: bool, via: tuple[str, ...]) -> list[Seg]:
        out: list[Seg] = []
        for child in nodes:
            out.extend(self.segs(child, quoted))
        return out or [Seg("", via=via)]

    def operand_field(self, nodes: list[Any]) -> Field:
        segs = [s for c in nodes for s in self.segs(c, True) if s is not BREAK]
        line = self.line(nodes[0]) if nodes else 0
        return Field("".join(s.text for s in segs), self.file, line, tuple(u for s in segs for u in s.unresolved))

    def transform(self, op: str, value: str, operand: list[Any]) -> str:
        if op in (",", ",,"):
            return value.lower() if op == ",," else value[:1].lower() + value[1:]
        if op in ("^", "^^"):
            return value.upper() if op == "^^" else value[:1].upper() + value[1:]
        texts = [self.join(o).text for o in operand if o.is_named]
        pattern = texts[0] if texts else ""
        if op in ("%", "%%"):
            cuts = [i for i in range(len(value), -1, -1) if fnmatch.fnmatchcase(value[i:], pattern)]
            if not cuts:
                return value
            return value[: (min(cuts) if op == "%%" else max(cuts))]
        if op in ("#", "##"):
            cuts = [i for i in range(len(value) + 1) if fnmatch.fnmatchcase(value[:i], pattern)]
            if not cuts:
                return value
            return value[(max(cuts) if op == "##" else min(cuts)) :]
        replacement = texts[1] if len(texts) > 1 else ""
        regex = fnmatch.translate(pattern).removesuffix(r"\Z").removeprefix("(?s:").removesuffix(")")
        try:
            if op == "/#":
                return re.sub("^(?:" + regex + ")", replacement, value, count=1)
            if op == "/%":
                return re.sub("(?:" + regex + ")$", replacement, value, count=1)
            return re.sub(regex, lambda _: replacement, value, count=0 if op == "//" else 1)
        except re.error:
            return value


def sliced(items: list[Any], offset: int, length: int | None) -> list[Any]:
    """bash's `${X:offset:length}` on a list: a negative offset counts from the end, a negative length
    is an end counted from the end."""
    start = max(len(items) + offset, 0) if offset < 0 else offset
    if length is None:
        return items[start:]
    end = len(items) + length if length < 0 else start + length
    return items[start:end]
