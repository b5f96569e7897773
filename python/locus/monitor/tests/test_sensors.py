"""Each sensor's parsing and rates on captured files (data/): exact numbers computed from
the two snapshots and a known interval, negative rates for levels that fall, the events
offered, and absent sensors with their reason."""

from __future__ import annotations

import errno

import pytest

from locus.monitor import perfevent
from locus.monitor.sensors.numastat import NumaStat
from locus.monitor.sensors.perf_sw import PerfSoftware
from locus.monitor.sensors.pmu import Pmu, encode_event, parse_bits
from locus.monitor.sensors.procstat import ProcStat
from locus.monitor.sensors.psi import Psi
from locus.monitor.sensors.vmstat import VmStat

DT = 0.5


def rates(sensor, cap, ids, dt=DT):
    """Enable `ids`, read snapshot a, then b `dt` seconds later: {id: value}."""
    assert sensor.present(), sensor.reason
    sensor.enable(ids)
    sensor.prime(100.0)
    cap.advance()
    vals = sensor.sample(100.0 + dt)
    sensor.close()
    return dict(zip([e.id for e in sensor.enabled], vals))


# -- vmstat ------------------------------------------------------------------------------


def test_vmstat_rates_and_a_falling_level(captured):
    cap = captured("numavm")
    s = VmStat(str(cap.root))
    v = rates(s, cap, ["vmstat::numa_hit", "vmstat::pgfault", "vmstat::nr_free_pages",
                       "vmstat::pgmajfault", "vmstat::numa_other"])  # fmt: skip
    assert v == {
        "vmstat::nr_free_pages": (465951 - 483012) / DT,  # -34122 pages/s: memory taken
        "vmstat::numa_hit": (17006 - 15792) / DT,
        "vmstat::numa_other": 0.0,
        "vmstat::pgfault": (5152 - 4264) / DT,
        "vmstat::pgmajfault": 2.0,
    }
    assert v["vmstat::nr_free_pages"] == -34122.0


def test_vmstat_events_and_defaults(captured):
    s = VmStat(str(captured("host").root))
    evs = {e.id: e for e in s.events()}
    assert len(evs) == 192  # every line of the captured file
    assert evs["vmstat::numa_miss"].unit == "pages/s"
    assert evs["vmstat::pgfault"].unit == "faults/s"
    assert evs["vmstat::pgpgin"].unit == "kB/s"
    assert all(e.kind == "counter" for e in evs.values())
    assert s.defaults()[:3] == ["vmstat::numa_hit", "vmstat::numa_miss", "vmstat::numa_foreign"]
    assert s.heading(evs["vmstat::numa_miss"]) == "miss"


def test_vmstat_host_capture(captured):
    cap = captured("host")
    v = rates(VmStat(str(cap.root)), cap, ["vmstat::numa_hit", "vmstat::nr_free_pages"], 0.25)
    assert v == {"vmstat::nr_free_pages": -75396.0, "vmstat::numa_hit": 71320.0}


# -- numastat + meminfo -----------------------------------------------------------------


def test_numastat_per_node(captured):
    cap = captured("numavm")
    s = NumaStat(str(cap.root))
    assert s.present()
    assert sorted({e.source for e in s.events()}) == ["node0", "node1", "node2"]
    ids = [f"numastat:node{n}:{e}" for n in range(3) for e in ("numa_hit", "other_node")]
    ids += ["numastat:node1:MemFree", "numastat:node1:MemUsed", "numastat:node2:MemUsed"]
    v = rates(s, cap, ids)
    assert v == {
        "numastat:node0:numa_hit": (4140 - 3648) / DT,
        "numastat:node0:other_node": 0.0,
        "numastat:node1:numa_hit": (11764 - 11046) / DT,
        "numastat:node1:other_node": 0.0,
        "numastat:node1:MemFree": 574728,  # gauges: the second snapshot, as read
        "numastat:node1:MemUsed": 112976,
        "numastat:node2:numa_hit": 0.0,
        "numastat:node2:other_node": 0.0,
        "numastat:node2:MemUsed": 9440,
    }
    assert v["numastat:node0:numa_hit"] == 984.0


