#!/usr/bin/env python3
"""Checks the crate arrows of docs/architecture.md against `cargo metadata`.

Every workspace crate may depend (normal dependencies) only on the crates listed for it
below, and the pure crates must not pull in an async runtime, an HTTP stack or a NATS
client, directly or through any dependency. Run from the repository root; exits 1 naming
every arrow or dependency that breaks the rule.
"""

import json
import subprocess
import sys

# crate -> workspace crates it may depend on (docs/architecture.md, "Allowed arrows").
ALLOWED = {
    "switchyard-protocol": set(),
    "switchyard-support": set(),
    "switchyard-policy": {"switchyard-protocol"},
    "switchyard-filter": {"switchyard-protocol"},
    "switchyard-kv-index": {"switchyard-protocol"},
    "switchyard-router": {"switchyard-protocol", "switchyard-policy", "switchyard-kv-index"},
    "switchyard-engine": {"switchyard-protocol"},
    "switchyard-adapters": {"switchyard-protocol"},
    "switchyard-bus": {"switchyard-protocol"},
    "switchyard-control-plane": {
        "switchyard-protocol",
        "switchyard-router",
        "switchyard-bus",
        "switchyard-adapters",
        "switchyard-support",
    },
    "switchyard-sim-worker": {
        "switchyard-protocol",
        "switchyard-engine",
        "switchyard-bus",
        "switchyard-adapters",
        "switchyard-support",
    },
    "switchyard-loadgen": {"switchyard-protocol", "switchyard-engine", "switchyard-support"},
    "switchyard-replay": {
        "switchyard-protocol",
        "switchyard-engine",
        "switchyard-router",
        "switchyard-filter",
        "switchyard-loadgen",
        "switchyard-support",
    },
    "switchyard-stack": {
        "switchyard-protocol",
        "switchyard-engine",
        "switchyard-router",
        "switchyard-control-plane",
        "switchyard-filter",
        "switchyard-loadgen",
        "switchyard-replay",
        "switchyard-support",
    },
    "switchyard-whatif": {"switchyard-protocol", "switchyard-policy"},
    "switchyard-e2e": None,  # the end-to-end tests may use anything
}

# Pure crates: no runtime, sockets or NATS anywhere below them.
PURE = ["switchyard-protocol", "switchyard-policy", "switchyard-filter", "switchyard-kv-index",
        "switchyard-router",
        "switchyard-engine", "switchyard-adapters", "switchyard-whatif"]
FORBIDDEN_BELOW_PURE = {"tokio", "warp", "hyper", "reqwest", "async-nats", "mio"}


def main() -> int:
    meta = json.loads(
        subprocess.check_output(
            ["cargo", "metadata", "--format-version", "1", "--locked",
             "--filter-platform", "x86_64-unknown-linux-gnu"]
        )
    )
    members = set(meta["workspace_members"])
    packages = {p["id"]: p for p in meta["packages"]}
    names = {packages[i]["name"] for i in members}
    problems = []

    for pid in members:
        pkg = packages[pid]
        name = pkg["name"]
        if name not in ALLOWED:
            problems.append(f"{name}: not listed in scripts/check-architecture.py")
            continue
        allowed = ALLOWED[name]
        if allowed is None:
            continue
        for dep in pkg["dependencies"]:
            if dep["kind"] is None and dep["name"] in names and dep["name"] not in allowed:
                problems.append(f"{name} -> {dep['name']}: arrow not allowed")

    # Resolved graph (default features) for the pure crates' transitive dependencies.
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    for pure in PURE:
        root = next((i for i in members if packages[i]["name"] == pure), None)
        if root is None:
            continue
        seen, stack = set(), [root]
        while stack:
            node = nodes[stack.pop()]
            for dep in node["deps"]:
                if not any(k["kind"] is None for k in dep["dep_kinds"]):
                    continue
                if dep["pkg"] in seen:
                    continue
                seen.add(dep["pkg"])
                stack.append(dep["pkg"])
        bad = sorted({packages[i]["name"] for i in seen} & FORBIDDEN_BELOW_PURE)
        if bad:
            problems.append(f"{pure} (pure) depends on {', '.join(bad)}")

    for p in problems:
        print(f"architecture: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
