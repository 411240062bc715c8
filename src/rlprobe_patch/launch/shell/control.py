"""Control flow: `if`, `case` and `for` taken where their conditions resolve; where one does not, every branch is
read and the variables whose values differ between branches keep their alternatives (`fork`); `while` loops are
not evaluated."""

from __future__ import annotations

import fnmatch
import operator
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from rlprobe_patch.launch.shell.fields import MAX_LOOP, Var
from rlprobe_patch.launch.shell.grammar import command_name, first_line
from rlprobe_patch.launch.shell.state import Evaluation


class Sentinel:
    """A condition decided before `choose` reads it (a `case` pattern matched, or not, or not known)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.type = name
        self.text = name.encode()


TRUE, FALSE, UNKNOWN = Sentinel("true"), Sentinel("false"), Sentinel("unknown")


class Control(Evaluation):
    """Conditions and the branches they choose."""

    def s_if(self, node: Any) -> None:
        branches: list[tuple[Any | None, list[Any]]] = []
        condition: Any = None
        body: list[Any] = []
        for child in node.children:
            if child.type in ("if", "then", "fi", ";", "\n"):
                continue
            if child.type in ("elif_clause", "else_clause"):
                continue
            if condition is None:
                condition = child
            else:
                body.append(child)
        branches.append((condition, body))
        for clause in node.children:
            if clause.type == "elif_clause":
                parts = [c for c in clause.children if c.is_named]
                branches.append((parts[0] if parts else None, parts[1:]))
            elif clause.type == "else_clause":
                branches.append((None, [c for c in clause.children if c.is_named]))
        self.choose(node, [(c, b, first_line(c) if c is not None else "else") for c, b in branches])

    def choose(self, node: Any, branches: list[tuple[Any | None, list[Any], str]]) -> None:
        """Take the branch whose condition resolves true; when one does not resolve, read all."""
        open_branches: list[tuple[list[Any], str]] = []
        for condition, body, label in branches:
            value = True if condition is None else self.condition(condition)
            if value is False:
                continue
            if value is True and not open_branches:
                self.block(body)
                return
            open_branches.append((body, label))
            if value is True:
                break
        if not open_branches:
            return
        else_taken = len(open_branches) < len(branches) or branches[-1][0] is None
        if not else_taken:
            open_branches.append(([], "no branch"))
        self.note(node, f"condition `{first_line(node)}` not evaluated: every branch read")
        self.fork(open_branches)

    def fork(self, branches: list[tuple[list[Any], str]]) -> None:
        start_vars, start_cwd = dict(self.vars), self.cwd
        outcomes: list[dict[str, Var]] = []
        for body, label in branches:
            self.vars, self.cwd = dict(start_vars), start_cwd
            self.conditions.append(label)
            try:
                self.block(body)
            finally:
                self.conditions.pop()
            outcomes.append(self.vars)
        merged: dict[str, Var] = {}
        for name in dict.fromkeys(n for o in outcomes for n in o):
            values = [o.get(name) for o in outcomes]
            first = next(v for v in values if v is not None)
            texts = tuple(dict.fromkeys("<unset>" if v is None else v.text for v in values))
            merged[name] = first if len(texts) == 1 else replace(first, alternatives=texts)
        self.vars, self.cwd = merged, start_cwd

    def s_case(self, node: Any) -> None:
        value_node = node.child_by_field_name("value")
        subject = self.join(value_node) if value_node is not None else None
        branches: list[tuple[Any | None, list[Any], str]] = []
        for item in node.children:
            if item.type != "case_item":
                continue
            patterns = [c for c in item.children if c.type not in (")", ";;", ";&", ";;&", "|") and c.is_named]
            values = item.children_by_field_name("value")
            pattern_nodes = values or patterns[:1]
            body = [c for c in item.children if c.is_named and c not in pattern_nodes]
            label = "case " + "|".join(p.text.decode() for p in pattern_nodes)
            if subject is None or not subject.exact:
                branches.append((UNKNOWN, body, label))
                continue
            matched = any(fnmatch.fnmatchcase(subject.text, self.join(p).text) for p in pattern_nodes)
            branches.append((TRUE if matched else FALSE, body, label))
        self.choose(node, branches)

    def s_for(self, node: Any) -> None:
        variable = node.child_by_field_name("variable")
        body = node.child_by_field_name("body")
        values = node.children_by_field_name("value")
        if variable is None or body is None:
            self.note(node, "loop not evaluated")
            return
        items = [f for v in values for f in self.word(v)] if values else list(self.positional)
        if any(not f.exact for f in items) or len(items) > MAX_LOOP:
            self.note(node, "loop over values not known before the run: not evaluated")
            return
        for item in items:
            self.vars[variable.text.decode()] = Var((item,), origin=self.here(node))
            self.block(body.children)

    def s_loop(self, node: Any) -> None:
        self.note(node, f"`{first_line(node)}` loop not evaluated")

    def condition(self, node: Any) -> bool | None:
        if node is TRUE:
            return True
        if node is FALSE:
            return False
        if node is UNKNOWN:
            return None
        kind = node.type
        if kind == "test_command":
            inner = [c for c in node.children if c.is_named]
            return self.test(inner[0]) if len(inner) == 1 else None
        if kind == "list":
            parts = [c for c in node.children]
            left, op, right = parts[0], parts[1].type, parts[2]
            a = self.condition(left)
            if op == "&&":
                return False if a is False else (self.condition(right) if a else None)
            if op == "||":
                return True if a is True else (self.condition(right) if a is False else None)
            return None
        if kind == "negated_command":
            inner = [c for c in node.children if c.is_named]
            value = self.condition(inner[0]) if inner else None
            return None if value is None else not value
        if kind == "command":
            name = command_name(node)
            if name in ("true", ":"):
                return True
            if name == "false":
                return False
            if name in ("test", "["):
                return None
            return None
        return None

    def test(self, node: Any) -> bool | None:
        kind = node.type
        if kind == "parenthesized_expression":
            inner = [c for c in node.children if c.is_named]
            return self.test(inner[0]) if inner else None
        if kind == "unary_expression":
            op = node.children[0].text.decode()
            operand = [c for c in node.children if c.is_named]
            if op == "!":
                truth = self.test(operand[-1]) if operand else None
                return None if truth is None else not truth
            word = self.join(operand[-1]) if operand else None
            if word is None or not word.exact:
                return None
            if op == "-z":
                return word.text == ""
            if op == "-n":
                return word.text != ""
            tests = {"-f": Path.is_file, "-d": Path.is_dir, "-e": Path.exists, "-r": Path.exists}
            target = self.path_of(word.text)
            if op in tests and target is not None:
                return bool(tests[op](target))  # the files beside the script, as bash sees them here
            return None
        if kind == "binary_expression":
            left, op_node, right = node.children[0], node.children[1], node.children[2]
            op = op_node.text.decode()
            if op in ("&&", "-a", "||", "-o"):
                a, b = self.test(left), self.test(right)
                if op in ("&&", "-a"):
                    return False if False in (a, b) else (None if None in (a, b) else True)
                return True if True in (a, b) else (None if None in (a, b) else False)
            lhs, rhs = self.join(left), self.join(right)
            if not (lhs.exact and rhs.exact):
                return None
            if op in ("=", "=="):
                return self.matches(node, lhs.text, rhs.text)
            if op == "!=":
                return not self.matches(node, lhs.text, rhs.text)
            if op == "=~":
                try:
                    return re.search(rhs.text, lhs.text) is not None
                except re.error:
                    return None
            numeric = {"-eq": operator.eq, "-ne": operator.ne, "-lt": operator.lt, "-le": operator.le}
            numeric |= {"-gt": operator.gt, "-ge": operator.ge}
            if op in numeric:
                try:
                    return bool(numeric[op](int(lhs.text), int(rhs.text)))
                except ValueError:
                    return None
            return None
        if kind in ("word", "string", "raw_string", "simple_expansion", "expansion", "concatenation"):
            joined = self.join(node)
            return (joined.text != "") if joined.exact else None
        return None

    def matches(self, node: Any, text: str, pattern: str) -> bool:
        """`==` in `[[ ]]` matches a glob pattern; in `[ ]` it compares strings."""
        while node is not None and node.type != "test_command":
            node = node.parent
        double = node is not None and node.children[0].type == "[["
        return fnmatch.fnmatchcase(text, pattern) if double else text == pattern