def test_numastat_units_kinds_defaults(captured):
    s = NumaStat(str(captured("numavm").root))
    evs = {e.id: e for e in s.events()}
    assert evs["numastat:node1:numa_miss"].kind == "counter"
    assert evs["numastat:node1:numa_miss"].unit == "pages/s"
    assert evs["numastat:node1:MemFree"].kind == "gauge"
    assert evs["numastat:node1:MemFree"].unit == "kB"
    assert evs["numastat:node1:HugePages_Total"].unit == "pages"
    d = s.defaults()
    assert "numastat:node2:MemFree" in d and "numastat:node2:Dirty" not in d
    assert len([i for i in d if i.startswith("numastat:node0:")]) == 8


def test_meminfo_reread_period(captured):
    """Between two meminfo reads the last value is repeated; numastat is always fresh."""
    cap = captured("numavm")
    s = NumaStat(str(cap.root))
    s.meminfo_period = 3600.0
    s.present()
    s.enable(["numastat:node1:numa_hit", "numastat:node1:MemFree"])
    s.prime(1.0)
    cap.advance()
    v = s.sample(1.5)
    s.close()
    assert v == [(11764 - 11046) / 0.5, 642496]  # MemFree still snapshot a's


def test_numastat_absent_without_nodes(tmp_path):
    s = NumaStat(str(tmp_path))
    assert not s.present() and "CONFIG_NUMA" in s.reason


# -- /proc/stat ------------------------------------------------------------------------------


def test_cpu_shares_and_counters(captured):
    cap = captured("numavm")
    ids = ["cpu::user", "cpu::system", "cpu::idle", "cpu::softirq", "cpu:cpu0:user",
           "cpu:cpu0:system", "cpu:cpu0:idle", "cpu:cpu1:iowait", "cpu::ctxt", "cpu::forks",
           "cpu::intr", "cpu::procs_running"]  # fmt: skip
    v = rates(ProcStat(str(cap.root)), cap, ids)
    # all CPUs: 248 ticks passed (1486 - 1238); cpu0: 128 ticks (758 - 630)
    assert v["cpu::user"] == pytest.approx(100 * 27 / 248)
    assert v["cpu::system"] == pytest.approx(100 * 46 / 248)
    assert v["cpu::idle"] == pytest.approx(100 * 173 / 248)
    assert v["cpu::softirq"] == pytest.approx(100 * 2 / 248)
    assert v["cpu:cpu0:user"] == 6.25
    assert v["cpu:cpu0:system"] == 4.6875
    assert v["cpu:cpu0:idle"] == 89.0625
    assert v["cpu:cpu1:iowait"] == 0.0
    assert v["cpu::ctxt"] == (7230 - 4909) / DT
    assert v["cpu::forks"] == 10.0
    assert v["cpu::intr"] == (7420 - 5718) / DT
    assert v["cpu::procs_running"] == 1


def test_cpu_events(captured):
    s = ProcStat(str(captured("host").root))
    evs = {e.id: e for e in s.events()}
    assert "cpu:cpu1:steal" in evs and "cpu:cpu2:user" not in evs
    assert evs["cpu::user"].unit == "%" and evs["cpu::user"].kind == "gauge"
    assert evs["cpu::ctxt"].kind == "counter" and evs["cpu::ctxt"].unit == "switches/s"
    assert evs["cpu::procs_blocked"].kind == "gauge"
    assert len(evs) == 3 * 8 + 6
    assert s.heading(evs["cpu::user"]) == "us" and s.heading(evs["cpu::ctxt"]) == "cs"


def test_cpu_no_ticks_gives_zero(captured):
    cap = captured("host")
    s = ProcStat(str(cap.root))
    s.present()
    s.enable(["cpu:cpu0:user"])
    s.prime(1.0)
    assert s.sample(1.1) == [0.0]  # same snapshot: no tick passed, no division by zero
    s.close()


# -- PSI -------------------------------------------------------------------------------------


def test_psi(captured):
    cap = captured("host")
    s = Psi(str(cap.root))
    ids = ["psi::cpu_some_avg10", "psi::cpu_some_total", "psi::io_full_total",
           "psi::io_some_avg10", "psi::memory_full_avg10"]  # fmt: skip
    v = rates(s, cap, ids, dt=0.25)
    assert v == {
        "psi::cpu_some_avg10": 20.42,
        "psi::cpu_some_total": (2963268158 - 2963241611) / 0.25,  # us of stall per second
        "psi::memory_full_avg10": 0.0,
        "psi::io_some_avg10": 0.11,
        "psi::io_full_total": 392.0,
    }


