"""Statements: assignments and declarations, `a && b` / `a || b`, pipelines, redirections, subshells, functions
defined; each node type to the method that evaluates it (`STATEMENTS`: control flow in control.py, commands in
commands.py)."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from rlprobe_patch.launch.shell.fields import Field, Probe, Var
from rlprobe_patch.launch.shell.grammar import command_name, first_line, glued
from rlprobe_patch.launch.shell.state import Evaluation
from rlprobe_patch.launch.shell.substitutions import PROBE_VIA

# node type -> the method that evaluates it (`command`: commands.py)
STATEMENTS: dict[str, str] = {
    "program": "s_program",
    "variable_assignment": "s_assignment",
    "variable_assignments": "s_variables",
    "declaration_command": "s_declaration",
    "unset_command": "s_unset",
    "command": "s_command",
    "list": "s_list",
    "pipeline": "s_pipeline",
    "redirected_statement": "s_redirected",
    "subshell": "s_subshell",
    "compound_statement": "s_compound",
    "function_definition": "s_function",
    "negated_command": "s_negated",
    "test_command": "s_test",
    "if_statement": "s_if",
    "case_statement": "s_case",
    "for_statement": "s_for",
    "c_style_for_statement": "s_loop",
    "while_statement": "s_loop",
}


class Statements(Evaluation):
    """Statements."""

    def block(self, nodes: Any) -> None:
        for node in nodes:
            if node.is_named:
                self.statement(node)

    def statement(self, node: Any) -> None:
        kind = node.type
        handler = STATEMENTS.get(kind)
        if handler is not None:
            getattr(self, handler)(node)
        elif kind in ("comment", "heredoc_body", "heredoc_start"):
            return
        else:
            self.note(node, f"`{first_line(node)}` ({kind}) not evaluated")

    def s_program(self, node: Any) -> None:
        self.block(node.children)

    def s_assignment(self, node: Any, *, exported: bool = False, local: bool = False) -> None:
        name_node = node.child_by_field_name("name")
        value_node = node.child_by_field_name("value")
        if name_node is None:
            return
        name = name_node.text.decode()
        if name_node.type == "subscript":  # A[i]=v: the array as a whole is no longer known exactly
            self.note(node, f"element assignment {name} not evaluated")
            return
        append = any(c.type == "+=" for c in node.children)
        if value_node is None:
            items: tuple[Field, ...] = (Field("", self.file, self.line(node)),)
            array = False
        elif value_node.type == "array":
            items = tuple(f for group in glued(value_node.children) for f in self.words_of(group))
            array = True
        else:
            items = (self.join(value_node),)
            array = False
        old = self.vars.get(name)
        if append and old is not None:
            if array or old.array:
                items = old.items + items
                array = True
            else:
                f = items[0]
                items = (replace(f, text=old.text + f.text, unresolved=old.items[0].unresolved + f.unresolved),)
        if local and self.locals and name not in self.locals[-1]:
            self.locals[-1][name] = old
        self.vars[name] = Var(
            items, array=array, exported=exported or bool(old and old.exported), origin=self.here(node)
        )
        if not array and any(v.startswith(PROBE_VIA) for f in items for v in f.via):
            text = value_node.text.decode() if value_node is not None else ""
            keeps = bool(re.match(rf"[\"']?\$\{{{re.escape(name)}:?[-=]", text))  # ${NAME:-...}: an exported value wins
            self.reading.probed[name] = Probe(items[0].text, self.here(node), keeps, self._line_end(node))

    def _line_end(self, node: Any) -> int | None:
        """The end of the line of an assignment statement that has the line to itself, in the script
        itself (not a sourced file); None otherwise."""
        statement = node.parent if node.parent is not None and node.parent.type == "declaration_command" else node
        if self.file != self.reading.path:
            return None
        start = self.source.rfind(b"\n", 0, statement.start_byte) + 1
        end = self.source.find(b"\n", statement.end_byte)
        end = len(self.source) if end < 0 else end
        before, after = self.source[start : statement.start_byte], self.source[statement.end_byte : end]
        if before.strip() or (after.strip() and not after.strip().startswith(b"#")) or after.rstrip().endswith(b"\\"):
            return None
        return end

    def s_declaration(self, node: Any) -> None:
        keyword = node.children[0].type
        flags = "".join(c.text.decode()[1:] for c in node.children if c.type == "word" and c.text.startswith(b"-"))
        exported = keyword == "export" or "x" in flags
        local = keyword in ("local", "declare", "typeset") and bool(self.call_stack) and "g" not in flags
        for child in node.children[1:]:
            if child.type == "variable_assignment":
                self.s_assignment(child, exported=exported, local=local)
            elif child.type == "variable_name" and exported:
                name = child.text.decode()
                old = self.vars.get(name)
                if old is not None:
                    self.vars[name] = replace(old, exported=True)

    def s_variables(self, node: Any) -> None:  # `A=1 B=2` on one line
        for child in node.children:
            if child.type == "variable_assignment":
                self.s_assignment(child)

    def s_unset(self, node: Any) -> None:
        for child in node.children[1:]:
            self.vars.pop(child.text.decode(), None)

    def s_list(self, node: Any) -> None:
        """`a && b`, `a || b`: `b` runs when `a` is known to let it; otherwise it is read as conditional."""
        left, op, right = node.children[0], node.children[1].type, node.children[2]
        value = self.condition(left) if left.type in ("test_command", "negated_command", "list") else None
        if value is None:
            self.statement(left)
            if left.type not in ("test_command", "negated_command", "list"):
                value = True  # a command is taken to succeed: `cd dir && python3 ...`, `cmd || exit 1`
        if value is (op == "&&"):
            self.statement(right)
        elif value is None:
            self.conditions.append(f"after `{first_line(left)}`")
            try:
                self.statement(right)
            finally:
                self.conditions.pop()

    def s_pipeline(self, node: Any) -> None:
        for child in node.children:
            if child.is_named:
                self.statement(child)

    def s_redirected(self, node: Any) -> None:
        body = node.child_by_field_name("body")
        if any(c.type == "heredoc_redirect" for c in node.children):
            if body is not None and body.type == "command" and command_name(body) == "cat":
                self.note(node, "here-document not evaluated")
                return
            self.note(node, "here-document input not evaluated")
        if body is not None:
            self.statement(body)

    def s_subshell(self, node: Any) -> None:
        saved = (dict(self.vars), self.cwd)
        self.block(node.children)
        self.vars, self.cwd = saved

    def s_compound(self, node: Any) -> None:
        self.block(node.children)

    def s_function(self, node: Any) -> None:
        name = node.child_by_field_name("name")
        body = node.child_by_field_name("body")
        if name is not None and body is not None:
            self.functions[name.text.decode()] = (body, self.file)

    def s_negated(self, node: Any) -> None:
        self.block(node.children)

    def s_test(self, node: Any) -> None:
        return  # a bare `[ ... ]` changes nothing
