"""Addresses of a recorded process to functions, source lines and data symbols.

The runtime records raw addresses and copies of /proc/self/maps (at start and exit); all
symbolization happens here, after the run. Each address is first mapped to (module, ELF
virtual address) with the module's program headers (so .bss, which lives in an anonymous
mapping after the module, resolves too), then every module is resolved in one batch by one
`llvm-symbolizer` process (or `addr2line` when llvm-symbolizer is missing, or nothing: hex
addresses). Results are cached per (module, mtime, address) for the life of the process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import time
from dataclasses import dataclass, replace

from . import dwarf
from .rundir import read_text


@dataclass(frozen=True)
class CodeLoc:
    function: str  # "" when unknown
    file: str  # "" when unknown
    line: int  # 0 when unknown
    module: str = ""
    # The frames this location is inlined into, inside the same physical frame (outward:
    # (function, file, line) each); a call stack lists them after it.
    inlined: tuple = ()

    def short(self) -> str:
        if self.function and self.file:
            return f"{self.function} {os.path.basename(self.file)}:{self.line}"
        return self.function or ""


@dataclass
class _Module:
    path: str
    bias: int  # runtime address - ELF virtual address
    loads: list[tuple[int, int]]  # PT_LOAD [vaddr, vaddr + memsz)


_ELF_CACHE: dict[tuple[str, float], tuple | None] = {}
_SYM_CACHE: dict[tuple, object] = {}


def _by_mtime(cache: dict, path: str, compute, missing):
    """compute(path), kept in `cache` by path and modification time; `missing` when the
    file cannot be stat'ed."""
    try:
        key = (path, os.path.getmtime(path))
    except OSError:
        return missing
    if key not in cache:
        cache[key] = compute(path)
    return cache[key]


def _elf64le(eh: bytes) -> bool:
    """Whether the 64 bytes read at a file's start are an ELF64 little-endian header."""
    return len(eh) == 64 and eh[:4] == b"\x7fELF" and eh[4] == 2 and eh[5] == 1


PT_TLS = 7


def _elf(path: str):
    """(e_type, [(p_offset, p_vaddr, p_filesz, p_memsz)] of the PT_LOAD segments,
    [(sh_addr, sh_size, name)] of the allocated sections, sorted) of an ELF64 LE file, or
    None; cached by path and mtime. Stripping keeps the section headers."""
    return _by_mtime(_ELF_CACHE, path, _read_elf, None)


def _read_elf(path: str):
    res = None
    try:
        with open(path, "rb") as f:
            eh = f.read(64)
            if _elf64le(eh):
                e_type = struct.unpack_from("<H", eh, 16)[0]
                phoff = struct.unpack_from("<Q", eh, 32)[0]
                phentsize, phnum = struct.unpack_from("<HH", eh, 54)
                f.seek(phoff)
                ph = f.read(phentsize * phnum)
                loads = []
                tls = None
                for i in range(phnum):
                    p_type, _fl, off, vaddr, _pa, filesz, memsz, align = struct.unpack_from(
                        "<IIQQQQQQ", ph, i * phentsize
                    )
                    if p_type == 1:
                        loads.append((off, vaddr, filesz, memsz))
                    elif p_type == PT_TLS:
                        tls = (vaddr, memsz, align)
                res = (e_type, loads, _sections(f, eh), tls)
    except (OSError, struct.error):
        res = None
    return res