def test_psi_events_and_absence(captured, tmp_path):
    s = Psi(str(captured("numavm").root))
    evs = {e.id: e for e in s.events()}
    assert len(evs) == 12  # cpu, memory, io x some, full x avg10, total
    assert evs["psi::memory_full_total"].unit == "us/s"
    assert evs["psi::memory_full_avg10"].kind == "gauge"
    assert s.heading(evs["psi::io_some_avg10"]) == "ios10"
    absent = Psi(str(tmp_path))
    assert not absent.present()
    assert "CONFIG_PSI" in absent.reason


def test_psi_disabled_reason(tmp_path):
    (tmp_path / "proc" / "pressure").mkdir(parents=True)
    (tmp_path / "proc" / "pressure" / "cpu").mkdir()  # unreadable as a file: EISDIR
    s = Psi(str(tmp_path))
    assert not s.present()
    assert "psi=1" in s.reason


# -- perf software events ------------------------------------------------------------------


def test_perf_refused_says_why(monkeypatch, tmp_path):
    def refuse(*a, **k):
        raise OSError(errno.EACCES, "Permission denied")

    (tmp_path / "proc" / "sys" / "kernel").mkdir(parents=True)
    (tmp_path / "proc" / "sys" / "kernel" / "perf_event_paranoid").write_text("2\n")
    monkeypatch.setattr(perfevent, "open_counter", refuse)
    s = PerfSoftware(str(tmp_path))
    assert not s.present()
    assert s.reason.startswith("perf_event_paranoid=2 forbids system-wide perf events")
    assert "CAP_PERFMON" in s.reason


def test_perf_group_read_layout(monkeypatch):
    """Values come back in enabled order, one group per CPU: [nr, v1, v2, ...]."""
    import struct

    reads = {10: struct.pack("<3Q", 2, 7, 9), 20: struct.pack("<3Q", 2, 70, 90)}
    fds = iter([10, 11, 20, 21])
    monkeypatch.setattr(perfevent, "open_counter", lambda *a, **k: next(fds))
    monkeypatch.setattr(perfevent.os, "read", lambda fd, n: reads[fd])
    monkeypatch.setattr(perfevent.os, "close", lambda fd: None)
    monkeypatch.setattr(perfevent, "online_cpus", lambda root="/": [0, 1])
    s = PerfSoftware()
    s._present, s.reason, s._cpus = True, "", [0, 1]
    s.enable(["perf:cpu0:context-switches", "perf:cpu0:page-faults",
              "perf:cpu1:context-switches", "perf:cpu1:page-faults"])  # fmt: skip
    assert s.read() == [7, 9, 70, 90]
    assert s.rate == 100.0
    reads[10], reads[20] = struct.pack("<3Q", 2, 17, 9), struct.pack("<3Q", 2, 170, 91)
    s._prev, s._prev_t = [7, 9, 70, 90], 0.0
    assert s.sample(0.5) == [20.0, 0.0, 200.0, 2.0]


@pytest.mark.skipif(not PerfSoftware().present(), reason="system-wide perf events refused here")
def test_perf_counts_context_switches_for_real():
    import os
    import time

    s = PerfSoftware()
    cpus = sorted({e.source for e in s.events()})
    s.enable([f"perf:{c}:context-switches" for c in cpus])
    s.prime(time.monotonic())
    for _ in range(50):
        os.sched_yield()
        time.sleep(0.001)
    v = s.sample(time.monotonic())
    s.close()
    assert sum(v) > 0


# -- PMU -------------------------------------------------------------------------------------


def test_pmu_event_encoding():
    assert parse_bits("config:0-7,21") == ("config", [*range(8), 21])
    fmts = {"event": "config:0-7", "umask": "config:8-15", "edge": "config:18",
            "cmask": "config:24-31", "inv": "config:23", "ch": "config1:0-3"}  # fmt: skip
    assert encode_event("event=0x3c,umask=0x01", fmts) == (0x013C, 0, 0)
    assert encode_event("event=0xd1,umask=0x20,cmask=2,edge", fmts) == (
        0xD1 | 0x20 << 8 | 1 << 18 | 2 << 24,
        0,
        0,
    )
    assert encode_event("event=0x04,ch=0x5", fmts) == (0x04, 0x5, 0)
    # a value wider than a split field spreads over its bits in order
    assert encode_event("x=0x1ff", {"x": "config:0-7,21"}) == (0xFF | 1 << 21, 0, 0)
    with pytest.raises(ValueError):
        encode_event("bogus=1", fmts)


