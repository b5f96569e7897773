"""Symbolization of a real binary: functions and lines of code, names of static locks."""

import os
import shutil
import subprocess

import pytest

from locus.symbolize import Symbolizer

SRC = r"""
#include <pthread.h>
#include <stdio.h>
pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static long counter;
__attribute__((noinline)) void *work(void *a) {
  pthread_mutex_lock(&queue_lock);
  counter++;
  printf("%p %p %p\n", (void *)&queue_lock, (void *)&counter, __builtin_return_address(0));
  pthread_mutex_unlock(&queue_lock);
  return a;
}
int main(int argc, char **argv) {
  FILE *in = fopen("/proc/self/maps", "r"), *out = fopen(argv[1], "w");
  int c;
  while ((c = fgetc(in)) != EOF) fputc(c, out);
  fclose(out);
  work(0);
  return 0;
}
"""


@pytest.fixture(scope="module")
def prog(tmp_path_factory):
    if not shutil.which("cc"):
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("sym")
    (d / "p.c").write_text(SRC)
    exe = str(d / "p")
    subprocess.run(
        ["cc", "-g", "-O0", "-pie", "-fPIE", str(d / "p.c"), "-o", exe, "-lpthread"], check=True
    )
    out = subprocess.run([exe, str(d / "maps")], capture_output=True, text=True, check=True)
    lock, counter, ret = (int(x, 16) for x in out.stdout.split())
    return (d / "maps").read_text(), lock, counter, ret


@pytest.mark.parametrize("tool", ["llvm-symbolizer", "addr2line"])
def test_code_and_data(prog, tool):
    if not shutil.which(tool):
        pytest.skip(f"{tool} missing")
    maps, lock, counter, ret = prog
    s = Symbolizer(maps, tool=tool)
    loc = s.code([ret])[ret]
    assert loc.function == "main" and os.path.basename(loc.file) == "p.c" and loc.line == 18
    names = s.data([lock, counter + 2])
    assert names[lock] == "queue_lock"
    assert names[counter + 2] == "counter+2"
    # Sizes from the symbol table: a pthread_mutex_t is 40 bytes, a long 8.
    assert (s.data_size("queue_lock"), s.data_size("counter")) == (40, 8)


def test_no_tool_gives_empty(prog):
    maps, lock, _counter, ret = prog
    s = Symbolizer(maps, tool=None)
    s.tool = None
    assert s.code([ret])[ret].function == ""
    assert s.data([0x10])[0x10] is None


def test_module_offset_for_stripped_code(prog):
    """Without symbols, a code address is named module+offset (the ELF virtual address),
    the same in every run of the binary whatever ASLR chose."""
    maps, _lock, _counter, ret = prog
    s = Symbolizer(maps, tool=None)
    where = s.module_offset(ret)
    assert where is not None and where.startswith("p+0x")
    v = int(where.split("+")[1], 16)
    assert 0 < v < 0x100000 and v != ret
    assert s.module_offset(0x10) is None


def test_section_of_static_data(prog, tmp_path):
    """An address in a module is (module, section, ELF virtual address): `counter` and
    `queue_lock` (zero-initialised) are in .bss at the virtual addresses the symbol table
    gives them, code in .text; a stripped copy keeps its sections."""
    maps, lock, counter, ret = prog
    exe = next(ln.split()[-1] for ln in maps.splitlines() if ln.endswith("/p"))
    nm = subprocess.run(["nm", exe], capture_output=True, text=True, check=True).stdout
    sym = {p[2]: int(p[0], 16) for p in (ln.split() for ln in nm.splitlines()) if len(p) == 3}
    s = Symbolizer(maps, tool=None)
    assert s.section(counter + 3) == ("p", ".bss", sym["counter"] + 3)
    assert s.section(lock) == ("p", ".bss", sym["queue_lock"])
    assert s.section(ret)[1] == ".text"
    assert s.section(0x10) is None
    stripped = tmp_path / "p"
    subprocess.run(["strip", "-o", str(stripped), exe], check=True)
    s = Symbolizer(maps.replace(exe, str(stripped)), tool=None)
    assert s.section(counter) == ("p", ".bss", sym["counter"])