def _section_headers(f, eh: bytes) -> list[tuple[bytes, int, int, int, int, int]]:
    """(name, sh_type, sh_flags, sh_addr, sh_offset, sh_size) of each section of the open
    ELF64 file f (header eh); [] if unreadable."""
    shoff = struct.unpack_from("<Q", eh, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", eh, 0x3A)
    if not (shoff and shentsize >= 64 and 0 < shnum < 65280 and shstrndx < shnum):
        return []
    try:
        f.seek(shoff)
        sh = f.read(shentsize * shnum)
        rows = [
            struct.unpack_from("<IIQQQQ", sh, i * shentsize) for i in range(len(sh) // shentsize)
        ]
        _n, _t, _fl, _a, stroff, strsize = rows[shstrndx]
        f.seek(stroff)
        strtab = f.read(min(strsize, 1 << 20))
    except (OSError, struct.error, IndexError):
        return []
    out = []
    for name, typ, flags, addr, off, size in rows:
        end = strtab.find(b"\0", name)
        out.append((strtab[name : end if end >= 0 else None], typ, flags, addr, off, size))
    return out


def _sections(f, eh: bytes) -> list[tuple[int, int, str]]:
    """The allocated sections of the open ELF file f (header eh), sorted; [] if unreadable."""
    return sorted(
        (addr, size, name.decode("ascii", "replace"))
        for name, _typ, flags, addr, _off, size in _section_headers(f, eh)
        if flags & 2 and addr and size  # SHF_ALLOC
    )


# Where separate debug files are looked for, as gdb does (its debug-file-directory): by
# build ID (DIR/.build-id/ab/cdef....debug: Debian's -dbgsym packages, Fedora's debuginfo),
# and by .gnu_debuglink name (DIR/<the module's directory>/NAME). $LOCUS_DEBUG_DIRS (a
# colon-separated list) replaces them.
DEBUG_DIRS = ("/usr/lib/debug",)


def _debug_dirs() -> list[str]:
    env = os.environ.get("LOCUS_DEBUG_DIRS")
    return [d for d in env.split(":") if d] if env is not None else list(DEBUG_DIRS)


def _elf_notes(path: str) -> tuple[bool, str | None, str | None]:
    """(whether the ELF file has a symbol table or DWARF (.symtab, .debug_info), its GNU
    build ID in hex, its .gnu_debuglink file name); (False, None, None) if unreadable."""
    symbols, build_id, link = False, None, None
    try:
        with open(path, "rb") as f:
            eh = f.read(64)
            if not _elf64le(eh):
                return False, None, None
            for sec, typ, _flags, _addr, off, size in _section_headers(f, eh):
                if typ == 8:  # SHT_NOBITS: a debug file's copy of the module's code
                    continue
                if sec in (b".symtab", b".debug_info") and size:
                    symbols = True
                elif sec == b".note.gnu.build-id" and 16 < size < 1024:
                    f.seek(off)
                    note = f.read(size)
                    namesz, descsz, ntype = struct.unpack_from("<III", note)
                    at = 12 + (namesz + 3) // 4 * 4
                    if ntype == 3 and note[12:15] == b"GNU" and at + descsz <= len(note):
                        build_id = note[at : at + descsz].hex()
                elif sec == b".gnu_debuglink" and 4 < size < 4096:
                    f.seek(off)
                    data = f.read(size)
                    link = data[: data.find(b"\0")].decode("utf-8", "replace") or None
    except (OSError, struct.error, ValueError):
        return False, None, None
    return symbols, build_id, link


def _debuginfod_cache() -> str:
    """debuginfod's client cache (as debuginfod-find and gdb fill it)."""
    return os.environ.get("DEBUGINFOD_CACHE_PATH") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "debuginfod_client"
    )


def _in_debuginfod_cache(path: str) -> bool:
    return path.startswith(_debuginfod_cache().rstrip("/") + "/")


_DEBUG_CACHE: dict[tuple[str, float], str] = {}


def debug_file(path: str) -> str:
    """The file with the module's symbol table and DWARF: the module itself when it has
    them, else its separate debug file where gdb would find it (its build ID under each
    debug directory's .build-id, debuginfod's client cache, then its .gnu_debuglink name
    beside it, in its .debug, or under each debug directory) when that file has them and
    the same build ID; else the module. Cached by path and mtime."""
    return _by_mtime(_DEBUG_CACHE, path, _find_debug_file, path)


def _find_debug_file(path: str) -> str:
    symbols, build_id, link = _elf_notes(path)
    found = path
    if not symbols and (build_id or link):
        tries = []
        dirs = _debug_dirs()
        if build_id and len(build_id) > 2:
            tries += [
                os.path.join(d, ".build-id", build_id[:2], build_id[2:] + ".debug") for d in dirs
            ]
            tries.append(os.path.join(_debuginfod_cache(), build_id, "debuginfo"))
        if link and "/" not in link:
            here = os.path.dirname(os.path.realpath(path))
            tries += [os.path.join(here, link), os.path.join(here, ".debug", link)]
            tries += [os.path.join(d, here.lstrip("/"), link) for d in dirs]
        for t in tries:
            if os.path.realpath(t) == os.path.realpath(path) or not os.path.isfile(t):
                continue
            has, bid, _link = _elf_notes(t)
            if has and (bid == build_id or not (bid and build_id)):
                found = t
                break
    return found


def _elf_loads(path: str):
    """(e_type, [(p_offset, p_vaddr, p_filesz, p_memsz)]) of an ELF64 LE file, or None."""
    e = _elf(path)
    return None if e is None else (e[0], e[1])


def _elf_sections(path: str) -> list[tuple[int, int, str]]:
    e = _elf(path)
    return [] if e is None else e[2]


def _segment_of(loads: list, off: int) -> tuple:
    """The PT_LOAD segment a mapping at file offset `off` maps (mappings start at
    page-aligned offsets, segments need not), else the first."""
    seg = next((s for s in loads if s[0] & ~0xFFF <= off < s[0] + max(s[2], 1)), None)
    return seg if seg is not None else (loads[0] if loads else (0, 0, 0, 0))


def parse_maps(text: str, vdso: str | None = None) -> list[_Module]:
    """Modules (ELF files mapped from offset-known segments) of a maps text; the `[vdso]`
    mapping's from `vdso`, the runtime's copy of its image (vdso.so in the process's
    directory), when given.

    A file's module is where its lowest mapping places it: all its segments, .bss included
    (an anonymous mapping after the file's). A mapping of the same file at another place (a
    copy of its code: V8 maps its embedded builtins again near each isolate's heap) is a
    module of its own, limited to the addresses it maps."""
    first: dict[str, tuple[int, int]] = {}
    lines: list[tuple[str, int, int, int]] = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and vdso and parts[5].strip() == "[vdso]":
            parts[5] = vdso
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        path = parts[5].strip()
        if path.endswith(" (deleted)"):
            continue
        try:
            lo, _, hi = parts[0].partition("-")
            lo_i, hi_i = int(lo, 16), int(hi, 16)
            off = int(parts[2], 16)
        except ValueError:
            continue
        lines.append((path, lo_i, hi_i, off))
        if path not in first or lo_i < first[path][0]:
            first[path] = (lo_i, off)
    mods = []
    elves: dict[str, tuple[list, int]] = {}
    for path, (lo, off) in first.items():
        elf = _elf_loads(path)
        if not elf:
            continue
        e_type, loads = elf
        if e_type == 2:  # ET_EXEC: linked at its addresses
            bias = 0
        else:
            seg = _segment_of(loads, off)
            bias = lo - (off - seg[0] + seg[1])
        elves[path] = (loads, bias)
        mods.append(_Module(path, bias, [(s[1], s[1] + s[3]) for s in loads]))
    copies: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for path, lo, hi, off in lines:
        if path not in elves:
            continue
        loads, primary = elves[path]
        seg = _segment_of(loads, off)
        bias = lo - (off - seg[0] + seg[1])
        # Inside the module's own span (its segments, .bss): the module's, as before.
        if bias != primary and _locate(mods, lo) is None:
            ranges = copies.setdefault((path, bias), [])
            if (lo - bias, hi - bias) not in ranges:
                ranges.append((lo - bias, hi - bias))
    mods += [_Module(path, bias, ranges) for (path, bias), ranges in copies.items()]
    return mods


def _locate(mods: list[_Module], addr: int) -> tuple[_Module, int] | None:
    for m in mods:
        v = addr - m.bias
        for lo, hi in m.loads:
            if lo <= v < hi:
                return m, v
    return None


class PerfMap:
    """A JIT's symbol map in perf's format (/tmp/perf-PID.map: one `START SIZE NAME` per
    line, hex without 0x): names of code compiled at run time, outside every module. Code
    may be moved or recompiled over an address: the newest (last) entry holding it wins."""

    def __init__(self, text: str):
        starts, ends, names = [], [], []
        for ln in text.splitlines():
            parts = ln.split(maxsplit=2)
            if len(parts) < 3:
                continue
            try:
                lo, n = int(parts[0], 16), int(parts[1], 16)
            except ValueError:
                continue
            if lo < 0 or n < 0 or lo + n >= 1 << 64:  # a torn line (two writers interleaved)
                continue
            starts.append(lo)
            ends.append(lo + n)
            names.append(parts[2].strip())
        import numpy as np

        self._np = np
        self.starts = np.array(starts, dtype=np.uint64)
        self.ends = np.array(ends, dtype=np.uint64)
        self.names = names

    def lookup(self, addr: int) -> str | None:
        a = self._np.uint64(addr)
        hit = self._np.flatnonzero((self.starts <= a) & (a < self.ends))
        return self.names[int(hit[-1])] if len(hit) else None


JIT_MODULE = "[jit]"  # CodeLoc.module of code named by a perf map


def mapped_inodes(maps_text: str) -> dict[str, set[int]]:
    """path -> the inodes the maps text shows it mapped from (0, a special file, left out)."""
    out: dict[str, set[int]] = {}
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/") or not parts[4].isdigit():
            continue
        ids = out.setdefault(parts[5].strip(), set())
        if int(parts[4]):
            ids.add(int(parts[4]))
    return out


def show_path(path: str) -> str:
    """`./comm` for a file under the working directory, else the absolute path."""
    try:
        rel = os.path.relpath(path)
    except (OSError, ValueError):  # no working directory any more
        return path
    return path if rel.startswith("..") else os.path.join(".", rel)


def changed_note(path: str, inodes: set[int], since: float | None) -> str | None:
    """The note for a module file named in a run's maps that is not the file the process
    mapped any more: another inode (the linker writes a new file, which may get the old
    one's inode number back, so the time says more), or modified after `since` (Unix time:
    a file's mtime, from the kernel's coarse clock, is never later than its write). The
    device is not compared: overlayfs and btrfs show another one in maps than stat gives.
    None: the same file (or gone: its addresses are not named at all)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if (inodes and st.st_ino not in inodes) or (since is not None and st.st_mtime > since):
        return (
            f"`{show_path(path)}` changed since the run (rebuilt?): names of its code and "
            "data may be wrong; record again"
        )
    return None


class Symbolizer:
    """Resolves the addresses of one process (one maps text; code outside every module
    through the process's perf map, if it wrote one).

    `files`: path -> (inodes the run mapped it from, Unix time after which a modification
    means it changed, or None); each module file names are read from is checked once
    against it, and `changed` gets {path: note} of those that changed since the run."""

    def __init__(
        self,
        maps_text: str,
        tool: str | None = None,
        perf_map: str = "",
        files: dict[str, tuple[set[int], float | None]] | None = None,
        changed: dict[str, str] | None = None,
        vdso: str | None = None,
    ):
        self.mods = parse_maps(maps_text, vdso)
        self.files = files
        self.changed = changed
        self._checked: set[str] = set()
        self.jit = PerfMap(perf_map) if perf_map else None
        self.sizes: dict[str, int] = {}  # data symbol -> bytes (data())
        self.layouts: dict[tuple, object] = {}  # (kind, args..., module, vaddr) -> _dwarf lookups
        self.layout_s = 0.0  # seconds spent in data_layout's lookups
        if tool is None:
            tool = "llvm-symbolizer" if shutil.which("llvm-symbolizer") else None
            if tool is None and shutil.which("addr2line"):
                tool = "addr2line"
        self.tool = tool

    def _used(self, path: str) -> None:
        """Names are about to be read from module file `path`: is it still the run's?"""
        if self.files is None or self.changed is None or path in self._checked:
            return
        self._checked.add(path)
        if path in self.changed or path not in self.files:
            return
        note = changed_note(path, *self.files[path])
        if note:
            self.changed[path] = note

    def _batch(self, kind: str, addrs: list[int]) -> dict[int, object]:
        """kind 'code' -> CodeLoc, 'data' -> symbol name or None; one process per module."""
        out: dict[int, object] = {}
        per_mod: dict[str, list[tuple[int, int, _Module]]] = {}
        for a in set(addrs):
            loc = _locate(self.mods, a)
            if loc is None:
                jit = self.jit.lookup(a) if self.jit is not None and kind == "code" else None
                out[a] = (
                    CodeLoc(jit or "", "", 0, JIT_MODULE if jit else "") if kind == "code" else None
                )
                continue
            m, v = loc
            per_mod.setdefault(m.path, []).append((a, v, m))
        for path, items in per_mod.items():
            self._used(path)
            try:
                mtime = os.path.getmtime(path)
            except OSError:
                mtime = 0.0
            todo = []
            for a, v, _m in items:
                key = (path, mtime, kind, v, self.tool)
                if key in _SYM_CACHE:
                    out[a] = _SYM_CACHE[key]
                else:
                    todo.append((a, v))
            if todo:
                res = self._run(kind, path, [v for _a, v in todo])
                for (a, v), r in zip(todo, res):
                    if kind == "code" and isinstance(r, CodeLoc):
                        r = CodeLoc(r.function, r.file, r.line, os.path.basename(path), r.inlined)
                    _SYM_CACHE[(path, mtime, kind, v, self.tool)] = r
                    out[a] = r
        return out

    def _run(self, kind: str, path: str, vaddrs: list[int]) -> list:
        empty = [CodeLoc("", "", 0, os.path.basename(path)) if kind == "code" else None] * len(
            vaddrs
        )
        if self.tool is None:
            return empty
        # A stripped module's separate debug file, if installed: data symbols are read from
        # it. For code llvm-symbolizer finds it itself (its build ID and debug link, in the
        # directories given), and names a function by its DWARF name (`__pthread_mutex_lock`,
        # where the debug file's symbol table says `pthread_mutex_lock@@GLIBC_2.2.5`); given
        # only where it cannot look (debuginfod's cache), or to addr2line.
        debug = debug_file(path)
        if kind == "data" or self.tool == "addr2line" or _in_debuginfod_cache(debug):
            path = debug
        try:
            if self.tool == "addr2line":
                return self._run_addr2line(kind, path, vaddrs, empty)
            if kind == "code":
                return self._run_code_json(path, vaddrs, empty)
            cmd = [self.tool, f"--obj={path}", "--no-inlines", "--demangle"]
            inp = "".join(f"DATA {v:#x}\n" for v in vaddrs)
            p = subprocess.run(
                cmd,
                input=inp,
                capture_output=True,
                text=True,
                errors="surrogateescape",
                timeout=120,
            )
        except (OSError, subprocess.SubprocessError):
            return empty
        blocks = p.stdout.split("\n\n")
        res = []
        for i in range(len(vaddrs)):
            lines = blocks[i].strip("\n").split("\n") if i < len(blocks) else []
            name = lines[0] if lines and lines[0] != "??" else ""
            if kind == "data":
                size = None
                if name and len(lines) > 1:
                    start, _, sz = lines[1].partition(" ")
                    off = vaddrs[i] - int(start) if start.isdigit() else 0
                    size = int(sz) if sz.strip().isdigit() and int(sz) > 0 else None
                    name = f"{name}+{off}" if off > 0 else name
                res.append((name, size) if name else None)
                continue
            file, line = "", 0
            if len(lines) > 1:
                f, _, rest = lines[1].partition(":")
                if f != "??":
                    file = f
                    try:
                        line = int(rest.split(":")[0])
                    except ValueError:
                        line = 0
            res.append(CodeLoc(name, file, line))
        return res

    def _run_code_json(self, path: str, vaddrs: list[int], empty: list) -> list:
        """Code addresses with their inline chains (llvm-symbolizer JSON): see user_frame."""
        cmd = [self.tool or "", f"--obj={path}", "--demangle", "--output-style=JSON"]
        if "LOCUS_DEBUG_DIRS" in os.environ:
            cmd += [f"--debug-file-directory={d}" for d in _debug_dirs()]
        inp = "".join(f"CODE {v:#x}\n" for v in vaddrs)
        p = subprocess.run(
            cmd, input=inp, capture_output=True, text=True, errors="surrogateescape", timeout=120
        )
        res = []
        lines = p.stdout.splitlines()
        for i in range(len(vaddrs)):
            try:
                frames = json.loads(lines[i])["Symbol"] if i < len(lines) else []
            except (ValueError, KeyError, TypeError):
                frames = []
            res.append(user_frame(frames) if frames else empty[i])
        return res

    def _run_addr2line(self, kind: str, path: str, vaddrs: list[int], empty: list) -> list:
        if kind == "data":
            return _nm_data(path, vaddrs)
        cmd = ["addr2line", "-f", "-C", "-e", path]
        inp = "".join(f"{v:#x}\n" for v in vaddrs)
        p = subprocess.run(
            cmd, input=inp, capture_output=True, text=True, errors="surrogateescape", timeout=120
        )
        lines = p.stdout.split("\n")
        res = []
        for i in range(len(vaddrs)):
            fn = lines[2 * i] if 2 * i < len(lines) else "??"
            fl = lines[2 * i + 1] if 2 * i + 1 < len(lines) else "??:0"
            f, _, ln = fl.partition(":")
            try:
                line = int(ln.split()[0]) if ln else 0
            except ValueError:
                line = 0
            res.append(CodeLoc("" if fn == "??" else clean_name(fn), "" if f == "??" else f, line))
        return res

    def code(self, addrs: list[int], return_addresses: bool = True) -> dict[int, CodeLoc]:
        """Function, file and line of code addresses. Return addresses are looked up at
        address-1 (the call instruction), keyed by the original address."""
        adj = {a: (a - 1 if return_addresses and a else a) for a in addrs}
        res = self._batch("code", list(adj.values()))
        return {a: res[b] for a, b in adj.items()}  # type: ignore[misc]

    def module_offset(self, addr: int) -> str | None:
        """`module+0xOFFSET` (ELF virtual address) of a code address, or None."""
        loc = _locate(self.mods, addr)
        if loc is None:
            return None
        m, v = loc
        self._used(m.path)
        return f"{os.path.basename(m.path)}+{v:#x}"

    def section(self, addr: int) -> tuple[str, str, int] | None:
        """(module name, section name, ELF virtual address) of an address inside a loaded
        module (.data, .bss: static data a stripped module has no symbol for), or None."""
        loc = _locate(self.mods, addr)
        if loc is None:
            return None
        m, v = loc
        self._used(m.path)
        for lo, size, name in _elf_sections(m.path):
            if lo <= v < lo + size:
                return os.path.basename(m.path), name, v
        return os.path.basename(m.path), "", v

    def data(self, addrs: list[int]) -> dict[int, str | None]:
        """Name of the data symbol holding each address (None: heap, stack, stripped),
        `name+OFFSET` inside it; its size in bytes is then data_size(name)."""
        out: dict[int, str | None] = {}
        for a, r in self._batch("data", list(addrs)).items():
            name, size = r if isinstance(r, tuple) else (r, None)
            if name:  # (the language's name of the symbol, before its offset)
                base, at = split_offset(name)
                name = f"{clean_name(base)}+{at}" if at else clean_name(name)
            out[a] = name
            if name and size:
                self.sizes[split_offset(name)[0]] = size
        return out

    def tls(self, site: int, offs: list[int]) -> tuple[str, dict[int, str | None]]:
        """(the module's file name, {offset: `name` or `name+OFFSET` of the TLS symbol
        holding it, or None}) of offsets into the static TLS block of the module whose TLS
        segment is at `site` (a LOCUS_AL_TLS record's); ("", {}) outside every module. A
        symbol's size is then data_size(name)."""
        loc = _locate(self.mods, site)
        if loc is None:
            return "", {}
        m, _v = loc
        self._used(m.path)
        syms = _by_mtime(_TLS_CACHE, debug_file(m.path), _tls_symbols, [])
        out: dict[int, str | None] = {}
        for o in offs:
            hit = _symbol_at(syms, o)
            out[o] = hit[0] if hit else None
            if hit and hit[1]:
                self.sizes[split_offset(hit[0])[0]] = hit[1]
        return os.path.basename(m.path), out

    def module_path(self, addr: int) -> str | None:
        """The path of the module that maps `addr`, or None."""
        loc = _locate(self.mods, addr)
        return loc[0].path if loc is not None else None

    def dynamic_tls(self, size: int, static: set[str]) -> tuple[int, int] | None:
        """(an address in the module, its TLS segment's alignment) of the one loaded module,
        apart from those with a static TLS block (`static`, their paths), whose TLS a
        thread's heap block of `size` bytes from the loader is: glibc allocates a dlopen'ed
        module's at a thread's first use, `malloc(p_memsz)` with the TLS at its start for an
        alignment of at most 16, else `malloc(p_memsz + p_align)` with the TLS at the first
        multiple of p_align in it. None when no module or several are."""
        found: dict[str, tuple[int, int]] = {}
        for m in self.mods:
            if m.path in static or m.path in found or not m.loads:
                continue
            e = _elf(m.path)
            tls = e[3] if e is not None and len(e) > 3 else None
            if tls is None:
                continue
            align = max(int(tls[2]), 1)
            if size == (tls[1] if align <= 16 else tls[1] + align):
                found[m.path] = (m.bias + m.loads[0][0], align)
        return next(iter(found.values())) if len(found) == 1 else None

    def tls_layout(self, name: str, site: int, off: int):
        """The fields (dwarf.Layout) of the thread-local variable `name` (its symbol) at
        offset `off` of the TLS block of the module whose TLS segment is at `site`, named as
        tls_shown names it; or None."""
        lay = self._dwarf(
            site, ("tls", name, off), lambda p, _v, _m: dwarf.variable_layout(p, name, off, True)
        )
        shown = tls_shown(name)
        return replace(lay, name=shown) if lay is not None and shown != name else lay

    def data_size(self, name: str) -> int | None:
        """Size in bytes of a data symbol data() named (None when the tool gave none)."""
        return self.sizes.get(name)

    def _dwarf(self, addr: int, key: tuple, lookup, empty=None):
        """lookup(the path of the module's DWARF (debug_file), ELF address of addr, the module's
        path) once per module, address and key, within
        the process's budget of DWARF lookups; `empty` when addr is in no module or past the
        budget (a module with gigabytes of DWARF and no index is read whole by each lookup:
        past LAYOUT_BUDGET_S of lookups, fields go unnamed)."""
        loc = _locate(self.mods, addr)
        if loc is None:
            return empty
        m, v = loc
        self._used(m.path)
        k = (*key, m.path, v)
        if k not in self.layouts:
            if self.layout_s > LAYOUT_BUDGET_S:
                return empty
            t0 = time.monotonic()
            self.layouts[k] = lookup(debug_file(m.path), v, m.path)
            self.layout_s += time.monotonic() - t0
        return self.layouts[k]

    def data_layout(self, name: str, addr: int):
        """The fields of the static variable `name` (as data() named it) that starts at
        `addr`, from its module's DWARF (dwarf.Layout), or None."""
        return self._dwarf(addr, ("data", name), lambda p, v, _m: dwarf.variable_layout(p, name, v))

    def frame_locals(self, site: int, sp: int, bp: int) -> list:
        """The locals in memory (dwarf.Local) of the frame that called out at return address
        `site` with stack pointer sp and frame pointer bp, from its module's DWARF."""
        return self._dwarf(
            site, ("frame", sp, bp), lambda p, v, m: dwarf.frame_locals(p, v, sp, bp, m), []
        )

    def part_layout(self, addr: int, pointer: str, member: str):
        """The fields of clang's part `pointer.body.N` at `addr` that is `pointer->member`
        (dwarf.part_layout), or None."""
        return self._dwarf(
            addr, ("part", pointer, member), lambda p, _v, _m: dwarf.part_layout(p, pointer, member)
        )

    def source_text(self, ip: int, line: int) -> str:
        """The text of source line `line` of the instruction at `ip`, from its module's line
        table and the source file, or ""."""
        return self._dwarf(ip, ("source", line), lambda p, v, _m: dwarf.source_text(p, v, line), "")

    def heap_layout(self, site: int, line: int, size: int):
        """The layout of a heap block of `size` bytes allocated by the call returning to
        `site` (source line `line`), from the pointer that line declares (dwarf.heap_layout),
        or None."""
        return self._dwarf(
            site, ("heap", line, size), lambda p, v, _m: dwarf.heap_layout(p, v, line, size)
        )


LAYOUT_BUDGET_S = 10.0  # seconds of DWARF lookups per process (data, heap and frame layouts)

# Source files of libraries, inlined into a program's functions: system headers (the C++
# standard library's templates), the Rust standard library, crates from the registry.
LIBRARY_SOURCES = ("/usr/include/", "/usr/lib/", "/usr/local/include/", "/rustc/")
LIBRARY_PARTS = ("/.cargo/registry/", "/.rustup/toolchains/")


def for_proc(proc) -> Symbolizer:
    """The symbolizer of a recorded process (rundir.Proc): its maps and its perf map. The
    files it names code and data from are checked against the run (proc.changed_files):
    one mapped at the process's start must not have been modified after that start, one
    mapped later (a dlopen) not after the process's end (a program may write a library
    and then load it), and each must still be the inode the maps show."""
    maps = proc.maps_text()
    if hasattr(proc, "mmapped_text"):
        maps += "\n" + proc.mmapped_text()
    vdso = proc.file("vdso.so") if hasattr(proc, "file") else None
    vdso = vdso if vdso and os.path.isfile(vdso) else None
    changed = getattr(proc, "changed_files", None)
    if changed is None:
        return Symbolizer(maps, perf_map=proc.perf_map_text(), vdso=vdso)
    run_start = getattr(proc, "start_unix", None)
    t0 = t1 = None
    if run_start is not None:
        t0 = run_start + max(proc.start_s, 0.0)
        t1 = run_start + proc.end_s if proc.end_s is not None else None
    at_start = mapped_inodes(read_text(proc.file("maps")))
    files = {
        path: (ids, t0 if path in at_start else t1) for path, ids in mapped_inodes(maps).items()
    }
    return Symbolizer(maps, perf_map=proc.perf_map_text(), files=files, changed=changed, vdso=vdso)


def is_library_source(file: str) -> bool:
    return file.startswith(LIBRARY_SOURCES) or any(p in file for p in LIBRARY_PARTS)


_RUST_ESCAPES = {
    "$SP$": "@", "$BP$": "*", "$RF$": "&", "$LT$": "<", "$GT$": ">", "$LP$": "(",
    "$RP$": ")", "$C$": ",", "$u7e$": "~", "$u20$": " ", "$u27$": "'", "$u5b$": "[",
    "$u5d$": "]", "$u7b$": "{", "$u7d$": "}", "$u3b$": ";", "$u2b$": "+", "$u22$": '"',
}  # fmt: skip
_RUST_HASH = re.compile(r"::h[0-9a-f]{16}$")


def rust_clean(name: str) -> str:
    """A Rust legacy-mangled name as the Itanium demangler leaves it
    (`fs::main::_$u7b$$u7b$closure$u7d$$u7d$::h8c7c6d5eacda6835`) made readable, as
    rustfilt does: `fs::main::{{closure}}`. Other names are returned unchanged."""
    if not _RUST_HASH.search(name):
        return name
    name = _RUST_HASH.sub("", name)
    if "$" in name:
        name = re.sub(r"(^|::)_\$", r"\1$", name)  # a segment starting with an escape
        name = re.sub(
            r"\$[A-Za-z0-9]+\$", lambda m: _RUST_ESCAPES.get(m.group(0), m.group(0)), name
        )
        name = name.replace("..", "::")
    return name


# Fortran module procedures and variables: gfortran `__counters_MOD_hits`, Intel
# ifort/ifx `counters_mp_hits_`; both are `counters::hits` (as gdb shows them). A suffix
# (`._omp_fn.0`, an outlined OpenMP region) is kept.
_FORTRAN_GNU = re.compile(r"__([A-Za-z][A-Za-z0-9_]*?)_MOD_([A-Za-z_][A-Za-z0-9_]*)(\..*)?")
_FORTRAN_INTEL = re.compile(r"([a-z][a-z0-9_]*?)_mp_([a-z][a-z0-9_]*)_(\..*)?")


def fortran_clean(name: str) -> str:
    """A Fortran module entity's symbol as its source names it: `module::entity`. Other
    names (and an offset suffix `+N`) are returned unchanged."""
    base, off = split_offset(name)
    m = _FORTRAN_GNU.fullmatch(base) or _FORTRAN_INTEL.fullmatch(base)
    if not m:
        return name
    clean = f"{m.group(1)}::{m.group(2)}{m.group(3) or ''}"
    return f"{clean}+{off}" if off or base != name else clean


def clean_name(name: str) -> str:
    """A symbol as its language names it: Rust's legacy mangling, Fortran modules."""
    return fortran_clean(rust_clean(name))


# The type of a lambda inside an outer frame's name: the std::thread / std::invoke frames
# a lambda is inlined into carry it as a template argument, `main()::<lambda()>`.
_LAMBDA = re.compile(r"::<lambda\([^()]*\)>")


def _template_arg_before(name: str, end: int) -> str:
    """The template argument of `name` that ends at `end`: back to the unmatched `<` or the
    `,` that opens it (brackets and parentheses balanced on the way)."""
    depth, k = 0, end - 1
    while k >= 0:
        ch = name[k]
        if ch in ">)":
            depth += 1
        elif ch in "<(":
            if depth == 0:
                break
            depth -= 1
        elif ch == "," and depth == 0:
            break
        k -= 1
    return name[k + 1 : end].strip()


def lambda_name(function: str, outer: list[str]) -> str:
    """An inlined lambda's call operator, which gcc's DWARF names only `operator()` (no
    linkage name), named by its type where an outer frame's name carries it:
    `main()::<lambda()>` (the innermost lambda of a nested one). Other names are returned
    as they are."""
    if function != "operator()":
        return function
    for name in outer:
        last = None
        for m in _LAMBDA.finditer(name):
            last = m
        if last is not None:
            return _template_arg_before(name, last.end()) or function
    return function


def user_frame(frames: list[dict]) -> CodeLoc:
    """The code location of an instruction, from its inline chain (innermost first): the
    innermost frame in the program's own source, so that an atomic add inlined from
    <atomic> or Rust's atomic.rs, or a vector's allocation inlined from new_allocator.h,
    is named by the line of the program that made it (its function, file and line).
    When every frame is library code: the outermost function with the innermost line."""

    def field(f: dict, k: str) -> str:
        v = f.get(k) or ""
        v = "" if v == "??" else str(v)
        return clean_name(v) if k == "FunctionName" else v

    for i, f in enumerate(frames):
        file = field(f, "FileName")
        if file and not is_library_source(file):
            outer = tuple(
                (field(g, "FunctionName"), field(g, "FileName"), int(g.get("Line") or 0))
                for g in frames[i + 1 :]
            )
            name = lambda_name(field(f, "FunctionName"), [o[0] for o in outer])
            return CodeLoc(name, file, int(f.get("Line") or 0), inlined=outer)
    inner, outer = frames[0], frames[-1]
    return CodeLoc(
        field(outer, "FunctionName"), field(inner, "FileName"), int(inner.get("Line") or 0)
    )


def split_offset(name: str) -> tuple[str, int]:
    """`sym+12` -> ("sym", 12), a data name data() gave with an offset into the symbol;
    `sym` -> ("sym", 0)."""
    base, plus, off = name.rpartition("+")
    return (base, int(off)) if plus and base and off.isdigit() else (name, 0)


_TLS_CACHE: dict[tuple[str, float], list] = {}
# The variable of Rust's `thread_local!` macro (`static TALLY: ...`) is a static of the
# macro's closure: `r::TALLY::{{constant}}::{{closure}}::__RUST_STD_INTERNAL_VAL` (legacy
# mangling), `...::TALLY::{K#0}::{closure#0}::__RUST_STD_INTERNAL_VAL` (v0).
_RUST_TLS = re.compile(r"(::\{\{constant\}\}::\{\{closure\}\}|::\{K#\d+\}::\{closure#\d+\})"
                       r"::__RUST_STD_INTERNAL_VAL$")  # fmt: skip


def tls_shown(name: str) -> str:
    """A thread-local variable's symbol as its source names it (Rust's `thread_local!`
    statics by their own path, `r::TALLY`); others unchanged."""
    return _RUST_TLS.sub("", name)


def _tls_symbols(path: str) -> list[tuple[int, int, str]]:
    """[(offset in the module's TLS block, size, name as its language writes it)] of its
    STT_TLS symbols (`readelf -s`: the symbol table and the dynamic one), sorted."""
    try:
        p = subprocess.run(
            ["readelf", "-sW", "-C", path],
            capture_output=True,
            text=True,
            errors="surrogateescape",
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    syms = set()
    for line in p.stdout.splitlines():
        parts = line.split(None, 7)
        # Num: Value Size Type Bind Vis Ndx Name
        if len(parts) == 8 and parts[3] == "TLS" and parts[6] != "UND":
            try:
                size = int(parts[2], 0) if parts[2].startswith("0x") else int(parts[2])
                syms.add((int(parts[1], 16), size, clean_name(parts[7].split("@", 1)[0])))
            except ValueError:
                continue
    return sorted(syms)


def _nm_data(path: str, vaddrs: list[int]) -> list[tuple[str, int | None] | None]:
    """Data symbols without llvm-symbolizer: `nm -S` (symbol table, sizes) per module."""
    try:
        p = subprocess.run(
            ["nm", "-S", "-C", "--defined-only", path],
            capture_output=True,
            text=True,
            errors="surrogateescape",
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return [None] * len(vaddrs)
    syms = []
    for line in p.stdout.splitlines():
        parts = line.split(None, 3)
        if len(parts) == 4 and parts[2] in "bBdDgGrRsSvV":
            try:
                syms.append((int(parts[0], 16), int(parts[1], 16), parts[3]))
            except ValueError:
                continue
    syms.sort()
    return [_symbol_at(syms, v) for v in vaddrs]


def _symbol_at(syms: list[tuple[int, int, str]], v: int) -> tuple[str, int | None] | None:
    """(`name` or `name+OFFSET`, its size or None) of the symbol among sorted (value, size,
    name) holding v (a symbol of no size holds its first byte), else None."""
    for lo, size, n in syms:
        if lo <= v < lo + max(size, 1):
            return (n if v == lo else f"{n}+{v - lo}", size or None)
    return None