def fake_sysfs(root, with_core=True):
    dev = root / "sys" / "bus" / "event_source" / "devices"
    (dev / "software").mkdir(parents=True)
    if with_core:
        (dev / "cpu").mkdir()
        (dev / "cpu" / "type").write_text("4\n")
    imc = dev / "uncore_imc_0"
    (imc / "events").mkdir(parents=True)
    (imc / "format").mkdir()
    (imc / "type").write_text("17\n")
    (imc / "cpumask").write_text("0,2\n")
    (imc / "format" / "event").write_text("config:0-7\n")
    (imc / "format" / "umask").write_text("config:8-15\n")
    (imc / "events" / "cas_count_read").write_text("event=0x04,umask=0x03\n")
    (imc / "events" / "cas_count_read.scale").write_text("6.103515625e-5\n")
    (imc / "events" / "cas_count_read.unit").write_text("MiB\n")
    (imc / "events" / "clockticks").write_text("event=0x00\n")
    (root / "sys" / "devices" / "system" / "cpu").mkdir(parents=True)
    (root / "sys" / "devices" / "system" / "cpu" / "online").write_text("0-3\n")


class FakeGroup:
    opened: list = []

    def __init__(self, events, cpu):
        self.events, self.cpu = events, cpu
        self.count = 0

    def fetch(self):
        self.count += 1000
        # (time enabled, time running, values...): multiplexed half of the time
        return (2000, 1000, *[self.count * (i + 1) for i in range(len(self.events))])

    def parse(self, raw):
        return raw

    def close(self):
        pass


def fake_open(events, cpu, timed=False):
    g = FakeGroup(events, cpu)
    FakeGroup.opened.append(g)
    return g


def test_pmu_absent_here_says_why(tmp_path):
    (tmp_path / "sys" / "bus" / "event_source" / "devices" / "software").mkdir(parents=True)
    s = Pmu(str(tmp_path))
    assert not s.present()
    assert s.reason.startswith("no hardware PMU in /sys/bus/event_source/devices")
    assert "software" in s.reason


def test_pmu_core_and_uncore_from_sysfs(tmp_path):
    fake_sysfs(tmp_path)
    FakeGroup.opened = []
    s = Pmu(str(tmp_path), open_group=fake_open)
    assert s.present(), s.reason
    evs = {e.id: e for e in s.events()}
    assert "pmu:cpu3:instructions" in evs
    assert evs["pmu:uncore_imc_0.cpu2:cas_count_read"].unit == "MiB/s"
    assert "pmu:uncore_imc_0.cpu0:clockticks" in evs
    assert "pmu:cpu0:cycles" in s.defaults()
    assert "pmu:uncore_imc_0.cpu0:cas_count_read" in s.defaults()
    FakeGroup.opened = []
    s.enable(["pmu:cpu0:cycles", "pmu:cpu0:instructions", "pmu:uncore_imc_0.cpu2:cas_count_read"])
    core, imc = FakeGroup.opened
    assert core.cpu == 0 and [e[1] for e in core.events] == [0, 1]
    assert imc.cpu == 2 and imc.events == [(17, 0x0304, 0, 0)]
    s.prime(0.0)
    v = s.sample(0.5)
    # each read adds 1000 x (i+1) raw counts, running half the enabled time: x2 scaling
    assert v == [4000.0, 8000.0, 4000.0 * 6.103515625e-5]


def test_pmu_refused(tmp_path):
    fake_sysfs(tmp_path)
    (tmp_path / "sys" / "bus" / "event_source" / "devices" / "uncore_imc_0" / "events").rename(
        tmp_path / "gone"
    )

    def refuse(events, cpu, timed=False):
        raise OSError(errno.EACCES, "Permission denied")

    s = Pmu(str(tmp_path), open_group=refuse)
    assert not s.present()
    assert "forbids system-wide perf events" in s.reason
