"""One site's state: the function plan, verify and status all decide a patch's sites with.

A site is one file a patch edits (`catalogue.patches.Site`). Its state (applied / applicable / drifted)
is decided from the syntax tree of the file as a `Workspace` holds it: the tree's bytes, or
what a plan has made of them in memory so far (an earlier patch of the plan, or an upgrade's
reverted record).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from rlprobe_patch.base.errors import RefusedError
from rlprobe_patch.base.fsio import file_mode, read_or_none
from rlprobe_patch.catalogue.patches import Patch, Site
from rlprobe_patch.catalogue.trees import Tree
from rlprobe_patch.codemod import CreateFile, Partial, Scope, State, reduce
from rlprobe_patch.record.folder import checked_key


def parse_target(
    tree: Tree, rel: str, data: bytes | None = None, scope: Scope | None = None
) -> tuple[bytes, cst.Module, Partial | None]:
    """The bytes (read from the tree unless given) and syntax tree of a file a patch edits: with
    `scope`, of only what it names where the file allows it (`partial`: the syntax tree is then
    of `Partial.text`, and `Partial.splice` makes its code the whole file's).

    Refused: a file reached through a symbolic link, missing, not UTF-8 or not Python."""
    path = tree.root / rel
    if data is None:
        if path.is_symlink() or any(p.is_symlink() for p in path.parents if tree.root in p.parents):
            raise RefusedError(
                f"{path}: is reached through a symbolic link; refusing to write through it",
                hint="patch the real tree the link points to (pass its path as the root)",
            )
        if not path.is_file():
            raise RefusedError(f"{path}: missing", hint=f"{tree.package} {tree.version} does not have this file")
        data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RefusedError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    partial = reduce(data, scope) if scope is not None else None
    if partial is not None:
        try:
            module = cst.parse_module(partial.text)
        except cst.ParserSyntaxError:
            module = None  # the whole-file parse says where
        if module is not None and module.default_indent == partial.indent:
            return data, module, partial
    try:
        return data, cst.parse_module(data), None
    except cst.ParserSyntaxError as exc:
        raise RefusedError(
            f"{path}:{exc.raw_line}:{exc.raw_column}: syntax error, cannot patch it",
            details=[exc.message],
            hint="the file is broken; reinstall the package",
        ) from None


def read_target(tree: Tree, rel: str) -> tuple[bytes, cst.Module]:
    data, module, _ = parse_target(tree, rel)
    return data, module


@dataclass
class WorkFile:
    """A file as a plan holds it: the bytes on disk, and what the plan makes of them."""

    disk: bytes | None  # what the tree holds now (None: absent)
    base: bytes | None  # the content the plan starts from (the disk's, or an upgrade's reverted record)
    mode: int
    module: cst.Module | None = None  # parsed `base`, then transformed (None for CreateFile sites)
    partial: Partial | None = None  # `module` holds only what the codemods read: `Partial.splice` its code
    content: bytes | None = None  # a CreateFile site's planned content
    edited: bool = False  # `module` was transformed: its code is generated once, when every patch is in
    error: RefusedError | None = None  # the file cannot be parsed


class Workspace:
    """The files of one tree that a plan or a verify reads: each read and parsed at most once.

    `scopes`: for each file, what every codemod the plan or verify may run on it reads
    (`PatchCodemod.scope`, united): only that is parsed (`codemod.reduce`, partial parsing). A file
    without one is parsed whole."""

    def __init__(
        self,
        tree: Tree,
        bases: dict[str, tuple[bytes | None, int]] | None = None,
        scopes: dict[str, Scope] | None = None,
    ) -> None:
        self.tree = tree
        self.files: dict[str, WorkFile] = {}
        self._bases = bases or {}  # {path: (content, mode)} to start from instead of the disk's
        self._scopes = scopes or {}

    def file(self, rel: str) -> WorkFile:
        if rel not in self.files:
            path = self.tree.root / rel
            disk = read_or_none(path)
            if rel in self._bases:
                base, mode = self._bases[rel]
            else:
                base, mode = disk, (file_mode(path) if disk is not None else 0o644)
            self.files[rel] = WorkFile(disk, base, mode)
        return self.files[rel]

    def module(self, rel: str, reads: Scope | None = None) -> cst.Module:
        """The file's syntax tree; `reads`: what the caller reads of it (None: all of it)."""
        f = self.file(rel)
        scope = self._scopes.get(rel)
        if f.module is None and f.error is None:
            try:
                if rel in self._bases and f.base is None:
                    raise RefusedError(f"{self.tree.root / rel}: missing")
                data = f.base if rel in self._bases else None
                _, f.module, f.partial = parse_target(self.tree, rel, data, scope)
            except RefusedError as exc:
                f.error = exc
        if f.error is not None:
            raise f.error
        if f.partial is not None and (reads is None or scope is None or not scope.covers(reads)):
            raise RuntimeError(f"{rel}: parsed for {scope}, read for {reads}")  # the caller's scopes are wrong
        assert f.module is not None
        return f.module

    def created(self, rel: str) -> bytes | None:
        """The content of a file a CreateFile site adds, as the plan stands."""
        f = self.file(rel)
        return f.content if f.content is not None else f.base


@dataclass
class SiteState:
    """What `site_state` found at one site."""

    site: Site
    state: State
    reasons: list[str] = field(default_factory=list)
    params: dict[str, str] = field(default_factory=dict)  # the parameters found baked in (applied)
    expected: cst.Module | None = None  # the file as the patch wants it (a codemod site that is not drifted)
    remembered: bool = False  # decided from `checked.json` (these bytes were found applied before)
    key: str = ""  # the `checked_key` of the bytes decided, "" when none


def scopes_of(sites: list[tuple[Patch, Site]]) -> dict[str, Scope]:
    """What the codemods of `sites` read, per file (`Workspace`'s `scopes`)."""
    scopes: dict[str, Scope] = {}
    for patch, site in sites:
        codemod = patch.codemod(site)
        if not isinstance(codemod, CreateFile):
            scopes[site.target] = scopes.get(site.target, Scope()) | codemod.scope()
    return scopes


def site_present(tree: Tree, site: Site) -> bool:
    """False for an optional site whose file this tree does not have (skipped everywhere)."""
    return site.required or (tree.root / site.target).is_file()


def site_state(ws: Workspace, patch: Patch, site: Site, known: set[str] | frozenset[str] = frozenset()) -> SiteState:
    """The state of `patch` at `site` in the workspace's current content of the file.

    `known`: `checked_key`s of bytes found APPLIED before (verify's memo): such a file is not parsed."""
    codemod = patch.codemod(site)
    if isinstance(codemod, CreateFile):
        report = codemod.state_of(ws.created(site.target))
        return SiteState(site, report.state, list(report.reasons))
    f = ws.file(site.target)
    pristine = not f.edited and not (ws.tree.root / site.target).is_symlink()
    key = checked_key(patch.id, site.target, patch.fingerprint, f.base) if f.base is not None and pristine else ""
    if key and key in known:
        return SiteState(site, State.APPLIED, remembered=True, key=key)
    try:
        module = ws.module(site.target, codemod.scope())
    except RefusedError as exc:
        return SiteState(site, State.DRIFTED, [exc.message + (f" ({exc.hint})" if exc.hint else "")])
    report = codemod.state(module)
    return SiteState(site, report.state, list(report.reasons), dict(report.params), report.expected, key=key)
