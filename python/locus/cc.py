"""`locus cc` / `locus c++`: a compiler wrapper that builds a program for the `exact` backend
of the comm lens. Every load and store of the compiled code calls back into liblocus.so,
where a cache model counts each cache-line transfer between threads (runtime/comm/exact).

    locus cc -O2 -g -pthread -o app app.c        # compile and link
    locus cc -O2 -c part.c && locus cc -o app part.o main.o

The real compiler is $LOCUS_CC / $CC (cc) for `locus cc` and $LOCUS_CXX / $CXX (c++) for
`locus c++`. Every argument is passed through unchanged; the wrapper adds

- gcc: `-fsanitize=thread --param=tsan-instrument-func-entry-exit=0` at compile time only.
  A compile-and-link invocation gets them through a specs file that hands them to cc1 /
  cc1plus, so the driver never links libtsan: liblocus.so provides the __tsan_* hooks.
- clang: the same hooks, `-fsanitize=thread -mllvm -tsan-instrument-func-entry-exit=0`, and
  `-fno-sanitize-link-runtime` when linking (else clang links libtsan). (clang's other
  option, -fsanitize-coverage=trace-loads,trace-stores, does not see atomics.)
- when linking: `-L<dir> -llocus -Wl,-rpath,<dir>`, <dir> being where liblocus.so is
  ($LOCUS_LIB, a file or a directory, else build/ of this checkout), and (without LTO)
  `-Wl,--wrap=memcpy,...`: the program's calls to memcpy, memmove, memset (and their
  _FORTIFY_SOURCE variants) go through liblocus.so, which counts their ranges.

With gcc, the hooks are put after the vectoriser when gcc loads locus's plugin
(runtime/cc/late_tsan.cc, built as locus_late_tsan.so next to liblocus.so when gcc's plugin
headers are installed, Debian's gcc-12-plugin-dev): `-fplugin=` is added to the flags above.
gcc's own tsan pass runs before the loop optimisations, and the hook calls stopped the
vectoriser: a loop of 8-byte stores that the plain build does with 16-byte vector stores
ran scalar, one hit test per word. The plugin moves the pass after it (except in functions
compiled for AVX and up, whose masked vector accesses tsan does not see). Without the
plugin, or when this gcc refuses it (another version: probed once, remembered under
~/.cache/locus), or with `LOCUS_CC_LATE_TSAN=0`, the hooks go where gcc puts them.

The hit test is inlined into the program, so that only a miss calls liblocus.so:
- by default, in the assembly: `-B<dir>/` puts gas.py in front of the assembler (with clang,
  `-fno-integrated-as` too; <dir> is ~/.cache/locus/as-<version>, the same from one build
  to the next for ccache), and gas.py rewrites each read/write hook call into the model's
  hit test (runtime/comm/exact/fast.h) with the call kept for a miss. gcc's hooks are
  builtins called after its inliner has run, so they cannot be inlined any other way.
  `LOCUS_CC_INLINE=0` keeps a call per access (1.5-2x slower).
- with clang and `LOCUS_CC_LTO=1` (or an -flto option of your own): the objects are compiled
  with -flto, and the link adds runtime/cc/lto_hooks.c compiled by the same clang, so LLVM's
  link-time inliner puts the fast path in the program's loops. It needs clang's linker plugin
  (LLVMgold, Debian's llvm package) or lld; with gcc it is refused.

The program runs normally without locus (the hooks return at once); recorded with
`locus record --lens comm` and LOCUS_COMM_BACKEND=exact it reports every transfer.
`LOCUS_CC_VERBOSE=1` prints the command run. The exit status is the compiler's.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# -fno-plt: each access calls a hook in liblocus.so; through the GOT directly, not a PLT stub.
# -Wno-tsan: gcc warns "atomic_thread_fence is not supported with -fsanitize=thread" at every
# fence (libstdc++'s atomics), an error under the build's own -Werror; the hooks do fence.
GCC_FLAGS = [
    "-fsanitize=thread",
    "--param=tsan-instrument-func-entry-exit=0",
    "-fno-plt",
    "-Wno-tsan",
]
# -Wno-unused-command-line-argument: a link step gets the -mllvm option too (LTO needs it
# there), which clang calls unused, an error under -Werror (memcached's build).
CLANG_FLAGS = [
    "-fsanitize=thread",
    "-mllvm",
    "-tsan-instrument-func-entry-exit=0",
    "-Wno-unused-command-line-argument",
]
# libc's copies, which neither compiler instruments (libtsan intercepts them): the program's
# own calls go to liblocus.so's __wrap_* (a read and a write range each, then libc's).
WRAPPED = ("memcpy", "memmove", "memset", "__memcpy_chk", "__memmove_chk", "__memset_chk")
WRAP_FLAG = "-Wl," + ",".join(f"--wrap={f}" for f in WRAPPED)
# Any of these: the invocation does not link.
NO_LINK = {"-c", "-S", "-E", "-M", "-MM", "-fsyntax-only"}
# Static links cannot load liblocus.so.
STATIC = {"-static", "-static-pie", "--static"}


def library_dir() -> Path:
    """Directory holding liblocus.so: $LOCUS_LIB (the file or its directory), else build/
    next to the package (python/locus/../../build)."""
    env = os.environ.get("LOCUS_LIB")
    if env:
        p = Path(env)
        return p.parent if p.name.endswith(".so") or p.is_file() else p
    return Path(__file__).resolve().parents[2] / "build"


def _is_self(word: str) -> bool:
    base = os.path.basename(word)
    return base == "locus" or base.startswith("locus-")


# Set in the real compiler's environment: a `locus cc` started under it (CC names a script
# that runs `locus cc`, or make exported CC="ccache locus cc") is this wrapper again.
REENTRY = "LOCUS_CC_ACTIVE"
_NESTED = False  # this process was started under a running `locus cc` (set by main)


def _without_self(words: list[str]) -> list[str]:
    """CC's words without this wrapper's (`ccache locus cc` -> `ccache`, a launcher)."""
    out: list[str] = []
    after_self = False
    for w in words:
        if after_self and w in ("cc", "c++"):
            after_self = False
            continue
        after_self = _is_self(w)
        if not after_self and w != "locus.cc":
            out.append(w)
    return out


def compiler(cxx: bool) -> list[str]:
    """The real compiler command: LOCUS_CC/CC (LOCUS_CXX/CXX), never this wrapper itself
    (its words are dropped from CC: `ccache locus cc` runs `ccache cc`). Under a `locus cc`
    that is running (REENTRY set: CC named a script around it), CC and CXX are not read."""
    default = "c++" if cxx else "cc"
    names = ("LOCUS_CXX", "CXX") if cxx else ("LOCUS_CC", "CC")
    if _NESTED:
        names = names[:1]
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            words = _without_self(shlex.split(value))
            if not words:
                continue
            if os.path.basename(words[-1]) in LAUNCHERS:
                return [*words, default]  # `ccache` alone: the launcher of the default
            return words
    return [default]


LAUNCHERS = ("ccache", "sccache", "distcc")  # run the compiler named after them


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "locus"


def remember(mark: Path, text: str) -> None:
    """mark (a file of the cache directory) holds text, written whole or not at all (builds
    run in parallel); nothing when it cannot be written."""
    try:
        mark.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=mark.parent, prefix=f".{mark.name}-")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, mark)
    except OSError:
        pass


# Variables that change what a compiler driver answers about itself.
_ASK_ENV = ("PATH", "COMPILER_PATH", "GCC_EXEC_PREFIX")


def ask(cmd: list[str], question: str) -> str | None:
    """The compiler's answer (stdout) to a question without input (`--version`,
    `-print-prog-name=as`): remembered under ~/.cache/locus per command, the programs it
    names (their size and time) and the variables the answer depends on, so that a build's
    compiles do not each run it (every `locus cc` asked three of them, ~1.5 ms each). None
    when it cannot be run."""
    stamp = [question, *cmd, *(os.environ.get(v, "") for v in _ASK_ENV)]
    for word in cmd:
        path = shutil.which(word)
        try:
            st = os.stat(path) if path else None
        except OSError:
            st = None
        stamp.append(f"{path}:{st.st_size}:{st.st_mtime_ns}" if st else "-")
    key = hashlib.sha256("\0".join(stamp).encode()).hexdigest()[:16]
    try:
        mark = cache_dir() / f"ask-{key}"
    except RuntimeError:  # no home directory
        mark = None
    try:
        if mark is not None:
            return mark.read_text()
    except OSError:
        pass
    try:
        p = subprocess.run([*cmd, question], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if p.returncode != 0:
        return None  # not remembered: it may be a passing failure
    if mark is not None:
        remember(mark, p.stdout)
    return p.stdout


def family(cmd: list[str]) -> str:
    """'clang' or 'gcc', from the name, else from `--version`."""
    base = os.path.basename(cmd[0])
    if "clang" in base:
        return "clang"
    if "gcc" in base or "g++" in base:
        return "gcc"
    out = ask(cmd, "--version")
    return "clang" if out is not None and "clang" in out.lower() else "gcc"


def links(argv: list[str]) -> bool:
    return not any(a in NO_LINK for a in argv)


# Questions to the compiler, without input: passed on as they are (with the hooks' link
# flags added, `locus cc -v` tried to link and failed on `main`).
QUERY = {"-v", "--version", "--help", "-dumpversion", "-dumpfullversion", "-dumpmachine"}


def query_only(argv: list[str]) -> bool:
    return all(a in QUERY or a.startswith("-print-") for a in argv)


def lto_flag(argv: list[str]) -> str | None:
    """The -flto option in effect: the user's own, else -flto when LOCUS_CC_LTO=1."""
    for a in reversed(argv):
        if a == "-fno-lto":
            return None
        if a == "-flto" or a.startswith("-flto="):
            return a
    return "-flto" if os.environ.get("LOCUS_CC_LTO") == "1" else None