@pytest.mark.parametrize("how", ["debuglink", "build-id", "other-build"])
def test_a_stripped_modules_separate_debug_file(prog, tmp_path, monkeypatch, how):
    """A stripped program with its debug information in a separate file (a Debian -dbgsym
    package's, under /usr/lib/debug/.build-id; or beside it, named by .gnu_debuglink), as
    gdb finds it: its static data and code are named from that file, and its DWARF is read
    there (the report named `counter` "line 0x4040 of p .bss (no symbol)"). A debug file of
    another build (another build ID) is not taken."""
    from locus import symbolize

    maps, lock, counter, ret = prog
    exe = next(ln.split()[-1] for ln in maps.splitlines() if ln.endswith("/p"))
    d = tmp_path / "bin"
    d.mkdir()
    stripped, debug = d / "p", tmp_path / "p.debug"
    subprocess.run(["objcopy", "--only-keep-debug", exe, str(debug)], check=True)
    subprocess.run(["strip", "-o", str(stripped), exe], check=True)
    notes = subprocess.run(["readelf", "-n", exe], capture_output=True, text=True).stdout
    build_id = notes.split("Build ID:")[1].split()[0]
    root = tmp_path / "debugroot"
    monkeypatch.setenv("LOCUS_DEBUG_DIRS", str(root))
    monkeypatch.setenv("DEBUGINFOD_CACHE_PATH", str(tmp_path / "nocache"))
    assert symbolize.debug_file(str(stripped)) == str(stripped)  # none installed
    if how == "debuglink":
        link = d / "p.linked"
        subprocess.run(
            ["objcopy", f"--add-gnu-debuglink={debug}", str(stripped), str(link)], check=True
        )
        os.replace(debug, d / "p.debug")
        stripped = link
    else:
        where = root / ".build-id" / build_id[:2]
        where.mkdir(parents=True)
        if how == "other-build":
            # The same program built again, with another build ID.
            other = tmp_path / "other"
            src = os.path.join(os.path.dirname(exe), "p.c")
            subprocess.run(
                ["cc", "-g", "-O0", "-Wl,--build-id=0x1234", src, "-o", str(other), "-lpthread"],
                check=True,
            )
            subprocess.run(["objcopy", "--only-keep-debug", str(other), str(debug)], check=True)
        os.replace(debug, where / f"{build_id[2:]}.debug")
    symbolize._DEBUG_CACHE.clear()  # (its first answer: none installed)
    found = symbolize.debug_file(str(stripped))
    s = Symbolizer(maps.replace(exe, str(stripped)), tool="llvm-symbolizer")
    if not shutil.which("llvm-symbolizer"):
        pytest.skip("llvm-symbolizer missing")
    names = s.data([lock, counter + 2])
    if how == "other-build":
        assert found == str(stripped)
        assert names[lock] is None
        return
    assert found != str(stripped) and os.path.isfile(found)
    assert names[lock] == "queue_lock" and names[counter + 2] == "counter+2"
    assert s.data_size("queue_lock") == 40
    loc = s.code([ret])[ret]
    assert loc.function == "main" and loc.line == 18 and loc.module == stripped.name
    layout = s.data_layout("queue_lock", lock)
    assert layout is not None and layout.size == 40


def test_user_frame_and_rust_names():
    """An inline chain (innermost first) is named by its innermost frame in the program's
    own source; all-library chains keep the outermost function with the innermost line;
    Rust's legacy names lose their hash and escapes."""
    from locus.symbolize import rust_clean, user_frame

    chain = [
        {"FunctionName": "std::__atomic_base<long>::fetch_add", "Line": 631,
         "FileName": "/usr/include/c++/12/bits/atomic_base.h"},
        {"FunctionName": "worker", "Line": 18, "FileName": "/home/u/app/fs.cpp"},
        {"FunctionName": "std::thread::_State_impl::_M_run", "Line": 211,
         "FileName": "/usr/include/c++/12/bits/std_thread.h"},
    ]  # fmt: skip
    loc = user_frame(chain)
    assert (loc.function, loc.file, loc.line) == ("worker", "/home/u/app/fs.cpp", 18)
    lib = [chain[0], chain[2]]
    loc = user_frame(lib)
    assert (loc.function, loc.line) == ("std::thread::_State_impl::_M_run", 631)
    assert loc.file.endswith("atomic_base.h")
    rust = [
        {"FunctionName": "core::sync::atomic::atomic_add", "Line": 3900,
         "FileName": "/rustc/59807616/library/core/src/sync/atomic.rs"},
        {"FunctionName": "fs::main::_$u7b$$u7b$closure$u7d$$u7d$::h8c7c6d5eacda6835",
         "Line": 18, "FileName": "/tmp/rs/fs.rs"},
    ]  # fmt: skip
    assert user_frame(rust).function == "fs::main::{{closure}}"
    assert rust_clean("_$LT$T$u20$as$u20$core..fmt..Debug$GT$::fmt::h0123456789abcdef") == (
        "<T as core::fmt::Debug>::fmt"
    )
    assert rust_clean("std::vector<int>::push_back") == "std::vector<int>::push_back"


