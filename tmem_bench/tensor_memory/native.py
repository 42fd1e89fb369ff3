"""The C scan (`_scan.c`) through ctypes: which build to open, its checked interface,
and calls by argument name.

The build is the package's `_scan` extension, or the shared library named by the
environment variable TMEM_BENCH_NATIVE_LIB (a path): another build of the same
source, e.g. one compiled for another instruction set, which the benchmark times
side by side and the tests hold to the naive twin. Each path is opened once per
process; `use_library` switches the build in use without touching the environment.

Every build says which vector variant it was compiled as (`tm_variant`: avx512,
avx2, sse or generic, chosen in `_scan.c` by the instruction set the compiler targets),
so results can record it and `kernels` can decide `auto` from it.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import warnings

import torch

LIBRARY_ENV = "TMEM_BENCH_NATIVE_LIB"

# The C functions' arguments in `_scan.c`'s order, each by its name there; calls pass
# them by name (`native_call`), so this list is the one place that knows the order.
_INT, _FLOATS = ctypes.c_int, ctypes.POINTER(ctypes.c_float)
_SIZES = [(name, _INT) for name in ("B", "N", "D", "H", "W", "C", "factorised", "nthreads")]
WEIGHTS = ["cz", "uy", "ux", "bvol", "wz", "wy", "wx"]
NATIVE_SIGNATURES = {
    "tm_forward": _SIZES + [(name, _FLOATS) for name in (
        *WEIGHTS, "h0", "c0", "taps", "biases", "mix_w", "mix_b",
        "reads", "hN", "cN", "hs", "cs", "gs")],
    "tm_backward": _SIZES + [(name, _FLOATS) for name in (
        *WEIGHTS, "taps", "biases", "mix_w", "hs", "cs", "gs", "d_reads", "d_hN", "d_cN",
        "d_cz", "d_uy", "d_ux", "d_wz", "d_wy", "d_wx", "d_h0", "d_c0", "gparts", "gsum")],
}
# Must equal TM_INTERFACE_VERSION in _scan.c; bump both with every change to a signature
# or to the exported functions.
INTERFACE_VERSION = 3

_loaded: dict[str | None, tuple[object, str, str]] = {}  # path (None: the extension) -> (library, why not, variant)
_chosen: list[str | None] = []  # the path `use_library` chose, overriding the environment


def _open_native(path: str | None = None):
    if path is None:
        # Only the file is wanted: ctypes opens it, nothing calls it as a Python module.
        spec = importlib.util.find_spec(f"{__package__}._scan")
        if spec is None:
            raise ImportError(f"no module named {__package__}._scan")
        path = spec.origin
    return ctypes.CDLL(path)


def _load_native(path: str | None) -> tuple[object, str, str]:
    """The library with its functions' signatures declared, or None and why not; and its variant."""
    try:
        lib = _open_native(path)
    except (ImportError, OSError) as e:
        if path is not None:
            return None, f"could not be opened from {LIBRARY_ENV}={path}: {e}", ""
        return None, "is not built here (reinstall with a C compiler that supports OpenMP)", ""
    try:
        version_of = lib.tm_interface_version
    except AttributeError:  # a build from before interface versions
        found = None
    else:
        version_of.argtypes, version_of.restype = [], ctypes.c_int
        found = version_of()
    if found != INTERFACE_VERSION:
        why = (f"is a stale build: interface version {found}, the scan expects {INTERFACE_VERSION} "
               "(rebuild it: pip install -e .)")
        warnings.warn(f"the native Tensor Memory kernel {why}; using the PyTorch scan")
        return None, why, ""
    lib.tm_variant.argtypes, lib.tm_variant.restype = [], ctypes.c_char_p
    for name, signature in NATIVE_SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = [ctype for _, ctype in signature], ctypes.c_int
    return lib, "", lib.tm_variant().decode()


def library_path() -> str | None:
    """The build in use: the path `use_library` chose, else TMEM_BENCH_NATIVE_LIB, else None (the extension)."""
    if _chosen:
        return _chosen[0]
    return os.environ.get(LIBRARY_ENV) or None


def use_library(path: str | None) -> None:
    """Use the build at `path` (None: the package's extension) from now on, in this process."""
    _chosen[:] = [path]


def _entry() -> tuple[object, str, str]:
    path = library_path()
    if path not in _loaded:
        _loaded[path] = _load_native(path)
    return _loaded[path]


def native_status() -> tuple[object, str]:
    """(library, "") or (None, why it cannot run)."""
    if os.environ.get("TMEM_BENCH_NO_NATIVE", "") not in ("", "0"):
        return None, "is switched off (TMEM_BENCH_NO_NATIVE)"
    lib, why, _ = _entry()
    return lib, why


def native_library():
    """The ctypes handle of the build in use, or None where it is unavailable."""
    return native_status()[0]


def native_variant() -> str | None:
    """The vector variant of the build in use (avx512, avx2, sse, generic), or None where it cannot run."""
    return _entry()[2] if native_library() is not None else None


def native_call(name: str, **args) -> int:
    """Call `name` of the build in use with every argument of NATIVE_SIGNATURES[name], by
    name; tensors (float32, contiguous) go as pointers, None as NULL."""
    signature = NATIVE_SIGNATURES[name]
    missing = [arg for arg, _ in signature if arg not in args]
    unknown = sorted(set(args) - {arg for arg, _ in signature})
    if missing or unknown:
        raise TypeError(f"{name}: missing arguments {missing}, unknown arguments {unknown}")
    values = []
    for arg, ctype in signature:
        value = args[arg]
        if ctype is _FLOATS and value is not None:
            if value.dtype != torch.float32 or not value.is_contiguous():
                raise ValueError(f"{name}: {arg} must be contiguous float32, got {value.dtype} {tuple(value.stride())}")
            value = ctypes.cast(value.data_ptr(), _FLOATS)
        values.append(value)
    return getattr(native_library(), name)(*values)
