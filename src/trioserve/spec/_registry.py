"""Registry manifests (``manifest.v1.json``) and looking entries up by kind and name.

A registry is a directory of manifests, one per entry::

    <root>/tools/<name>/manifest.yaml        kind: Tool
    <root>/extensions/<name>/manifest.yaml   kind: Extension
    <root>/skills/<name>/manifest.yaml       kind: Skill
    <root>/subagents/<name>/manifest.yaml    kind: Subagent

(``manifest.yml`` is accepted too.)  A manifest is validated like a spec: every
rule of the schema, unknown fields are errors except under ``spec`` (which the
schema leaves open), and every problem is reported at once.  ``Subagent`` is a
trioserve extension of the schema's ``kind`` enum (Tool, Extension, MCPServer,
Skill), needed because specs reference subagents.

:meth:`Registry.lookup` guarantees that the manifest it returns is valid, that
its ``kind`` matches the directory it was found in, and that its
``metadata.name`` equals the name it was looked up by.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, Literal, get_args

from pydantic import AfterValidator, ConfigDict, Field

from trioserve.errors import SpecError
from trioserve.spec._documents import ApiVersion
from trioserve.spec._validation import (
    StrictModel,
    describe,
    name_rule,
    one_of,
    parse_yaml,
    problem,
    read_text,
    validate_model,
)

MANIFEST_NAME_PATTERN: Final = "^[a-z0-9]([-_a-z0-9]*[a-z0-9])?$"
MANIFEST_FILES: Final = ("manifest.yaml", "manifest.yml")

ManifestKind = Literal["Tool", "Extension", "MCPServer", "Skill", "Subagent"]
EntryKind = Literal["Tool", "Extension", "Skill", "Subagent"]
#: The registry subdirectory holding each kind of entry.
KIND_DIRS: Final[dict[EntryKind, str]] = {
    "Tool": "tools",
    "Extension": "extensions",
    "Skill": "skills",
    "Subagent": "subagents",
}

_RiskLevel = Literal["low", "medium", "high"]
_NAME_EXPLAINED: Final = "lowercase letters, digits, '-' and '_'"
_NAME_RE: Final = re.compile(MANIFEST_NAME_PATTERN, re.ASCII)
_VERSION_RE: Final = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+")
# A scheme such as npm:, https:, file: (two letters or more, so not a drive letter).
_REFERENCE_RE: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:")


def _check_version(value: str) -> str:
    if not _VERSION_RE.match(value):
        raise problem(
            f"must start with MAJOR.MINOR.PATCH (pattern ^\\d+\\.\\d+\\.\\d+), "
            f"got {describe(value)}"
        )
    return value


ManifestName = Annotated[str, name_rule(MANIFEST_NAME_PATTERN, _NAME_EXPLAINED)]


class ManifestMetadata(StrictModel):
    """``metadata``: name (letters, digits, '-', '_'), semantic version, owner, description."""

    name: ManifestName
    version: Annotated[str, AfterValidator(_check_version)]
    owner: str | None = None
    description: str | None = None


class ManifestSpec(StrictModel):
    """``spec``: the entrypoint (required) and optional schemas; other fields are kept."""

    model_config = ConfigDict(extra="allow")

    entrypoint: str
    input_schema: dict[str, Any] | None = Field(default=None, alias="inputSchema")
    output_schema: dict[str, Any] | None = Field(default=None, alias="outputSchema")
    config_schema: dict[str, Any] | None = Field(default=None, alias="configSchema")
    hooks: list[str] | None = None
    risk_level: Annotated[_RiskLevel, one_of(_RiskLevel)] | None = Field(
        default=None, alias="riskLevel"
    )
    required_permissions: list[str] | None = Field(default=None, alias="requiredPermissions")
    supports_dry_run: bool | None = Field(default=None, alias="supportsDryRun")


class Manifest(StrictModel):
    """A valid registry manifest."""

    api_version: ApiVersion = Field(alias="apiVersion")
    kind: Annotated[ManifestKind, one_of(ManifestKind)]
    metadata: ManifestMetadata
    spec: ManifestSpec


def load_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read and validate the manifest at ``path``; SpecError (source: the path) otherwise."""
    source = os.fspath(path)
    return validate_model(Manifest, parse_yaml(read_text(path), source), source)


