"""The numa workloads (workloads/numa_*.c, workloads/README.md) run natively: each --truth
line must be consistent with itself and with what the machine shows (the topology in sysfs,
the page size, the pid). On a 1-node machine every page is on node 0 and every access is
local; the checks that depend on the number of nodes are written for any number, so the
file also passes inside the 2-node guest (scripts/numavm), which boots with automatic NUMA
balancing off (`numa_balancing=disable`); when balancing is on, `placement_stable` is not
checked.

No locus recording here: these tests only need `make -C workloads`.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

TIMEOUT_S = 60
SYSFS_NODES = Path("/sys/devices/system/node")


def run(built: Path, name: str, *args: str, truth: bool = True) -> tuple[dict, str]:
    argv = [str(built / name), *args] + (["--truth"] if truth else [])
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            out, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, (argv, proc.returncode, err)
    assert out.count("\n") == 1 and out.startswith(name + ":"), out
    lines = [ln for ln in err.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, err
    t = json.loads(lines[0])
    check_common(t, name, proc.pid)
    return t, out


def parse_cpulist(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        a, _, b = part.partition("-")
        cpus.update(range(int(a), int(b or a) + 1))
    return cpus


def machine_topology() -> dict[int, list[int]]:
    """node -> allowed CPUs, for the nodes with at least one CPU this process may use."""
    allowed = os.sched_getaffinity(0)
    nodes: dict[int, list[int]] = {}
    if SYSFS_NODES.is_dir():
        for d in SYSFS_NODES.glob("node[0-9]*"):
            cpus = parse_cpulist((d / "cpulist").read_text()) & allowed
            if cpus:
                nodes[int(d.name[4:])] = sorted(cpus)
    return nodes or {0: sorted(allowed)}


def check_common(t: dict, name: str, pid: int) -> None:
    assert t["workload"] == name
    topo = machine_topology()
    assert t["nodes"] == len(topo) >= 1
    assert t["node_ids"] == sorted(topo)
    assert {e["node"]: e["cpus"] for e in t["topology"]} == topo
    assert t["cpus"] == sum(len(c) for c in topo.values())
    assert t["page_size"] == os.sysconf("SC_PAGE_SIZE")
    tids = t["tids"]
    assert tids[0] == pid  # index 0 is the main thread
    assert len(set(tids)) == len(tids) and all(x > 0 for x in tids)


def node_of_cpu(t: dict, cpu: int) -> int:
    return next(e["node"] for e in t["topology"] if cpu in e["cpus"])


def require_placement(t: dict) -> None:
    if not t["numa_syscalls"]:
        pytest.skip("move_pages is not available (kernel without CONFIG_NUMA)")


def check_stable(t: dict) -> None:
    if t["numa_balancing"] == 0:
        assert t["placement_stable"], "pages moved although NUMA balancing is off"


def total(counts: dict) -> int:
    return sum(counts.values())


def first_touch_by_initialiser(obj: dict, main_tid: int, init_tid: int, site: str) -> int:
    """Checks a chunk's or array's first touches; returns the pages malloc touched."""
    ft = obj["first_touch"]
    assert sum(e["pages"] for e in ft) == obj["pages"]
    by_malloc = [e for e in ft if e["site"] == "malloc"]
    for e in by_malloc:
        assert e["tid"] == main_tid and e["thread"] == 0
    by_init = [e for e in ft if e["site"] != "malloc"]
    assert len(by_init) == 1 and by_init[0]["site"] == site and by_init[0]["tid"] == init_tid
    return sum(e["pages"] for e in by_malloc)


def check_pinned_workers(t: dict, nthreads: int) -> dict[int, dict]:
    """thread_list: main unpinned, worker i pinned (one pthread_setaffinity_np) to the i-th
    CPU of the round-robin order over the nodes. Returns worker index -> entry."""
    tl = t["thread_list"]
    assert [e["tid"] for e in tl] == t["tids"]
    assert len(tl) == nthreads + 1
    assert tl[0]["role"] == "main" and not tl[0]["pinned"] and tl[0]["bindings"] == []
    topo = {e["node"]: e["cpus"] for e in t["topology"]}
    rr = [
        c
        for r in range(max(map(len, topo.values())))
        for n in sorted(topo)
        for c in topo[n][r : r + 1]
    ]
    workers = {}
    for e in tl[1:]:
        i = e["worker"]
        assert e["index"] == i + 1 and e["pinned"]
        assert e["cpu"] == rr[i % len(rr)] and e["node"] == node_of_cpu(t, e["cpu"])
        (b,) = e["bindings"]
        assert b["call"] == "pthread_setaffinity_np" and b["cpus"] == [e["cpu"]] and b["rc"] == 0
        workers[i] = e
    if t["nodes"] > 1 and nthreads > 1:
        assert workers[0]["node"] != workers[1]["node"]  # round-robin over the nodes
    return workers


def check_matrix(t: dict, expected_accesses: int) -> None:
    m = t["compute_matrix"]
    assert sum(sum(row.values()) for row in m.values()) == expected_accesses
    if t["nodes"] == 1:
        n = str(t["node_ids"][0])
        assert m == {n: {n: expected_accesses}}


@pytest.mark.parametrize("init", ["serial", "parallel"])
@pytest.mark.parametrize("threads", [2, 3])
def test_firsttouch(built_workloads, init, threads):
    mb, iters = 8, 3
    t, out = run(
        built_workloads,
        "numa_firsttouch",
        str(threads),
        str(mb),
        "--init",
        init,
        "--iters",
        str(iters),
    )
    require_placement(t)
    assert (t["init"], t["threads"], t["mb"], t["iters"]) == (init, threads, mb, iters)
    assert f"{init} init" in out
    ps = t["page_size"]
    lo, hi = t["array"]
    assert hi - lo == t["bytes"] == mb << 20 == t["elements"] * t["element_size"]
    assert t["pages"] == (-(-hi // ps) * ps - lo // ps * ps) // ps
    workers = check_pinned_workers(t, threads)
    chunks = t["chunks"]
    assert [c["index"] for c in chunks] == list(range(threads))
    # Contiguous, page-aligned inner boundaries, disjoint pages that add up to the array.
    assert chunks[0]["lo"] == lo and chunks[-1]["hi"] == hi
    for a, b in zip(chunks, chunks[1:]):
        assert a["hi"] == b["lo"] and b["lo"] % ps == 0
    assert sum(c["pages"] for c in chunks) == t["pages"]
    assert sum(c["elements"] for c in chunks) == t["elements"]
    main_tid = t["tids"][0]
    malloc_pages = 0
    for c in chunks:
        init_worker = c["index"] if init == "parallel" else 0
        assert c["init_worker"] == init_worker and c["init_tid"] == workers[init_worker]["tid"]
        by_malloc = first_touch_by_initialiser(c, main_tid, c["init_tid"], t["init_site"])
        malloc_pages += by_malloc
        assert c["pages_per_node_absent"] == 0 and total(c["pages_per_node"]) == c["pages"]
        assert total(c["bytes_per_node"]) == c["hi"] - c["lo"]
        # First touch: every page the initialiser touched is on its node.
        assert c["pages_per_node"][str(workers[init_worker]["node"])] >= c["pages"] - by_malloc
        if t["nodes"] == 1:
            assert c["pages_per_node"] == {str(t["node_ids"][0]): c["pages"]}
    # glibc mmaps the array: malloc touched the page of its chunk header, in chunk 0.
    assert malloc_pages == 1 and chunks[0]["first_touch"][0]["site"] == "malloc"
    for w in t["workers"]:
        c = chunks[w["chunk"]]
        assert w["tid"] == workers[w["index"]]["tid"] and w["node"] == workers[w["index"]]["node"]
        assert w["reads"] == w["writes"] == iters * c["elements"]
        assert w["local_pages"] + w["remote_pages"] == c["pages"]
        assert w["local_pages"] == c["pages_per_node"][str(w["node"])]
        if t["nodes"] == 1 or init == "parallel":
            # Parallel init: all local (chunk 0 but malloc's page); 1 node: everything local.
            assert w["remote_pages"] <= (1 if w["index"] == 0 else 0)
            assert w["local_fraction"] >= 1 - w["remote_pages"] / c["pages"] - 1e-6
        if init == "serial" and t["nodes"] > 1 and w["node"] != workers[0]["node"]:
            assert w["local_pages"] == 0 and w["local_fraction"] == 0
    check_matrix(t, 2 * iters * t["elements"])
    check_stable(t)


def test_policy(built_workloads):
    mb = 4
    t, _ = run(built_workloads, "numa_policy", str(mb))
    require_placement(t)
    ps = t["page_size"]
    pages = (mb << 20) // ps
    last = t["node_ids"][-1]
    assert t["last_node"] == last
    toucher = t["toucher"]
    assert toucher["tid"] == t["tids"][1] and len(t["tids"]) == 2
    assert toucher["cpu"] == t["topology"][0]["cpus"][0] and toucher["node"] == t["node_ids"][0]
    assert t["main"]["bindings"] == []
    regions = {r["name"]: r for r in t["regions"]}
    assert list(regions) == ["bind_last", "interleave", "moved"]
    spans = sorted((r["lo"], r["hi"]) for r in regions.values())
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # separate mappings
    for r in regions.values():
        assert r["lo"] % ps == 0 and r["hi"] - r["lo"] == r["bytes"] == mb << 20
        assert r["pages"] == pages and r["applied"]
        assert r["toucher_tid"] == r["caller_tid"] == toucher["tid"]
        assert r["toucher_node"] == toucher["node"]
        assert r["pages_per_node_absent"] == 0 and total(r["pages_per_node"]) == pages
        assert r["local_pages"] == r["pages_per_node"][str(toucher["node"])]
        assert r["local_pages"] + r["remote_pages"] == pages
        assert r["reads"] == t["passes"] * r["bytes"] // 64
        if t["nodes"] == 1:
            assert r["pages_per_node"] == {str(last): pages} and r["remote_pages"] == 0
    b, il, mv = regions["bind_last"], regions["interleave"], regions["moved"]
    assert (b["mode"], b["policy_seen"], b["policy_nodes"]) == ("MPOL_BIND", "MPOL_BIND", [last])
    assert b["pages_per_node"][str(last)] == pages == b["expected_pages_per_node"][str(last)]
    assert (il["mode"], il["policy_seen"]) == ("MPOL_INTERLEAVE", "MPOL_INTERLEAVE")
    assert il["policy_nodes"] == t["node_ids"]
    for n in t["node_ids"]:
        assert abs(il["pages_per_node"][str(n)] - pages / t["nodes"]) <= 1
    assert (mv["call"], mv["policy_seen"], mv["policy_nodes"]) == ("move_pages", "MPOL_DEFAULT", [])
    assert mv["pages_per_node_before"][str(toucher["node"])] == pages  # first touch
    assert mv["move_target"] == last and mv["moved_pages"] == pages and mv["move_failed_pages"] == 0
    assert mv["pages_per_node"][str(last)] == pages
    if t["nodes"] > 1:
        assert b["remote_pages"] == pages and mv["remote_pages"] == pages
    # The toucher's binding log: its pinning, then the two mbinds on their regions, in order.
    log = toucher["bindings"]
    assert [x["call"] for x in log] == ["pthread_setaffinity_np", "mbind", "mbind"]
    assert [x["order"] for x in log] == sorted(x["order"] for x in log)
    assert [x["t_ns"] for x in log] == sorted(x["t_ns"] for x in log)
    assert log[0]["cpus"] == [toucher["cpu"]]
    assert (log[1]["mode"], log[1]["nodes"], log[1]["range"]) == (
        "MPOL_BIND",
        [last],
        [b["lo"], b["hi"]],
    )
    assert (log[2]["mode"], log[2]["range"]) == ("MPOL_INTERLEAVE", [il["lo"], il["hi"]])
    check_stable(t)


def test_pinning(built_workloads):
    t, _ = run(built_workloads, "numa_pinning", "0.2")
    require_placement(t)
    assert t["secs"] == 0.2
    tl = {e["role"]: e for e in t["thread_list"]}
    assert [e["role"] for e in t["thread_list"]] == ["main", "unpinned", "pinned", "repinned"]
    assert [e["tid"] for e in t["thread_list"]] == t["tids"] and len(t["tids"]) == 4
    cpus = [c for e in t["topology"] for c in e["cpus"]]
    first_cpu, last_cpu = min(cpus), max(cpus)
    p1, p2 = t["phases"]
    assert p1["start_ns"] < p1["end_ns"] <= p2["start_ns"] < p2["end_ns"]
    assert tl["main"]["bindings"] == [] and tl["unpinned"]["bindings"] == []

    pinned = tl["pinned"]["bindings"]
    assert [(x["call"], x.get("cpus"), x.get("nodes")) for x in pinned] == [
        ("pthread_setaffinity_np", [last_cpu], None),
        ("set_mempolicy", None, [node_of_cpu(t, last_cpu)]),
    ]
    assert pinned[1]["mode"] == "MPOL_BIND"
    # The re-pinned thread: two sched_setaffinity, the second between the phases.
    rep = tl["repinned"]["bindings"]
    assert len(rep) == 2
    assert [(x["call"], x["cpus"]) for x in rep] == [
        ("sched_setaffinity", [first_cpu]),
        ("sched_setaffinity", [last_cpu]),
    ]
    assert rep[0]["order"] < rep[1]["order"] and rep[0]["t_ns"] < p1["start_ns"]
    assert p1["end_ns"] <= rep[1]["t_ns"] <= p2["start_ns"]
    for x in pinned + rep:
        assert x["rc"] == 0 and x["t_ns"] >= t["t0_ns"]

    expect = {  # role -> (pinned, cpus) per phase
        "unpinned": [(False, None), (False, None)],
        "pinned": [(True, [last_cpu]), (True, [last_cpu])],
        "repinned": [(True, [first_cpu]), (True, [last_cpu])],
    }
    words = t["buffer_bytes"] // 8
    for role, phases in expect.items():
        e = tl[role]
        lo, hi = e["buffer"]
        assert hi - lo == t["buffer_bytes"]
        assert e["pages_per_node_absent"] == 0 and total(e["pages_per_node"]) == e["pages"]
        for ph, (want_pinned, want_cpus) in zip(e["phases"], phases):
            assert ph["pinned"] is want_pinned
            if want_pinned:
                assert ph["cpus"] == want_cpus and ph["cpu_seen"] == want_cpus[0]
                assert ph["node"] == node_of_cpu(t, want_cpus[0])
            else:
                assert ph["node"] is None and ph["local_fraction"] is None
            assert ph["passes"] >= 1 and ph["writes"] == ph["passes"] * words
        if t["nodes"] == 1:
            assert e["pages_per_node"] == {str(t["node_ids"][0]): e["pages"]}
    # Memory: the pinned thread's buffer on its (bound) node; the re-pinned one's where it
    # was first touched, on the first CPU's node: local, then remote if that is another node.
    assert tl["pinned"]["pages_per_node"][str(node_of_cpu(t, last_cpu))] == tl["pinned"]["pages"]
    rp = tl["repinned"]
    assert rp["pages_per_node"][str(node_of_cpu(t, first_cpu))] == rp["pages"]
    assert rp["phases"][0]["local_fraction"] == 1.0
    assert rp["phases"][1]["local_fraction"] == (1.0 if t["nodes"] == 1 else 0.0)
    check_stable(t)


@pytest.mark.parametrize("threads", [2, 3])
def test_hydro(built_workloads, threads):
    mb, iters = 6, 3
    t, _ = run(built_workloads, "numa_hydro", str(threads), str(mb), "--iters", str(iters))
    require_placement(t)
    assert (t["threads"], t["mb"], t["iters"]) == (threads, mb, iters)
    workers = check_pinned_workers(t, threads)
    arrays = t["arrays"]
    assert [a["index"] for a in arrays] == list(range(threads))
    spans = sorted((a["lo"], a["hi"]) for a in arrays)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert t["array_bytes"] == t["elements"] * t["element_size"]
    main_tid = t["tids"][0]
    for a in arrays:
        i, u = a["init_worker"], a["user_worker"]
        assert i == a["index"] and u == (a["index"] - 1) % threads  # worker u uses array u+1
        assert workers[u]["uses_array"] == a["index"] and workers[i]["init_array"] == i
        assert a["init_tid"] == workers[i]["tid"] and a["user_tid"] == workers[u]["tid"]
        assert a["init_node"] == workers[i]["node"] and a["user_node"] == workers[u]["node"]
        assert a["hi"] - a["lo"] == t["array_bytes"]
        assert a["reads"] == a["writes"] == iters * t["elements"]
        by_malloc = first_touch_by_initialiser(a, main_tid, a["init_tid"], t["init_site"])
        assert by_malloc == 1
        assert a["pages_per_node_absent"] == 0 and total(a["pages_per_node"]) == a["pages"]
        assert a["pages_per_node"][str(a["init_node"])] >= a["pages"] - by_malloc
        assert a["user_local_pages"] + a["user_remote_pages"] == a["pages"]
        if t["nodes"] == 1:
            assert a["user_remote_pages"] == 0 and a["user_local_fraction"] == 1.0
        elif a["init_node"] != a["user_node"]:
            assert a["user_local_pages"] <= by_malloc  # remote but for malloc's page
    if t["nodes"] > 1 and threads == 2:
        assert all(a["user_local_fraction"] < 0.01 for a in arrays)  # every access remote
    check_matrix(t, 2 * iters * t["elements"] * threads)
    check_stable(t)


@pytest.mark.parametrize(
    "argv",
    [
        ["numa_firsttouch", "0"],
        ["numa_firsttouch", "2", "x"],
        ["numa_firsttouch", "--init", "random"],
        ["numa_firsttouch", "--iters"],
        ["numa_firsttouch", "1", "2", "3"],
        ["numa_policy", "-1"],
        ["numa_policy", "1", "2"],
        ["numa_pinning", "abc"],
        ["numa_pinning", "0"],
        ["numa_hydro", "64", "1"],  # less than 256 KiB per array
        ["numa_hydro", "2", "--iters", "0"],
    ],
)
def test_bad_arguments(built_workloads, argv):
    proc = subprocess.run(
        [str(built_workloads / argv[0]), *argv[1:], "--truth"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
    assert proc.stdout == "" and "{" not in proc.stderr
    assert "usage" in proc.stderr or "at most" in proc.stderr