def lto_hooks_source() -> Path:
    return Path(__file__).resolve().parents[2] / "runtime" / "cc" / "lto_hooks.c"


def inline_asm() -> bool:
    """Builds without LTO get the hit test inlined by gas.py unless LOCUS_CC_INLINE=0."""
    return os.environ.get("LOCUS_CC_INLINE", "1") != "0"


def real_assembler(cmd: list[str]) -> str | None:
    """The assembler gcc runs (`gcc -print-prog-name=as`, as a path)."""
    name = (ask(cmd, "-print-prog-name=as") or "").strip()
    return name if os.path.isabs(name) else shutil.which(name or "as")


def assembler_script(real: str) -> str:
    gas = Path(__file__).resolve().with_name("gas.py")
    return (
        f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -S {shlex.quote(str(gas))} "
        f'{shlex.quote(real)} "$@"\n'
    )


def write_assembler(directory: Path, real: str) -> None:
    """<directory>/as: gas.py in front of the real assembler (gcc -B<directory>/ runs it),
    written whole or not at all (builds run in parallel)."""
    script = directory / "as"
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".as-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(assembler_script(real))
        os.chmod(tmp, 0o755)
        os.replace(tmp, script)
    except BaseException:
        os.unlink(tmp)
        raise


def assembler_dir(real: str, fallback: Path) -> Path:
    """The directory of the assembler script: one per gas.py version, interpreter and real
    assembler under $XDG_CACHE_HOME/locus (~/.cache/locus), so that the -B option is the
    same from one build to the next (ccache hashes it; a new gas.py is a new directory, so
    objects rewritten for another layout are never served); `fallback` where that cannot
    be written."""
    gas = Path(__file__).resolve().with_name("gas.py")
    try:
        key = hashlib.sha256(gas.read_bytes() + assembler_script(real).encode()).hexdigest()
        directory = cache_dir() / f"as-{key[:16]}"
        if not (directory / "as").is_file():
            directory.mkdir(parents=True, exist_ok=True)
            write_assembler(directory, real)
        return directory
    except (OSError, RuntimeError):
        write_assembler(fallback, real)
        return fallback