def test_fortran_module_names():
    """gfortran's and Intel Fortran's module symbols read as the source names them."""
    from locus.symbolize import clean_name, fortran_clean

    assert fortran_clean("__counters_MOD_hits") == "counters::hits"
    assert fortran_clean("__counters_MOD_hits+8") == "counters::hits+8"
    assert fortran_clean("__my_mod_MOD_step._omp_fn.0") == "my_mod::step._omp_fn.0"
    assert fortran_clean("counters_mp_hits_") == "counters::hits"
    for other in ("MAIN__", "dgemm_", "hits+16", "__x_MOD_", "std::vector<int>"):
        assert fortran_clean(other) == other
    assert clean_name("__counters_MOD_sub") == "counters::sub"


def test_rust_thread_local_statics_are_named_by_their_path():
    """Rust's `thread_local!` keeps the variable in a static of the macro's closure: it is
    named by the macro's static (`r::TALLY`), in both manglings; other names unchanged."""
    from locus.symbolize import tls_shown

    assert tls_shown("r::TALLY::{{constant}}::{{closure}}::__RUST_STD_INTERNAL_VAL") == "r::TALLY"
    v0 = "std::io::stdio::OUTPUT_CAPTURE::{K#0}::{closure#0}::__RUST_STD_INTERNAL_VAL"
    assert tls_shown(v0) == "std::io::stdio::OUTPUT_CAPTURE"
    for other in ("tally", "stats::tally", "__RUST_STD_INTERNAL_VAL"):
        assert tls_shown(other) == other


def test_a_copy_of_a_files_code_mapped_elsewhere_is_named(prog):
    """A file's code mapped a second time at another address (V8 maps its embedded builtins
    again near each isolate's heap) is named as the original: a module of its own, limited
    to the addresses it maps; the file's own module (.bss included) is unchanged."""
    maps, lock, counter, ret = prog
    text = next(ln for ln in maps.splitlines() if ln.split()[1] == "r-xp" and ln.endswith("/p"))
    lo, hi = (int(x, 16) for x in text.split()[0].split("-"))
    where = 0x7E0000000000
    copy = text.replace(text.split()[0], f"{where:x}-{where + hi - lo:x}", 1)
    s = Symbolizer(maps + "\n" + copy, tool="addr2line" if shutil.which("addr2line") else None)
    if s.tool is None:
        pytest.skip("no symbolizer")
    moved = ret - lo + where
    got = s.code([ret, moved, where + hi - lo + 16])
    assert got[moved].function == got[ret].function == "main" and got[moved].line == 18
    assert got[where + hi - lo + 16].function == ""  # past the copy: not the file's
    assert s.data([lock, counter]) == {lock: "queue_lock", counter: "counter"}


