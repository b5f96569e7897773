"""`locus cc`: the compiler wrapper adds the instrumentation and links liblocus.so."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from locus import cc

REPO = Path(__file__).resolve().parents[3]
LIBLOCUS = REPO / "build" / "liblocus.so"

PROGRAM = r"""
#include <stdio.h>
int shared[16];
int main(int argc, char **argv) {
  (void)argv;
  for (int i = 0; i < 16; i++) shared[i] = i * argc;
  long s = 0;
  for (int i = 0; i < 16; i++) s += shared[i];
  printf("%ld\n", s);
  return 0;
}
"""


def undefined(binary: Path) -> set[str]:
    """The undefined symbols of `binary` (nm -u)."""
    out = subprocess.run(["nm", "-u", str(binary)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in out.stdout.splitlines() if line.strip()}


@pytest.fixture
def src(tmp_path: Path) -> Path:
    if shutil.which("nm") is None or shutil.which("cc") is None:
        pytest.skip("needs cc and nm")
    p = tmp_path / "prog.c"
    p.write_text(PROGRAM)
    return p


def needs_lib() -> None:
    if not LIBLOCUS.exists():
        pytest.skip("build/liblocus.so is not built: run `make build`")


def test_gcc_flags_compile_only_and_link(monkeypatch):
    monkeypatch.setenv("CC", "gcc")
    cmd, specs = cc.build_command(["-O2", "-c", "a.c"], cxx=False)
    assert cmd[0] == "gcc" and "-fsanitize=thread" in cmd and specs is None
    assert "-llocus" not in cmd
    cmd, _ = cc.build_command(["-c", "a.c"], cxx=False, asdir=Path("/t"))
    assert "-B/t/" in cmd and "-fno-integrated-as" not in cmd
    cmd, specs = cc.build_command(["-O2", "-o", "a", "a.c"], cxx=False, specs=Path("x.specs"))
    # Compile and link: the sanitizer reaches cc1 only (no libtsan), liblocus is linked.
    assert "-fsanitize=thread" not in cmd and "-specs=x.specs" in cmd
    assert "-fsanitize=thread" in specs and "*cc1:" in specs
    assert "-llocus" in cmd and any(a.startswith("-Wl,-rpath,") for a in cmd)
    assert cc.WRAP_FLAG in cmd and "--wrap=memcpy" in cc.WRAP_FLAG
    assert cmd[1 : 1 + 1] == ["-specs=x.specs"] and cmd[2:6] == ["-O2", "-o", "a", "a.c"]


def test_clang_flags(monkeypatch):
    monkeypatch.setenv("CC", "clang-14")
    monkeypatch.delenv("LOCUS_CC_LTO", raising=False)
    cmd, specs = cc.build_command(["-c", "a.c"], cxx=False)
    assert specs is None and "-fsanitize=thread" in cmd and "-flto" not in cmd
    assert "-tsan-instrument-func-entry-exit=0" in cmd
    cmd, _ = cc.build_command(["a.o", "-o", "a"], cxx=False)
    assert "-fno-sanitize-link-runtime" in cmd and "-llocus" in cmd
    # gas.py as clang's assembler: only with its integrated assembler off.
    cmd, _ = cc.build_command(["-c", "a.c"], cxx=False, asdir=Path("/t"))
    assert "-B/t/" in cmd and "-fno-integrated-as" in cmd


def test_lto_flag(monkeypatch):
    monkeypatch.delenv("LOCUS_CC_LTO", raising=False)
    assert cc.lto_flag(["-O2", "-c", "a.c"]) is None
    assert cc.lto_flag(["-flto=thin", "-c", "a.c"]) == "-flto=thin"
    monkeypatch.setenv("LOCUS_CC_LTO", "1")
    assert cc.lto_flag(["-c", "a.c"]) == "-flto"
    assert cc.lto_flag(["-flto", "-fno-lto", "-c", "a.c"]) is None
    monkeypatch.setenv("CC", "clang-14")
    cmd, _ = cc.build_command(["a.o", "-o", "a"], cxx=False, hooks=Path("/t/h.o"))
    assert "-flto" in cmd and cmd.index("/t/h.o") < cmd.index("-llocus")
    assert cc.WRAP_FLAG not in cmd  # LTO makes memcpy calls after symbol resolution


def test_lto_with_gcc_is_refused(monkeypatch, capsys):
    needs_lib()
    monkeypatch.setenv("CC", "gcc")
    monkeypatch.setenv("LOCUS_CC_LTO", "1")
    assert cc.main(["-O2", "-o", "x", "x.c"]) == 2
    assert "needs clang" in capsys.readouterr().err


def test_static_link_is_refused(capsys):
    """liblocus.so cannot be linked statically: a clear error, not ld's "cannot find
    -llocus"; compiling an object with -static in the flags is fine."""
    assert cc.main(["-static", "-o", "app", "app.c"]) == 2
    err = capsys.readouterr().err
    assert "-static cannot be used" in err and "link dynamically" in err


