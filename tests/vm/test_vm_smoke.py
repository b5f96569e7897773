"""The NUMA guest itself: two nodes with CPUs, and real first-touch page placement.

numa_touch (compiled on the host by vm_prepare, run in the guest) pins itself to one CPU,
first-touches fresh anonymous pages, asks the kernel where each page is with
move_pages(nodes=NULL), then moves them all to another node with move_pages and asks again.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

NUMA_TOUCH_C = r"""
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAXNODE 64
#define MPOL_MF_MOVE 2

/* numa_touch CPU NPAGES [TARGET_NODE]: prints key=value pairs on one line. */
static void where(void **pages, long n, int *status, const char *key) {
    long count[MAXNODE] = {0}, bad = 0;
    if (syscall(SYS_move_pages, 0, n, pages, NULL, status, 0) != 0) {
        perror("move_pages(query)");
        exit(3);
    }
    for (long i = 0; i < n; i++) {
        if (status[i] >= 0 && status[i] < MAXNODE) count[status[i]]++;
        else bad++;
    }
    for (int k = 0; k < MAXNODE; k++)
        if (count[k]) printf(" %s%d=%ld", key, k, count[k]);
    printf(" %s_err=%ld", key, bad);
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int cpu = atoi(argv[1]);
    long n = atol(argv[2]);
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
        perror("sched_setaffinity");
        return 2;
    }
    unsigned c = 0, node = 0;
    syscall(SYS_getcpu, &c, &node, NULL);
    long ps = sysconf(_SC_PAGESIZE);
    char *buf = mmap(NULL, n * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void **pages = malloc(n * sizeof *pages);
    int *status = malloc(n * sizeof *status), *nodes = malloc(n * sizeof *nodes);
    if (buf == MAP_FAILED || !pages || !status || !nodes) return 2;
    for (long i = 0; i < n; i++) {
        buf[i * ps] = 1; /* first touch, from the pinned CPU */
        pages[i] = buf + i * ps;
    }
    printf("cpu=%u node=%u pages=%ld", c, node, n);
    where(pages, n, status, "on");
    if (argc > 3) {
        for (long i = 0; i < n; i++) nodes[i] = atoi(argv[3]);
        if (syscall(SYS_move_pages, 0, n, pages, nodes, status, MPOL_MF_MOVE) != 0) {
            perror("move_pages(move)");
            return 3;
        }
        where(pages, n, status, "moved");
    }
    printf("\n");
    return 0;
}
"""

PAGES = 2048

VM_JOBS = {
    "smoke_topology": (
        "for n in /sys/devices/system/node/node[0-9]*; do "
        'echo "${n##*/} cpus=$(cat $n/cpulist) dist=$(cat $n/distance | tr " " ,)"; done'
    ),
    "smoke_touch_cpu0": f'"$VM_SHARED/numa_touch" 0 {PAGES} 1',
    "smoke_touch_cpu1": f'"$VM_SHARED/numa_touch" 1 {PAGES} 0',
}


def vm_prepare(shared: Path) -> None:
    src = shared / "numa_touch.c"
    src.write_text(NUMA_TOUCH_C)
    cc = subprocess.run(
        ["gcc", "-O2", "-Wall", "-o", str(shared / "numa_touch"), str(src)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert cc.returncode == 0, "gcc numa_touch.c:\n" + cc.stdout


def parse_kv(line: str) -> dict[str, str]:
    return dict(tok.split("=", 1) for tok in line.split() if "=" in tok)


def test_guest_has_two_nodes_with_cpus_and_one_memory_only(numavm):
    out = numavm.ok("smoke_topology").stdout
    nodes = {}
    for line in out.splitlines():
        name, *rest = line.split()
        nodes[name] = parse_kv(" ".join(rest))
    assert sorted(nodes) == ["node0", "node1", "node2"], out
    assert nodes["node0"]["cpus"] == "0", out
    assert nodes["node1"]["cpus"] == "1", out
    assert nodes["node2"].get("cpus", "") == "", out
    assert nodes["node0"]["dist"] == "10,20,30", out
    assert nodes["node1"]["dist"] == "20,10,14", out


@pytest.mark.parametrize("cpu,node", [(0, 0), (1, 1)])
def test_first_touch_lands_on_the_touching_cpus_node(numavm, cpu, node):
    res = numavm.ok(f"smoke_touch_cpu{cpu}")
    kv = parse_kv(res.stdout)
    other = 1 - node
    assert kv["cpu"] == str(cpu) and kv["node"] == str(node), res.stdout
    # First touch: every page on the node of the CPU that touched it.
    assert kv.get(f"on{node}") == str(PAGES) and kv["on_err"] == "0", res.stdout
    assert f"on{other}" not in kv, res.stdout
    # move_pages to the other node moves them all.
    assert kv.get(f"moved{other}") == str(PAGES) and kv["moved_err"] == "0", res.stdout