def resolve_entrypoint(entrypoint: str, base: Path) -> str:
    """``entrypoint`` as an absolute path relative to ``base``.

    Absolute paths and references with a scheme (``npm:pkg``, ``https://...``)
    are returned unchanged.
    """
    if os.path.isabs(entrypoint) or _REFERENCE_RE.match(entrypoint):
        return entrypoint
    return os.path.normpath(base / entrypoint)


@dataclass(frozen=True, slots=True)
class RegistryEntry:
    """A manifest found in the registry, and where."""

    manifest: Manifest
    path: Path

    @property
    def entrypoint(self) -> str:
        """The manifest's entrypoint, resolved against the manifest's directory."""
        return resolve_entrypoint(self.manifest.spec.entrypoint, self.path.parent)


class EntryNotFound(SpecError):
    """No manifest for that kind and name (or the name cannot be a registry name)."""


class Registry:
    """A registry directory; relative roots are taken from the working directory."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.normpath(Path(root).absolute()))

    def candidates(self, kind: EntryKind, name: str) -> list[Path]:
        """The manifest paths looked at for ``name``, in order."""
        folder = self.root / KIND_DIRS[kind] / name
        return [folder / file for file in MANIFEST_FILES]

    def lookup(self, kind: EntryKind, name: str) -> RegistryEntry:
        """The valid manifest of the ``kind`` entry called ``name``.

        Raises :class:`EntryNotFound` when there is none, and SpecError whose
        problems are prefixed by the manifest's path when it is invalid.
        """
        word = kind.lower()
        if not _NAME_RE.fullmatch(name) or len(name) > 63:
            why = f"must match {MANIFEST_NAME_PATTERN} ({_NAME_EXPLAINED}), at most 63 characters"
            raise EntryNotFound(
                str(self.root), [f"{describe(name)} cannot be a {word} name in a registry: {why}"]
            )
        path = next((p for p in self.candidates(kind, name) if p.is_file()), None)
        if path is None:
            looked = f"{KIND_DIRS[kind]}/{name}/{MANIFEST_FILES[0]} and {MANIFEST_FILES[1]}"
            missing = "" if self.root.is_dir() else ", a directory that does not exist"
            message = f"{word} '{name}' not found in registry {self.root}{missing}"
            raise EntryNotFound(str(self.root), [f"{message} (looked for {looked})"])
        return RegistryEntry(_load_entry(path, kind, name), path)


def _load_entry(path: Path, kind: EntryKind, name: str) -> Manifest:
    """Load the manifest at ``path``; every problem is prefixed with the path."""
    source = str(path)
    try:
        return _check_entry(parse_yaml(read_text(path), source), source, kind, name)
    except SpecError as exc:
        raise SpecError(source, [f"{source}: {p}" for p in exc.problems]) from None


def _check_entry(data: dict[str, Any], source: str, kind: EntryKind, name: str) -> Manifest:
    """Validate ``data``, and check (on the raw data, so all at once) its kind and name."""
    problems: list[str] = []
    found_kind = data.get("kind")
    if found_kind != kind and found_kind in get_args(ManifestKind):
        problems.append(
            f"kind: expected '{kind}' (it is under {KIND_DIRS[kind]}/), got {describe(found_kind)}"
        )
    metadata = data.get("metadata")
    found_name = metadata.get("name") if isinstance(metadata, dict) else None
    if isinstance(found_name, str) and found_name != name:
        problems.append(
            f"metadata.name: expected '{name}' (the name it is referenced by), "
            f"got {describe(found_name)}"
        )
    try:
        manifest = validate_model(Manifest, data, source)
    except SpecError as exc:
        problems = exc.problems + problems
    if problems:
        raise SpecError(source, problems)
    return manifest
