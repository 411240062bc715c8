"""`rlprobe-patch list`: every patch of the catalogue, its releases, backends and why."""

from __future__ import annotations

import click

from rlprobe_patch.base.errors import ExitCode
from rlprobe_patch.cli.output import Out, command


@click.command("list")
@command
def list_cmd(out: Out) -> int:
    """Every patch in the catalogue: releases, backends and why."""
    from rlprobe_patch.catalogue.patches import load_catalogue

    patches = load_catalogue()
    out.emit(
        {
            "ok": True,
            "patches": [
                {
                    "id": p.id,
                    "revision": p.revision,
                    "package": p.package,
                    "sites": [
                        {"target": t.target, "versions": str(t.versions), "required": t.required} for t in p.sites
                    ],
                    "backends": list(p.backends),
                    "modes": list(p.modes),
                    "versions": str(p.versions),
                    "tested": list(p.tested),
                    "why": p.why,
                }
                for p in patches
            ],
        }
    )
    for p in patches:
        modes = f"; modes {', '.join(p.modes)}" if p.modes else ""
        out.line(f"{p.id}  ({p.package} {p.versions}; backends {', '.join(p.backends)}{modes})", bold=True)
        for site in p.sites:
            extra = "" if site.required else ", when present"
            out.line(f"  edits:  {site.target} ({p.package} {site.versions}{extra})")
        out.line(f"  tested: {', '.join(p.tested)}")
        out.line(f"  why:    {p.why}")
    return int(ExitCode.OK)
