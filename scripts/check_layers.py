"""The crate's layering (docs/design.md, "Module map"), checked from the source text.

Each file's dependencies are the `crate::` paths it names (in `use` lines and in code) and, for
`use super::...`, its parent module. The check fails (exit status 1) when
  * two files depend on each other, directly or through others (an import cycle), or
  * a file depends on a layer above its own (the order is LAYERS below), or
  * a file under src/lock_service/etcd/ names pgrx or `pg_sys`, or does not forbid unsafe code, or
  * a write path (src/guard/, src/api/) asks for a write's token or its lock's state itself
    instead of through the rule layer's one entry point (`rule::write_token`,
    `rule::write_token_if_any`, `rule::admit_token`): it may not name `session_token::current_token`,
    `lock_service::etcd_locks::check_lock_not_lost`, `lock_service::leases::check_lease_live` or
    `lock_service::watch::check`, or
  * a file keeps per-backend state (a `thread_local!`) without a line of its own in `STATEFUL` in
    src/backend.rs (`file: "src/..."`) and a `pub fn on_event(` that says what each backend event
    clears, or `STATEFUL` names a file without per-backend state or without that function.

Usage: check_layers.py [SRC_DIR]   (default: src)
"""
import os
import re
import sys

# Top to bottom; a file may depend on its own layer's files and on layers below (no cycles).
LAYERS = [
    ["lib.rs", "backend.rs", "model_check.rs", "tombstone_retention.rs"],
    ["api"],
    ["guard"],
    ["rule"],
    ["lock_service"],
    ["state"],
    ["pg"],
    ["gucs.rs", "error.rs", "cache.rs", "text.rs", "backend_event.rs"],
]


def module_of(rel):
    """src-relative file path -> module path list (`api/fenced.rs` -> ['api', 'fenced'])."""
    parts = rel[:-3].split("/")
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return parts


def layer_of(rel):
    top = rel.split("/")[0]
    for i, names in enumerate(LAYERS):
        if top in names or rel in names:
            return i
    raise SystemExit(f"check_layers: {rel} is in no layer; add it to LAYERS")


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "src"
    files = {}
    for root, _, names in os.walk(src):
        for n in names:
            if n.endswith(".rs"):
                rel = os.path.relpath(os.path.join(root, n), src)
                files[rel] = open(os.path.join(root, n)).read()
    by_module = {tuple(module_of(rel)): rel for rel in files}

    def resolve(path):
        """The file a module path names: the longest prefix that is a file's module."""
        for n in range(len(path), 0, -1):
            if tuple(path[:n]) in by_module:
                return by_module[tuple(path[:n])]
        return None

    deps = {rel: set() for rel in files}
    problems = []
    for rel, text in files.items():
        code = "\n".join(l for l in text.split("\n") if not l.lstrip().startswith("//"))
        me = module_of(rel)
        for m in re.finditer(r"crate::((?:\w+::)*\w+)", code):
            target = resolve(m.group(1).split("::"))
            if target and target != rel:
                deps[rel].add(target)
        for m in re.finditer(r"\bsuper::((?:\w+::)*\w+)", code):
            base = me[:-1] if not rel.endswith("mod.rs") else me[:-1]
            target = resolve(base + m.group(1).split("::"))
            if target and target != rel:
                deps[rel].add(target)
        if rel.startswith(("guard/", "api/")):
            for bypass in ("current_token", "etcd_locks::check_lock_not_lost", "leases::check_lease_live", "watch::check"):
                if re.search(r"\b" + re.escape(bypass) + r"\b", code):
                    problems.append(f"{rel}: a write path names {bypass}; admit writes through "
                                    "rule::write_token / write_token_if_any / admit_token")
        if rel.startswith("lock_service/etcd/"):
            if re.search(r"\bpgrx\b|\bpg_sys\b", code):
                problems.append(f"{rel}: the etcd thread's code names pgrx or pg_sys")
            if "#![forbid(unsafe_code)]" not in text:
                problems.append(f"{rel}: lacks #![forbid(unsafe_code)]")
    # Per-backend state: one line in backend.rs's STATEFUL per file that keeps it.
    listed = re.findall(r'file:\s*"src/([^"]+)"', files.get("backend.rs", ""))
    def code_of(text):
        return "\n".join(l for l in text.split("\n") if not l.lstrip().startswith("//"))
    stateful = sorted(rel for rel, text in files.items() if "thread_local!" in code_of(text))
    for rel in stateful:
        if rel not in listed:
            problems.append(f"{rel}: keeps per-backend state (thread_local!) but is not in STATEFUL "
                            "of src/backend.rs; add it there with its on_event")
    for rel in listed:
        if rel not in files:
            problems.append(f"src/backend.rs: STATEFUL names src/{rel}, which does not exist")
        elif "thread_local!" not in code_of(files[rel]):
            problems.append(f"src/backend.rs: STATEFUL names src/{rel}, which keeps no per-backend state")
        elif not re.search(r"(?m)^pub fn on_event\(", files[rel]):
            problems.append(f"src/{rel}: in STATEFUL of src/backend.rs but has no `pub fn on_event(`")
    if len(set(listed)) != len(listed):
        problems.append("src/backend.rs: STATEFUL names a file twice")
    # A parent module file (`mod.rs`) declaring its children is not a dependency on them.
    for rel in deps:
        me = module_of(rel)
        deps[rel] = {d for d in deps[rel] if not (rel.endswith(("mod.rs", "lib.rs")) and module_of(d)[:-1] == me)}
    for rel in sorted(deps):
        for d in sorted(deps[rel]):
            if layer_of(d) < layer_of(rel):
                problems.append(f"{rel} depends on {d}, a layer above it")
    # Cycles (Tarjan's strongly connected components).
    index, low, stack, on, sccs = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in deps[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(deps):
        if v not in index:
            visit(v)
    for comp in sccs:
        problems.append("import cycle between " + ", ".join(comp))
    for p in problems:
        print("check_layers:", p)
    if problems:
        return 1
    print(f"check_layers: {len(files)} files, {sum(len(d) for d in deps.values())} dependencies, "
          f"no cycle, every dependency points down or sideways; {len(stateful)} files with "
          "per-backend state, each in backend.rs's STATEFUL")
    return 0


if __name__ == "__main__":
    sys.exit(main())
