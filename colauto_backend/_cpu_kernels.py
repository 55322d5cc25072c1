"""Inductor's C++ kernels of one CPU graph compiled a few to a C++ unit, not one each (private Inductor API:
torch._inductor.async_compile.AsyncCompile.cpp_pybinding, codecache.CppPythonBindingsCodeCache; this module
is its one adapter).

Inductor builds each CPU kernel of a graph as its own shared library: one g++ run a kernel, about 0.5 s
each on a 2-core CPU, of which half is loading the 130 MB precompiled header of Inductor's C++ prefix and a
fifth is linking; the kernel itself compiles in about 0.15 s. A tiny HF Llama's training step has 45 such
kernels, 22 s of a 27 s test. Inside `batched()` (around each `compile_fx_inner` colauto runs), each CPU kernel
Inductor asks for is held until the generated module waits for its kernels (`AsyncCompile.wait`, only
with more than one compile thread: otherwise Inductor compiles each at once and nothing changes here);
then they are compiled in as many units as there are compile threads, in parallel. Each kernel keeps its
own source in a namespace of its own (`colauto_k<i>::kernel`), and is bound to Python by Inductor's own
binding code (`CppPythonBindingsCodeCache.suffix_template`), one method per kernel; the units go through
Inductor's C++ cache (on disk, keyed by their source). A kernel whose source does not have the shape this
relies on (one `extern "C" void kernel(`, no macros) is compiled alone by Inductor, and a unit that fails
to build falls back to one build a kernel (warned once); both are counted (SEPARATE, UNIT_FAILED).
"""
from __future__ import annotations

import contextlib
import re
import threading
import warnings

from . import counters

BATCHED = counters.counter("Inductor CPU kernels compiled several to a C++ unit")
SEPARATE = counters.counter("Inductor CPU kernels compiled one to a C++ unit, as Inductor does")
UNIT_FAILED = counters.counter("C++ units of Inductor CPU kernels that did not build (their kernels built alone)")

_ENTRY = re.compile(r'extern\s+"C"\s+void\s+kernel\(')
_OWN_MARK = "static PyObject* kernel_py("        # where the per-kernel part of Inductor's binding code starts
_TABLE_MARK = "static PyMethodDef py_methods[]"
_MODULE_MARK = "static struct PyModuleDef py_module"


def _split(source: str) -> tuple[list[str], str] | None:
    """(the #include lines, the rest with `kernel` no longer extern "C") or None if `source` is not one
    kernel of the shape a shared unit can hold."""
    if len(_ENTRY.findall(source)) != 1 or source.count('extern "C"') != 1:
        return None
    lines = source.splitlines()
    if any(line.lstrip().startswith(("#define", "#undef", "#pragma once", "#if")) for line in lines):
        return None
    includes = [line.strip() for line in lines if line.lstrip().startswith("#include")]
    body = "\n".join(line for line in lines if not line.lstrip().startswith("#include"))
    return includes, _ENTRY.sub("void kernel(", body, count=1)


def _binding(cache, i: int, argtypes: list[str]) -> str:
    """Inductor's binding code for kernel `i`, calling `colauto_k<i>::kernel`."""
    parse = ", ".join(f"parse_arg<{t.replace('const ', '')}>(args, {n})" for n, t in enumerate(argtypes))
    text = cache.suffix_template.format(arg_len=len(argtypes), entry_func=f"kernel{i}", extra_parse_arg="",
                                        call_entry_func=f"colauto_k{i}::kernel({parse}); Py_RETURN_NONE;")
    return text[text.index(f"static PyObject* kernel{i}_py("):text.index(_TABLE_MARK)]


