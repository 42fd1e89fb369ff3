"""A real wheel, installed into a clean virtual environment, gives exactly the promised names."""
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

from tests.contracts.helpers import c_compiler

ROOT = Path(__file__).resolve().parents[2]


def has_native_extension(wheel: Path) -> bool:
    return any(n.startswith("tmem_bench/tensor_memory/_scan.") and n.endswith((".so", ".pyd"))
               for n in zipfile.ZipFile(wheel).namelist())


def test_wheel_installs_only_tmem_bench(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = tmp_path.glob("tmem_bench-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"tmem_bench"}
    for module in ("tmem_bench/tasks/coordinate_binding.py", "tmem_bench/baselines/transformer.py",
                   "tmem_bench/profiles/quick.toml", "tmem_bench/cli/__init__.py",
                   "tmem_bench/leaderboard/page.html"):
        assert module in names
    has_native = has_native_extension(wheel)
    assert has_native or c_compiler() is None, "a C compiler is here but the wheel lacks the native extension"

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    site = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    before = {p.name for p in site.iterdir()}
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    added = {p.name for p in site.iterdir()} - before
    assert {n for n in added if not n.endswith(".dist-info")} == {"tmem_bench"}

    # The dependencies come from this interpreter's site-packages through PYTHONPATH, which
    # (unlike a site directory) does not run the editable install's .pth finder.
    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    code = ("import tmem_bench, tmem_bench.tasks, tmem_bench.baselines, sys;"
            "print(tmem_bench.tasks.__file__)")
    out = subprocess.run([py, "-c", code], check=True, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.stdout.strip().startswith(str(site))
    cli = subprocess.run([env_dir / "bin" / "tmem-bench", "list"], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert "coordinate_binding" in cli.stdout
    page = subprocess.run([py, "-c", "from tmem_bench.leaderboard.page import render_page; print(render_page('[]'))"],
                          check=True, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert page.stdout.startswith("<!DOCTYPE html>")
    native = subprocess.run([py, "-c", "from tmem_bench.tensor_memory import native; print(native.native_library() is not None)"],
                            check=True, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert native.stdout.strip() == str(has_native)


def test_install_without_a_compiler_falls_back_to_pytorch(tmp_path):
    """The extension is optional: with no working C compiler the wheel still builds
    (pure Python) and the Tensor Memory scan runs through PyTorch."""
    # A copy without build outputs, so that nothing compiled earlier is reused.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "*.so", "*.pyd", "__pycache__", "runs", "docs"))
    env = {**os.environ, "CC": "false", "LDSHARED": "false"}
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path)],
        check=True, capture_output=True, timeout=300, env=env,
    )
    (wheel,) = tmp_path.glob("tmem_bench-*.whl")
    assert not has_native_extension(wheel)
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target),
                    str(wheel)], check=True, capture_output=True, timeout=300)
    code = ("import torch; from tmem_bench.tensor_memory import kernels, native; from tmem_bench.registry import get_backbone;"
            "assert native.native_library() is None;"
            "m = get_backbone('tensor', 16, 1, 2, channels=4, grid=3); y = m(torch.randn(2, 5, 16)); y.sum().backward();"
            "print(kernels.resolve_kernel('auto', y), kernels.__file__)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), sysconfig.get_paths()["purelib"]]),
           "TMEM_BENCH_NO_COMPILE": "1"}
    # -S: no site directory, so the editable install's import hook cannot shadow the wheel.
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    kernel, path = out.stdout.split()
    assert kernel == "auto" and path.startswith(str(target))


def test_editable_install_maps_tasks_and_baselines_into_the_package():
    import tmem_bench.baselines
    import tmem_bench.tasks

    assert Path(tmem_bench.tasks.__file__).parent == ROOT / "tasks"
    assert Path(tmem_bench.baselines.__file__).parent == ROOT / "baselines"