def test_never_wraps_itself(monkeypatch):
    monkeypatch.setenv("CC", "locus cc")
    monkeypatch.delenv("LOCUS_CC", raising=False)
    assert cc.compiler(False) == ["cc"]
    monkeypatch.setenv("CXX", "/usr/bin/g++ -m64")
    assert cc.compiler(True) == ["/usr/bin/g++", "-m64"]


def test_library_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("LOCUS_LIB", raising=False)
    assert cc.library_dir() == REPO / "build"
    monkeypatch.setenv("LOCUS_LIB", str(tmp_path / "liblocus.so"))
    assert cc.library_dir() == tmp_path


def test_builds_and_runs(src, tmp_path, monkeypatch):
    needs_lib()
    monkeypatch.delenv("LOCUS_LIB", raising=False)
    monkeypatch.setenv("CC", "cc")
    exe = tmp_path / "prog"
    assert cc.main(["-O2", "-o", str(exe), str(src)]) == 0
    syms = undefined(exe)
    # int stores: __tsan_write4, or __tsan_write16 where gcc's plugin let them be vectorised.
    assert "__tsan_init" in syms and syms & {"__tsan_write4", "__tsan_write16"}, syms
    assert syms & {"__tsan_read4", "__tsan_read16"}, syms
    assert not any("tsan" in line for line in _ldd(exe)), "libtsan must not be linked"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCUS_")}
    out = subprocess.run([str(exe), "x"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == str(2 * sum(range(16)))


@pytest.mark.parametrize("how", ["default", "pipe", "calls"])
def test_gcc_hit_test_inlined_in_the_assembly(src, tmp_path, monkeypatch, how):
    """gcc builds get the hit test in the program (gas.py rewrote the hook calls: the code
    reads locus_xt, and keeps the calls for misses), also with -pipe (the assembly on the
    assembler's standard input); LOCUS_CC_INLINE=0 keeps a plain call per access. The
    program runs and computes the same without locus."""
    needs_lib()
    monkeypatch.setenv("CC", "gcc")
    monkeypatch.setenv("LOCUS_CC_INLINE", "0" if how == "calls" else "1")
    exe = tmp_path / f"prog_{how}"
    extra = ["-pipe"] if how == "pipe" else []
    assert cc.main(["-O2", *extra, "-o", str(exe), str(src)]) == 0
    syms = undefined(exe)
    assert syms & {"__tsan_write4", "__tsan_write16"}, syms
    assert ("locus_xt" in syms) == (how != "calls"), syms
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCUS_")}
    out = subprocess.run([str(exe), "x"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == str(2 * sum(range(16)))


def test_compile_then_link(src, tmp_path, monkeypatch):
    needs_lib()
    monkeypatch.setenv("CC", "cc")
    obj, exe = tmp_path / "prog.o", tmp_path / "prog2"
    assert cc.main(["-O2", "-c", "-o", str(obj), str(src)]) == 0
    assert undefined(obj) & {"__tsan_write4", "__tsan_write16"}
    assert cc.main(["-o", str(exe), str(obj)]) == 0
    assert subprocess.run([str(exe)], capture_output=True, timeout=60).returncode == 0


def test_compiler_status_is_returned(tmp_path, monkeypatch):
    needs_lib()
    monkeypatch.setenv("CC", "cc")
    bad = tmp_path / "bad.c"
    bad.write_text("int main(void) { return undeclared; }\n")
    assert cc.main(["-c", "-o", str(tmp_path / "bad.o"), str(bad)]) != 0


@pytest.mark.skipif(shutil.which("clang") is None, reason="clang is not installed")
def test_clang_builds_and_runs(src, tmp_path, monkeypatch):
    needs_lib()
    monkeypatch.setenv("CC", "clang")
    monkeypatch.delenv("LOCUS_CC_LTO", raising=False)
    exe = tmp_path / "prog_clang"
    assert cc.main(["-O2", "-o", str(exe), str(src)]) == 0
    # The hit test inlined by gas.py (clang's own assembler off), the hooks kept for misses.
    assert {"__tsan_write4", "locus_xt"} <= undefined(exe)
    assert not any("tsan" in line for line in _ldd(exe)), "libtsan must not be linked"
    p = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == "120\n"


@pytest.mark.skipif(shutil.which("clang") is None, reason="clang is not installed")
def test_clang_lto_inlines_the_hooks(src, tmp_path, monkeypatch):
    """LOCUS_CC_LTO=1: compiled and linked with -flto and lto_hooks.c, the program calls no
    hook in liblocus.so (all inlined); it runs normally without locus."""
    needs_lib()
    monkeypatch.setenv("CC", "clang")
    monkeypatch.setenv("LOCUS_CC_LTO", "1")
    obj, exe = tmp_path / "prog.o", tmp_path / "prog_lto"
    assert cc.main(["-O2", "-c", "-o", str(obj), str(src)]) == 0
    assert cc.main(["-o", str(exe), str(obj)]) == 0
    assert not {u for u in undefined(exe) if u.startswith("__tsan_")}, undefined(exe)
    assert "locus_x_slow" in undefined(exe)
    p = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == "120\n"


def _ldd(exe: Path) -> list[str]:
    if shutil.which("ldd") is None:
        return []
    return subprocess.run(["ldd", str(exe)], capture_output=True, text=True).stdout.splitlines()


FORTRAN = """\
program sums
  implicit none
  integer(8) :: a(16)
  integer :: i
  do i = 1, 16
    a(i) = i
  end do
  print '(i0)', sum(a)
end program
"""


@pytest.mark.skipif(shutil.which("gfortran") is None, reason="gfortran is not installed")
def test_fortran_builds_instrumented(tmp_path, monkeypatch):
    """LOCUS_CC=gfortran: Fortran sources get the same hooks (gfortran shares gcc's
    -fsanitize=thread, and the specs reach f951) with the hit test inlined."""
    needs_lib()
    monkeypatch.setenv("LOCUS_CC", "gfortran")
    src, exe = tmp_path / "sums.f90", tmp_path / "sums"
    src.write_text(FORTRAN)
    assert cc.main(["-O0", "-o", str(exe), str(src)]) == 0
    assert {"__tsan_write8", "locus_xt"} <= undefined(exe)
    p = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "136"


def test_assembler_directory_is_stable_per_version(tmp_path, monkeypatch):
    """The -B directory is the same from one build to the next (ccache hashes the command
    line), holds a script running gas.py, and is another one for another assembler (or
    another gas.py); where the cache cannot be written, the invocation's own directory."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    a = cc.assembler_dir("/usr/bin/as", tmp_path)
    assert (
        a == cc.assembler_dir("/usr/bin/as", tmp_path) and a.parent == tmp_path / "cache" / "locus"
    )
    script = (a / "as").read_text()
    assert "gas.py" in script and "/usr/bin/as" in script and os.access(a / "as", os.X_OK)
    assert cc.assembler_dir("/opt/binutils/bin/as", tmp_path) != a
    (tmp_path / "ro").write_text("")  # a file where the cache directory should be
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "ro"))
    own = tmp_path / "own"
    own.mkdir()
    assert cc.assembler_dir("/usr/bin/as", own) == own and (own / "as").is_file()


def test_questions_to_the_compiler_pass_through(monkeypatch, capfd):
    """`locus cc -v` (no input) added the hooks' link flags and tried to link a program
    without main (exit 1); gcc -v answers with its version (exit 0)."""
    monkeypatch.setenv("CC", "gcc")
    assert cc.main(["-v"]) == 0
    assert "gcc version" in capfd.readouterr().err
    assert cc.main(["-dumpversion"]) == 0
    assert capfd.readouterr().out.strip()[:1].isdigit()


def test_launchers_and_scripts_around_the_wrapper_do_not_recurse(monkeypatch, tmp_path):
    """CC="ccache locus cc" (make exports it to its recipes) and CC naming a script that runs
    `locus cc`: each call of the wrapper ran the wrapper again, without end."""
    monkeypatch.delenv("LOCUS_CC", raising=False)
    monkeypatch.setenv("CC", "ccache /opt/locus/locus cc")
    assert cc.compiler(False) == ["ccache", "cc"]
    monkeypatch.setenv("CC", "ccache")
    assert cc.compiler(False) == ["ccache", "cc"]
    script = tmp_path / "lcc"
    script.write_text(f'#!/bin/sh\nexec {REPO / "locus"} cc "$@"\n')
    script.chmod(0o755)
    (tmp_path / "a.c").write_text("int main(void) { return 0; }\n")
    env = {**os.environ, "CC": str(script)}
    env.pop("LOCUS_CC_ACTIVE", None)
    p = subprocess.run(
        [str(script), "-c", "-o", str(tmp_path / "a.o"), str(tmp_path / "a.c")],
        env=env, timeout=60, capture_output=True,
    )  # fmt: skip
    assert p.returncode == 0 and (tmp_path / "a.o").exists(), p.stderr


def test_werror_builds_with_fences(tmp_path, monkeypatch):
    """gcc warns at every fence under -fsanitize=thread, an error with -Werror."""
    needs_lib()
    monkeypatch.setenv("CC", "gcc")
    f = tmp_path / "f.c"
    f.write_text(
        "#include <stdatomic.h>\n_Atomic long y;\n"
        "void f(void) { atomic_thread_fence(memory_order_seq_cst); atomic_store(&y, 1); }\n"
    )
    assert cc.main(["-O2", "-Werror", "-c", "-o", str(tmp_path / "f.o"), str(f)]) == 0


def test_gcc_plugin_flag(monkeypatch):
    """The late-tsan plugin reaches cc1 with the sanitizer flags: on the command line when
    compiling only, through the specs file when compiling and linking."""
    monkeypatch.setenv("CC", "gcc")
    plugin = Path("/opt/locus/build/locus_late_tsan.so")
    cmd, specs = cc.build_command(["-O2", "-c", "a.c"], cxx=False, plugin=plugin)
    assert f"-fplugin={plugin}" in cmd and specs is None
    cmd, specs = cc.build_command(["-O2", "-o", "a", "a.c"], cxx=False, plugin=plugin)
    assert not any(a.startswith("-fplugin") for a in cmd) and f"-fplugin={plugin}" in specs
    cmd, _ = cc.build_command(["-O2", "-c", "a.c"], cxx=False)
    assert not any(a.startswith("-fplugin") for a in cmd)


PLUGIN_HEADERS = (
    Path(
        subprocess.run(
            ["gcc", "-print-file-name=plugin"], capture_output=True, text=True
        ).stdout.strip()
        or "plugin"
    )
    / "include"
    / "gcc-plugin.h"
    if shutil.which("gcc")
    else Path("/nonexistent")
)
needs_plugin = pytest.mark.skipif(
    not PLUGIN_HEADERS.exists(), reason="no gcc plugin headers (apt-get install gcc-12-plugin-dev)"
)

VECTOR_LOOP = r"""
long a[64], b[64];
_Atomic long n;
void fill(long v) { for (int i = 0; i < 64; i++) a[i] = v; }
void add(void) { for (int i = 0; i < 64; i++) a[i] += b[i]; }
long count(void) { return n++; }
void pick(int *restrict p, const int *restrict q, int m) {
  for (int i = 0; i < m; i++)
    if (q[i] > 0) p[i] = q[i];
}
"""


def _asm(tmp_path: Path, *flags: str) -> str:
    src, out = tmp_path / "vec.c", tmp_path / f"vec{len(flags)}.s"
    src.write_text(VECTOR_LOOP)
    assert cc.main(["-O2", *flags, "-S", "-o", str(out), str(src)]) == 0
    return out.read_text()


def _calls(asm: str, hook: str) -> int:
    """Calls of `hook` (and tail calls: count() ends with a jmp to its atomic)."""
    return sum(1 for w in asm.split() if w.startswith((f"*{hook}@", f"{hook}@")))


@needs_plugin
def test_gcc_instruments_after_the_vectoriser(tmp_path, monkeypatch):
    """With the plugin (runtime/cc/late_tsan.cc), gcc's tsan pass runs after the vectoriser:
    the loops keep their 16-byte vector stores, each with a __tsan_write16 (gas.py inlines
    its hit test); before, the hook calls stopped the vectoriser (one __tsan_write8 per
    word). The atomic is instrumented once either way (__tsan_atomic64_fetch_add)."""
    monkeypatch.setenv("CC", "gcc")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("LOCUS_CC_LATE_TSAN", raising=False)
    assert (REPO / "build" / cc.PLUGIN).exists(), "build/locus_late_tsan.so: run `make build`"
    assert cc.late_tsan_plugin(["gcc"]) == REPO / "build" / cc.PLUGIN
    late = _asm(tmp_path)
    assert _calls(late, "__tsan_write16") >= 2 and _calls(late, "__tsan_read16") >= 1, late
    assert any(line.split()[:1] == ["movaps"] and "(" in line for line in late.splitlines())
    assert _calls(late, "__tsan_atomic64_fetch_add") == 1
    monkeypatch.setenv("LOCUS_CC_LATE_TSAN", "0")
    assert cc.late_tsan_plugin(["gcc"]) is None
    early = _asm(tmp_path, "-DEARLY")
    assert _calls(early, "__tsan_write16") == 0 and _calls(early, "__tsan_write8") >= 2
    assert _calls(early, "__tsan_atomic64_fetch_add") == 1


@needs_plugin
def test_gcc_plugin_keeps_masked_vector_code_early(tmp_path, monkeypatch):
    """For AVX targets the vectoriser emits masked stores (vpmaskmov), which tsan does not
    instrument: there the plugin leaves the instrumentation before the vectoriser, and
    every store of pick() keeps its hook."""
    monkeypatch.setenv("CC", "gcc")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("LOCUS_CC_LATE_TSAN", raising=False)
    asm = _asm(tmp_path, "-O3", "-mavx2")
    assert "vpmaskmov" not in asm and _calls(asm, "__tsan_write4") >= 1
    assert _calls(asm, "__tsan_atomic64_fetch_add") == 1


def test_refused_plugin_falls_back(tmp_path, monkeypatch):
    """A plugin gcc does not load (built for another gcc; here not even an ELF file) is
    refused once, remembered, and the program is built as without it."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / cc.PLUGIN).write_text("not a plugin\n")
    monkeypatch.setenv("LOCUS_LIB", str(lib))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("LOCUS_CC_LATE_TSAN", raising=False)
    assert cc.late_tsan_plugin(["gcc"]) is None
    marks = list((tmp_path / "cache" / "locus").glob("late-tsan-*"))
    assert len(marks) == 1 and marks[0].read_text().strip() == "refused"
    assert cc.late_tsan_plugin(["gcc"]) is None
    monkeypatch.setenv("CC", "gcc")
    (tmp_path / "a.c").write_text("long x; void f(void) { x = 1; }\n")
    assert cc.main(["-O2", "-c", "-o", str(tmp_path / "a.o"), str(tmp_path / "a.c")]) == 0
    assert "__tsan_write8" in undefined(tmp_path / "a.o")


def test_questions_about_the_compiler_are_asked_once(tmp_path, monkeypatch):
    """What the wrapper asks the compiler about itself (`--version`, `-print-prog-name=...`)
    is remembered per compiler: a build's compiles each asked three questions, ~1.5 ms and a
    process each. A compiler that changes (its size or time) is asked again."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    log = tmp_path / "asked"
    fake = tmp_path / "mycc"  # a name that says nothing of its family: --version is asked
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec gcc "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for _ in range(3):
        assert cc.family([str(fake)]) == "gcc"
        assert cc.real_assembler([str(fake)]) == shutil.which("as")
    assert log.read_text().splitlines() == ["--version", "-print-prog-name=as"]
    fake.write_text(fake.read_text() + "# changed\n")
    assert cc.family([str(fake)]) == "gcc"
    assert log.read_text().splitlines()[-1] == "--version"


def test_a_failed_question_is_not_remembered(tmp_path, monkeypatch):
    fake = tmp_path / "broken"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert cc.ask([str(fake)], "--version") is None
    assert not list((tmp_path / "cache").glob("**/ask-*"))