def unit_source(cache, kernels: list[tuple[list[str], str]]) -> str:
    """One C++ unit holding `kernels` (argtypes, source): their includes, each in its namespace, Inductor's
    binding code once, a Python method `kernel<i>` each, and the module init (module `kernel`)."""
    template = cache.suffix_template.format(arg_len=0, entry_func="kernel", extra_parse_arg="",
                                            call_entry_func="Py_RETURN_NONE;")
    includes, bodies = [], []
    for i, (_, source) in enumerate(kernels):
        inc, body = _split(source)
        includes += [line for line in inc if line not in includes]
        bodies.append(f"namespace colauto_k{i} {{\n{body}\n}}  // namespace colauto_k{i}\n")
    table = ",\n".join(f'    {{"kernel{i}", kernel{i}_py, METH_VARARGS, ""}}' for i in range(len(kernels)))
    return "\n".join([*includes, *bodies, template[:template.index(_OWN_MARK)],
                      *(_binding(cache, i, argtypes) for i, (argtypes, _) in enumerate(kernels)),
                      f"{_TABLE_MARK} = {{\n{table},\n    {{NULL, NULL, 0, NULL}}}};\n",
                      template[template.index(_MODULE_MARK):]])


class _Pending:
    """The kernels asked for and not yet built; built all at once when the first is waited for."""

    def __init__(self, original, threads: int):
        self.original, self.threads = original, threads
        self.kernels: list[tuple[object, list[str], str]] = []   # (AsyncCompile, argtypes, source)
        self.built: dict[int, object] = {}
        self.lock = threading.Lock()

    def add(self, compiler, argtypes: list[str], source: str):
        from torch._inductor.async_compile import LambdaFuture
        with self.lock:
            i = len(self.kernels)
            self.kernels.append((compiler, list(argtypes), source))
        return LambdaFuture(lambda: self.result(i))

    def result(self, i: int):
        with self.lock:
            if i not in self.built:
                self._build([j for j in range(len(self.kernels)) if j not in self.built])
            return self.built[i]

    def _build(self, todo: list[int]) -> None:
        from concurrent.futures import ThreadPoolExecutor
        from torch._inductor.codecache import CppPythonBindingsCodeCache as cache
        alone = [j for j in todo if _split(self.kernels[j][2]) is None]
        shared = [j for j in todo if j not in alone]
        n_units = max(1, min(self.threads, len(shared) // 2))
        units = [shared[k::n_units] for k in range(n_units)] if len(shared) > 1 else []
        alone += shared if not units else []

        def build(unit: list[int]) -> None:
            try:
                module = cache.load_async(unit_source(cache, [self.kernels[j][1:] for j in unit]), "cpu")()
            except Exception as exc:   # a unit that does not build: each of its kernels as Inductor builds it
                if not UNIT_FAILED:
                    warnings.warn(f"colauto: {len(unit)} Inductor CPU kernels did not build as one C++ unit "
                                  f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}); "
                                  "they are built one a unit, as Inductor does (counted; warned once)")
                UNIT_FAILED[type(exc).__name__] += 1
                self._alone(unit)
                return
            for k, j in enumerate(unit):
                self.built[j] = getattr(module, f"kernel{k}")
            BATCHED["kernels"] += len(unit)
        with ThreadPoolExecutor(max(1, len(units))) as pool:
            list(pool.map(build, units))
        self._alone(alone)

    def _alone(self, todo: list[int]) -> None:
        for j in todo:
            compiler, argtypes, source = self.kernels[j]
            got = self.original(compiler, argtypes, source)
            self.built[j] = got.result() if hasattr(got, "result") else got
            SEPARATE["kernels"] += 1


@contextlib.contextmanager
def batched():
    """Inductor's CPU kernels asked for in this block are built a few to a C++ unit (module docstring)."""
    from torch._inductor.async_compile import AsyncCompile, get_compile_threads
    threads = get_compile_threads()
    if threads <= 1:           # Inductor builds each kernel where it is defined; nothing waits for them
        yield
        return
    original = AsyncCompile.cpp_pybinding
    pending = _Pending(original, threads)

    def cpp_pybinding(self, argtypes, source_code):
        return pending.add(self, argtypes, source_code)
    AsyncCompile.cpp_pybinding = cpp_pybinding
    try:
        yield
    finally:
        AsyncCompile.cpp_pybinding = original