PLUGIN = "locus_late_tsan.so"  # runtime/cc/late_tsan.cc, built next to liblocus.so
PLUGIN_PROBE = "int x; void f(long *p, int n) { for (int i = 0; i < n; i++) p[i] = x; }\n"


def late_tsan_plugin(cmd: list[str]) -> Path | None:
    """The gcc plugin that instruments after the vectoriser (runtime/cc/late_tsan.cc,
    <library_dir>/locus_late_tsan.so), if this gcc loads it; None when LOCUS_CC_LATE_TSAN=0,
    when it is not built (no gcc-12-plugin-dev) or when the compiler refuses it (another gcc
    version, clang): the hooks are then put before the vectoriser, as gcc does. The probe
    (one compile of a few lines) is remembered per plugin and compiler proper (cc1's path,
    size and time) under ~/.cache/locus."""
    if os.environ.get("LOCUS_CC_LATE_TSAN", "1") == "0":
        return None
    plugin = library_dir() / PLUGIN
    if " " in str(plugin):
        return None  # it goes into a specs file, which splits at spaces
    try:
        data = plugin.read_bytes()
        cc1 = (ask(cmd, "-print-prog-name=cc1") or "").strip()
        st = os.stat(cc1) if os.path.isabs(cc1) else None
    except OSError:
        return None
    if st is None:
        return None  # not gcc (clang answers `cc1`)
    key = hashlib.sha256(
        data + f"\0{cc1}\0{st.st_size}\0{st.st_mtime_ns}\0{shlex.join(cmd)}".encode()
    ).hexdigest()[:16]
    cache = cache_dir()
    mark = cache / f"late-tsan-{key}"
    try:
        return plugin if mark.read_text().strip() == "ok" else None
    except OSError:
        pass
    probe = [*cmd, f"-fplugin={plugin}", *GCC_FLAGS, "-O2", "-S", "-x", "c", "-o", "-", "-"]
    try:
        p = subprocess.run(probe, input=PLUGIN_PROBE, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None  # not remembered: a timeout on a loaded machine says nothing of the plugin
    ok = p.returncode == 0 and "__tsan_write" in p.stdout
    remember(mark, "ok\n" if ok else "refused\n")
    return plugin if ok else None


def build_command(
    argv: list[str],
    cxx: bool,
    specs: Path | None = None,
    hooks: Path | None = None,
    asdir: Path | None = None,
    plugin: Path | None = None,
) -> tuple[list[str], str | None]:
    """The compiler command for `argv`, and the specs text to write to `specs` (gcc
    compile-and-link) or None. `hooks`: the compiled lto_hooks object to link (clang LTO);
    `asdir`: the directory of gas.py's assembler script (gcc, inlined hit test); `plugin`:
    gcc's late_tsan plugin (late_tsan_plugin)."""
    cmd = compiler(cxx)
    kind = family(cmd)
    link = links(argv)
    extra: list[str] = []
    if asdir is not None:
        # gcc runs <asdir>/as; clang only with its own assembler off.
        extra += ["-fno-integrated-as"] if kind == "clang" else []
        extra.append(f"-B{asdir}/")
    specs_text = None
    if kind == "clang":
        # Without -fno-sanitize-link-runtime clang links libtsan.
        extra += CLANG_FLAGS + (["-fno-sanitize-link-runtime"] if link else [])
        lto = lto_flag(argv)
        if lto is not None and lto not in argv:
            extra.append(lto)
    elif not link:
        extra += GCC_FLAGS + ([f"-fplugin={plugin}"] if plugin is not None else [])
    else:
        # Instrument what this invocation compiles, without -fsanitize reaching the driver's
        # link step (which would link libtsan and its interceptors).
        flags = " ".join(GCC_FLAGS + ([f"-fplugin={plugin}"] if plugin is not None else []))
        specs_text = f"*cc1:\n+ {flags}\n\n*cc1plus:\n+ {flags}\n\n"
        if specs is not None:
            extra.append(f"-specs={specs}")
    tail: list[str] = []
    if link:
        lib = library_dir()
        tail = [*([str(hooks)] if hooks is not None else []), f"-L{lib}", "-llocus"]
        tail.append(f"-Wl,-rpath,{lib}")
        if hooks is None and lto_flag(argv) is None:
            # Not with LTO: its code generator makes memcpy calls after symbols are resolved.
            tail.append(WRAP_FLAG)
    return [*cmd, *extra, *argv, *tail], specs_text


def compile_lto_hooks(cmd: list[str], lto: str, out: Path, name: str) -> int:
    """Compiles runtime/cc/lto_hooks.c with the program's clang into `out` (bitcode)."""
    src = lto_hooks_source()
    if not src.exists():
        print(f"{name}: {src} not found: LTO inlining needs the locus source tree", file=sys.stderr)
        return 2
    # As C whatever the driver (clang++ would read a .c file as C++): -x c, no debug info (the
    # inlined hooks then carry the line of the access they serve), no instrumentation.
    hook_cmd = [*cmd, "-x", "c", "-std=gnu11", "-O2", "-fPIC", lto, "-c", str(src), "-o", str(out)]
    if os.environ.get("LOCUS_CC_VERBOSE") == "1":
        print(f"{name}: {shlex.join(hook_cmd)}", file=sys.stderr)
    try:
        p = subprocess.run(hook_cmd, capture_output=True, text=True)
    except OSError as e:
        print(f"{name}: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
        return 127
    if p.returncode != 0:
        print(f"{name}: compiling the LTO hooks failed:\n{p.stderr.strip()}", file=sys.stderr)
        return p.returncode if p.returncode > 0 else 1
    return 0


def main(argv: list[str], cxx: bool = False) -> int:
    global _NESTED
    saved = os.environ.get(REENTRY)
    _NESTED = bool(saved)
    os.environ[REENTRY] = "1"  # for what the compiler runs (a script around `locus cc`)
    try:
        return _main(argv, cxx)
    finally:
        _NESTED = False
        if saved is None:
            os.environ.pop(REENTRY, None)
        else:
            os.environ[REENTRY] = saved


def _main(argv: list[str], cxx: bool) -> int:
    if argv and argv[0] in ("--c++", "--cxx"):
        cxx, argv = True, argv[1:]
    name = "locus c++" if cxx else "locus cc"
    if not argv:
        print(f"usage: {name} [compiler arguments...]", file=sys.stderr)
        return 2
    if query_only(argv):
        try:
            return subprocess.call([*compiler(cxx), *argv])
        except OSError as e:
            print(f"{name}: cannot run {compiler(cxx)[0]}: {e.strerror}", file=sys.stderr)
            return 127
    static = [a for a in argv if a in STATIC]
    if links(argv) and static:
        print(
            f"{name}: {static[0]} cannot be used: the hooks every access calls are in "
            "liblocus.so, a shared library the program must load (and `locus record` "
            "preloads); link dynamically (drop -static, or build the objects with "
            f"`{name} -c` and link them in a dynamic test binary)",
            file=sys.stderr,
        )
        return 2
    if links(argv) and not (library_dir() / "liblocus.so").exists():
        print(
            f"{name}: {library_dir() / 'liblocus.so'} not found: run `make build` "
            "or set LOCUS_LIB to the library",
            file=sys.stderr,
        )
        return 2
    lto = lto_flag(argv)
    if lto is not None and family(compiler(cxx)) != "clang":
        if os.environ.get("LOCUS_CC_LTO") == "1":
            print(
                f"{name}: LOCUS_CC_LTO=1 needs clang (gcc's -fsanitize=thread hooks are "
                "builtins that cannot be inlined): set CC=clang, or unset LOCUS_CC_LTO",
                file=sys.stderr,
            )
            return 2
        lto = None  # the user's own -flto with gcc: the hooks stay calls into liblocus.so
    tmpdir = tempfile.mkdtemp(prefix="locus-cc-")
    try:
        specs = Path(tmpdir) / "exact.specs"
        hooks = None
        if lto is not None and links(argv):
            hooks = Path(tmpdir) / "locus_lto_hooks.o"
            rc = compile_lto_hooks(compiler(cxx), lto, hooks, name)
            if rc != 0:
                return rc
        asdir = None
        if lto is None and inline_asm():
            real = real_assembler(compiler(cxx))
            if real is None:
                print(
                    f"{name}: the assembler (as) was not found: install binutils", file=sys.stderr
                )
                return 127
            asdir = assembler_dir(real, Path(tmpdir))
        plugin = None
        if family(compiler(cxx)) == "gcc":
            plugin = late_tsan_plugin(compiler(cxx))
        cmd, specs_text = build_command(argv, cxx, specs, hooks, asdir, plugin)
        if specs_text is not None:
            specs.write_text(specs_text)
        if os.environ.get("LOCUS_CC_VERBOSE") == "1":
            print(f"{name}: {shlex.join(cmd)}", file=sys.stderr)
        try:
            rc = subprocess.call(cmd)
        except OSError as e:
            print(f"{name}: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
            return 127
        return rc if rc >= 0 else 128 - rc
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