def test_a_file_mapped_during_the_run_is_named(prog, tmp_path):
    """A file mapped and unmapped between the maps copies at start and exit (a worker's copy
    of V8's builtins, gone when the worker ends) is named from the runtime's mmap record
    (allocs.bin, its path from mapped_files.txt); an address past the mapping is not."""
    import numpy as np

    from locus import symbolize
    from locus.rundir import AL_MMAP, ALF_FILE, ALLOC_DTYPE, RunDir
    from locus.synth import SynthRun

    maps, _lock, _counter, ret = prog
    text = next(ln for ln in maps.splitlines() if ln.split()[1] == "r-xp" and ln.endswith("/p"))
    span, _perm, off, dev, ino, path = text.split()
    lo, hi = (int(x, 16) for x in span.split("-"))
    run = SynthRun(duration_s=1.0)
    run.proc(pid=7).thread(7, 0.0, 1.0)
    proc = RunDir.open(run.write(str(tmp_path / "r"))).procs[0]
    where = 0x7E0000000000
    a = np.zeros(1, dtype=ALLOC_DTYPE)
    a["t"], a["addr"], a["size"], a["tid"] = 1000, where, hi - lo, 7
    a["kind"], a["flags"] = AL_MMAP, ALF_FILE
    a["reserved"][0] = (int(off, 16), int(ino))
    major, minor = (int(x, 16) for x in dev.split(":"))
    a["dev"] = os.makedev(major, minor)
    a.tofile(proc.file("allocs.bin"))
    with open(proc.file("mapped_files.txt"), "w") as f:
        f.write(f"{ino} {os.makedev(major, minor)} {path}\n")
    s = symbolize.for_proc(proc)
    if s.tool is None:
        pytest.skip("no symbolizer")
    got = s.code([ret - lo + where, where + hi - lo + 16])
    assert (got[ret - lo + where].function, got[ret - lo + where].line) == ("main", 18)
    assert got[where + hi - lo + 16].function == ""


def test_jit_code_named_by_the_perf_map():
    """Code outside every module (a JIT's) is named by the process's perf map, newest entry
    first (V8 and the JVM reuse code space); an address in no entry stays unknown, and data
    lookups never use it."""
    from locus.symbolize import JIT_MODULE

    perf_map = "\n".join(
        [
            "7f0000001000 100 LazyCompile:~worker /app/share.js:12",
            "7f0000001080 40 LazyCompile:*worker /app/share.js:12",  # recompiled over it
            "7f0000002000 20 Interpreter",
            "junk line",
        ]
    )
    s = Symbolizer("", tool=None, perf_map=perf_map)
    got = s.code([0x7F0000001010, 0x7F0000001090, 0x7F0000002000, 0x7F0000003000], False)
    assert got[0x7F0000001010].function == "LazyCompile:~worker /app/share.js:12"
    assert got[0x7F0000001090].function == "LazyCompile:*worker /app/share.js:12"
    assert got[0x7F0000001090].module == JIT_MODULE
    assert got[0x7F0000002000].function == "Interpreter"
    assert got[0x7F0000003000].function == ""
    assert s.data([0x7F0000001010]) == {0x7F0000001010: None}


def test_inlined_lambda_named_by_its_type():
    """gcc's DWARF names an inlined lambda's call operator `operator()`: the frames it is
    inlined into carry its type (std::thread's invoker, std::__invoke)."""
    from locus.symbolize import user_frame

    inc = "/usr/include/c++/12/bits/"
    invoke = "__invoke_impl<void, Worker::run(int) const::<lambda(int)> >"
    frames = [
        {"FunctionName": "fetch_add", "FileName": inc + "atomic_base.h", "Line": 618},
        {"FunctionName": "operator()", "FileName": "/src/w.cpp", "Line": 9},
        {"FunctionName": invoke, "FileName": inc + "invoke.h", "Line": 61},
    ]
    loc = user_frame(frames)
    assert (loc.function, loc.line) == ("Worker::run(int) const::<lambda(int)>", 9)
    # Without such a frame the name stays what the debug information says.
    assert user_frame(frames[:2]).function == "operator()"


@pytest.mark.parametrize(
    "outer,name",
    [
        ("__invoke_impl<void, foo<int>(int)::<lambda()> >", "foo<int>(int)::<lambda()>"),
        (
            "_Invoker<std::tuple<main()::<lambda()>::operator()() const::<lambda()> > >",
            "main()::<lambda()>::operator()() const::<lambda()>",  # the inner one
        ),
        ("_M_run", "operator()"),
    ],
)
def test_lambda_types_in_template_arguments(outer, name):
    from locus.symbolize import lambda_name

    assert lambda_name("operator()", [outer]) == name


def test_perf_map_skips_torn_lines():
    """node's /tmp/perf-PID.map with two writers' lines interleaved (a 17-digit start) and a
    run of NULs: OverflowError from numpy took the whole report down."""
    from locus.symbolize import PerfMap

    p = PerfMap(
        "3a3f60cde4c25abc8 5 Script:~ x\n7f00 10 good\n\0\0\0 1 2\nffffffffffffffff 2 end\n"
    )
    assert p.names == ["good"] and p.lookup(0x7F05) == "good"
